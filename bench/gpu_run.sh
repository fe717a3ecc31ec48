#!/usr/bin/env bash
# The long GPU measurement, with no time box; bench/gpu_check.sh is the 9-minute check to
# run first on a lent machine (docs/guides/gpu_check.md). Run THERE (the GPU machine, from
# the repository root, with .whl/ carried from bench/gpu_wheels.sh): installs the carried
# wheels beside the machine's own jax, checks that Paxloom imports, runs the GPU-relevant
# tests (every attention implementation against praxis, short trainings of both families
# with each), trains and decodes a small Llama through main.py with the default settings,
# times the attention kernels, runs the benchmark, then compares FP8 with bfloat16 (raw
# GEMMs, then Synthetic5B cut to 8 layers and GPT1_3B at batch 4, 100 steps of each
# precision: an estimated 9-13 minutes on one H100).
# Extra arguments go to the first bench/gpu_bench.py run; logs and JSON land in $OUT (or
# runs/). GPU_RUN_PARTS picks parts (default "tests train kernels bench fp8"), so that each
# fits a 10-minute command; FP8_CONFIGS picks the FP8 comparison's experiments.
#
#   bash bench/gpu_run.sh --steps 20 --torch
#   GPU_RUN_PARTS=fp8 FP8_CONFIGS=Synthetic5B bash bench/gpu_run.sh
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
parts=" ${GPU_RUN_PARTS:-tests train kernels bench fp8} "
want() { [[ $parts == *" $1 "* ]]; }
failed=0
if want tests; then
    JAX_PLATFORMS=cuda python3 -m pytest -q -p no:cacheprovider tests/test_attention.py \
        tests/test_fused_training.py 2>&1 | tee "$out/gpu_tests.log" || failed=1
fi
if want train; then  # end to end with nothing chosen: train, then decode from the checkpoint
    run="$(mktemp -d)/llama"
    { python3 main.py --fdl_config=experiments.LlamaTiny --fdl.ICI_MESH_SHAPE=[1,1,1] \
          --fdl.MAX_STEPS=100 --job_log_dir="$run" \
      && python3 main.py --fdl_config=experiments.LlamaTiny --fdl.ICI_MESH_SHAPE=[1,1,1] \
          --mode=decode --job_log_dir="$run" --max_decode_steps=16 --prompt="The list"; } \
        2>&1 | tee "$out/gpu_train_decode.log" || failed=1
fi
if want kernels; then
    python3 bench/attention_kernels.py 2>&1 | tee "$out/attention_kernels.log"
    python3 bench/attention_kernels.py --heads 32 --kv_heads 4 --batch 4 2>&1 \
        | tee -a "$out/attention_kernels.log"
fi
if want bench; then
    python3 bench/gpu_bench.py --json "$out/gpu_bench.json" "$@" 2>&1 | tee "$out/gpu_bench.log"
fi
if want fp8; then  # issue 23: FP8 against bfloat16, with the loss after 100 steps of each
    fp8_configs="${FP8_CONFIGS:-Synthetic5B,GPT1_3B}"
    python3 bench/fp8_gemm.py --configs "$fp8_configs" --percore_batch_size 4 2>&1 \
        | tee "$out/fp8_gemm.log"
    # The same with XLA's default Triton GEMMs (common.sh turns them off): who takes FP8 dots.
    XLA_FLAGS="$XLA_FLAGS --xla_gpu_enable_triton_gemm=true" python3 bench/fp8_gemm.py \
        --configs "$fp8_configs" --percore_batch_size 4 2>&1 | tee -a "$out/fp8_gemm.log"
    python3 bench/gpu_bench.py --configs "$fp8_configs" --impls auto --fp8 --loss_steps 100 \
        --percore_batch_size 4 --json "$out/gpu_bench_fp8.json" 2>&1 | tee "$out/gpu_bench_fp8.log"
fi
[[ $failed == 0 ]] || { echo "GPU tests failed: see $out/gpu_tests.log and $out/gpu_train_decode.log"; exit 1; }
