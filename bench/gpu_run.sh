#!/usr/bin/env bash
# Run THERE (the GPU machine, from the repository root, with .whl/ carried from
# bench/gpu_wheels.sh): installs the carried wheels beside the machine's own jax, checks
# that Paxloom imports, runs the GPU-relevant tests (every attention implementation against
# praxis, short trainings of both families with each), trains and decodes a small Llama
# through main.py with the default settings, times the attention kernels, then runs the
# benchmark. Extra arguments go to bench/gpu_bench.py; logs and JSON land in $OUT (or runs/).
#
#   bash bench/gpu_run.sh --steps 20 --torch
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-runs}"
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/paxloom-site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/paxloom-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# shellcheck source=scripts_gpu/common.sh
source scripts_gpu/common.sh  # the XLA flag block the launch scripts use
python3 -c "import jax, layers, praxis.layers; print('jax', jax.__version__, jax.devices())" \
    || exit 1
failed=0
JAX_PLATFORMS=cuda python3 -m pytest -q -p no:cacheprovider tests/test_attention.py \
    tests/test_fused_training.py 2>&1 | tee "$out/gpu_tests.log" || failed=1
# End to end with nothing chosen: train, then decode from the checkpoint.
run="$(mktemp -d)/llama"
{ python3 main.py --fdl_config=experiments.LlamaTiny --fdl.ICI_MESH_SHAPE=[1,1,1] \
      --fdl.MAX_STEPS=100 --job_log_dir="$run" \
  && python3 main.py --fdl_config=experiments.LlamaTiny --fdl.ICI_MESH_SHAPE=[1,1,1] \
      --mode=decode --job_log_dir="$run" --max_decode_steps=16 --prompt="The list"; } \
    2>&1 | tee "$out/gpu_train_decode.log" || failed=1
python3 bench/attention_kernels.py 2>&1 | tee "$out/attention_kernels.log"
python3 bench/attention_kernels.py --heads 32 --kv_heads 4 --batch 4 2>&1 \
    | tee -a "$out/attention_kernels.log"
python3 bench/gpu_bench.py --json "$out/gpu_bench.json" "$@" 2>&1 | tee "$out/gpu_bench.log"
[[ $failed == 0 ]] || { echo "GPU tests failed: see $out/gpu_tests.log and $out/gpu_train_decode.log"; exit 1; }
