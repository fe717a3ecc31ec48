#!/usr/bin/env bash
# Run HERE (a machine with PyPI): downloads into .whl/ the Python 3.12 wheels that a GPU
# machine with jax, flax, optax, orbax, tensorboard, sentencepiece, transformers and torch
# but no package registry lacks, each at the lock's version (constraints.txt). Then carry
# .whl to the GPU machine and run bench/gpu_check.sh there, which compares what it finds
# with the lock (bench/gpu_check_figures.py reads the names of CARRIED below and their versions from
# the lock).
#
#   bash bench/gpu_wheels.sh        # about 60 MB, 32 of them xprof's
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
CARRIED=(
    # requirements*.txt's packages that the GPU machine lacks
    praxis lingvo fiddle clu optax-shampoo jax-bitempered-loss zstandard ml_collections
    typeguard
    graphviz libcst  # fiddle's own needs
    # pytest with its pure-Python needs but packaging (tensorboard brings it), and
    # pytest-timeout: gpu_check.sh's tests part and its per-test limit
    pytest pluggy iniconfig pygments pytest-timeout
    # tokamax (the [moe] extra: the moe part's Qwen3A3B_tokamax row) and what it imports
    # that the GPU machine may lack (tqdm comes with transformers)
    tokamax qwix einshape immutabledict tensorboardX jaxtyping wadler-lindig pydantic
    pydantic_core annotated-types typing-inspection
    # `import tokamax` (ragged_dot included) needs xprof: its benchmarking module imports
    # xprof.cli.tools, which loads xprof's 80 MB C library, fire and termcolor (and six, the
    # machine's); xprof's other requirements (duckdb, google-cloud-storage, ...) stay unimported
    xprof fire termcolor
)
# name==version of each, as the lock spells it; a name the lock lacks stops here.
lock_pins=$(python3 bench/gpu_check_figures.py pins) || { echo "$lock_pins"; exit 1; }
read -ra pins <<<"$lock_pins"
# pip takes each manylinux tag as it is (xprof's wheel is manylinux_2_27), not the older ones.
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "${pins[@]}"
ls .whl
