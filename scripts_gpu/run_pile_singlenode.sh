#!/usr/bin/env bash
# Train GPT-126M on The Pile on one node (pure data parallelism over NUM_GPUS devices).
set -euo pipefail

usage() {
  cat <<EOF
Usage: $(basename "$0") TFDS_DATA_DIR VOCAB_PATH PRECISION NUM_GPUS PERCORE_BATCH_SIZE LOGDIR [main.py flags...]

  TFDS_DATA_DIR       directory holding The Pile (and Lambada, for the interleaved eval)
  VOCAB_PATH          SentencePiece .model file
  PRECISION           float32 or bfloat16 (sets --fdl.FPROP_DTYPE)
  NUM_GPUS            devices on this node; ICI_MESH_SHAPE defaults to [NUM_GPUS,1,1]
  PERCORE_BATCH_SIZE  sequences per device before sharding (may be fractional with TP)
  LOGDIR              checkpoints, TensorBoard events and the resolved config go here
  extra flags         passed to main.py as is, e.g. --fdl.MAX_STEPS=100

Environment:
  EXPERIMENT=GPT126M  experiment to run (GPT5B, Synthetic126M, Tiny, my_pkg.exps.MyGPT, ...)
  ICI_MESH_SHAPE      overrides [NUM_GPUS,1,1]; empty leaves the experiment's own mesh
  PYTHON              interpreter (default: the clone's .venv, else python3)
  XLA_FLAGS           appended to the recommended flags (BASE_XLA_FLAGS replaces those)
  JAX_PLATFORMS=cpu   run on CPU with NUM_GPUS fake devices

Example: $(basename "$0") ~/datasets ~/c4_en_301_5Mexp2_spm.model bfloat16 8 4 runs/pile126m
EOF
}

if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then usage; exit 0; fi
if (($# < 6)); then usage >&2; exit 2; fi

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

TFDS_DATA_DIR=$1 VOCAB_PATH=$2 PREC=$3 NUM_GPUS=$4 PERCORE_BATCH_SIZE=$5 LOG_DIR=$6
shift 6
require_positive_int NUM_GPUS "$NUM_GPUS"
require_number PERCORE_BATCH_SIZE "$PERCORE_BATCH_SIZE"
require_dir TFDS_DATA_DIR "$TFDS_DATA_DIR"
require_file VOCAB_PATH "$VOCAB_PATH"

EXPERIMENT=${EXPERIMENT:-GPT126M}
ICI_MESH_SHAPE=${ICI_MESH_SHAPE-[${NUM_GPUS},1,1]}
export VOCAB_PATH
fake_cpu_devices "$NUM_GPUS"

args=(
  --fdl_config="$(fdl_config "$EXPERIMENT")"
  --job_log_dir="$LOG_DIR"
  --data_dir="$TFDS_DATA_DIR"
  --vocab_path="$VOCAB_PATH"
  --fdl.FPROP_DTYPE=\""$PREC"\"
  --fdl.PERCORE_BATCH_SIZE="$PERCORE_BATCH_SIZE"
)
if [[ -n "$ICI_MESH_SHAPE" ]]; then args+=(--fdl.ICI_MESH_SHAPE="$ICI_MESH_SHAPE"); fi

mkdir -p "$LOG_DIR"
echo "+ $PYTHON -u $MAIN_PY ${args[*]} $*" >&2
# exec: signals (Ctrl-C, SLURM's SIGTERM) reach the trainer directly.
exec "$PYTHON" -u "$MAIN_PY" "${args[@]}" "$@"
