#!/usr/bin/env bash
# Train GPT-126M on The Pile on one node (pure data parallelism over NUM_GPUS devices).
set -euo pipefail

usage() {
  cat <<EOF
Usage: $(basename "$0") TFDS_DATA_DIR VOCAB_PATH PRECISION NUM_GPUS PERCORE_BATCH_SIZE LOGDIR [main.py flags...]

  TFDS_DATA_DIR       directory holding The Pile (and Lambada, for the interleaved eval),
                      or your own jsonl/parquet files (an experiment with DATASET="text")
  VOCAB_PATH          SentencePiece .model file
  PRECISION           float32 or bfloat16 (sets --fdl.FPROP_DTYPE); '' keeps the experiment's
  NUM_GPUS            devices on this node; ICI_MESH_SHAPE defaults to [NUM_GPUS,1,1]
  PERCORE_BATCH_SIZE  sequences per device before sharding (may be fractional with TP);
                      '' keeps the experiment's
  LOGDIR              checkpoints, TensorBoard events and the resolved config go here
  extra flags         passed to main.py as is, e.g. --fdl.MAX_STEPS=100

Environment:
  EXPERIMENT=GPT126M  experiment to run (GPT5B, Synthetic126M, Tiny, my_pkg.exps.MyGPT, ...)
  ICI_MESH_SHAPE      overrides [NUM_GPUS,1,1]; empty leaves the experiment's own mesh
                      (the run's start names each value set here that replaces the
                      experiment's own)
  PYTHON              interpreter (default: the clone's .venv, else python3)
  XLA_FLAGS           appended to the recommended flags (BASE_XLA_FLAGS replaces those)
  JAX_PLATFORMS=cpu   run on CPU with NUM_GPUS fake devices

Example: $(basename "$0") ~/datasets ~/c4_en_301_5Mexp2_spm.model bfloat16 8 4 runs/pile126m
EOF
}

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

read_launcher_args NUM_GPUS "$@"
shift 6

EXPERIMENT=${EXPERIMENT:-GPT126M}
fake_cpu_devices "$NUM_GPUS"

main_args
add_mesh_flag ICI_MESH_SHAPE

mkdir -p "$LOG_DIR"
exec_main "" "$@"
