#!/usr/bin/env bash
# Run HERE (a machine with PyPI): downloads into .whl/ the Python 3.12 wheels that a GPU
# machine with jax, flax, optax, orbax, tensorboard and sentencepiece but no package
# registry lacks. Then carry .whl to the GPU machine and run bench/gpu_check.sh there.
#
#   bash bench/gpu_wheels.sh        # about 25 MB
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
# The same versions as requirements*.txt; graphviz and libcst are fiddle's own needs;
# pytest (as in the tests' environment, with its pure-Python needs but packaging, which
# tensorboard brings) and pytest-timeout, for gpu_check.sh's tests and their per-test limit;
# tokamax (the [moe] extra, the moe part's Qwen3A3B_tokamax row) and what it imports.
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl \
    praxis==1.4.0 lingvo==0.14.2 fiddle==0.3.1 clu==0.0.12 optax-shampoo==0.0.6 \
    jax-bitempered-loss==0.0.2 zstandard==0.25.0 ml_collections==1.1.0 typeguard==2.13.3 \
    graphviz libcst pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0 \
    pytest-timeout==2.4.0 tokamax==0.0.12 qwix==0.1.8 einshape==1.0 immutabledict==4.3.1 \
    tensorboardX==2.6.5 jaxtyping==0.3.11 wadler-lindig==0.1.8 pydantic==2.14.4 \
    pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
ls .whl
