#!/usr/bin/env bash
# Run THERE (the GPU machine, from the repository root, with .whl/ carried from
# bench/gpu_wheels.sh): installs the carried wheels beside the machine's own jax, checks
# that Paxloom imports, runs the attention tests on the GPU, then the benchmark. Extra
# arguments go to bench/gpu_bench.py; the JSON lands in $OUT (or runs/) with the log.
#
#   bash bench/gpu_run.sh --steps 20
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-runs}"
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/paxloom-site .whl/*.whl
export PYTHONPATH="/tmp/paxloom-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# shellcheck source=scripts_gpu/common.sh
source scripts_gpu/common.sh  # the XLA flag block the launch scripts use
python3 -c "import jax, layers, praxis.layers; print('jax', jax.__version__, jax.devices())"
JAX_PLATFORMS=cuda python3 -m pytest -q -p no:cacheprovider tests/test_attention.py 2>&1 \
    | tee "$out/gpu_tests.log" || echo "attention tests failed (see $out/gpu_tests.log); benchmarking anyway"
python3 bench/gpu_bench.py --json "$out/gpu_bench.json" "$@" 2>&1 | tee "$out/gpu_bench.log"
