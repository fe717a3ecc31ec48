#!/usr/bin/env bash
# Zero-shot Lambada evaluation of the GPT-126M checkpoint in LOGDIR, on one node.
set -euo pipefail

usage() {
  cat <<EOF
Usage: $(basename "$0") TFDS_DATA_DIR VOCAB_PATH PRECISION NUM_GPUS PERCORE_BATCH_SIZE LOGDIR [main.py flags...]

  TFDS_DATA_DIR       directory holding Lambada
  VOCAB_PATH          SentencePiece .model file used in pretraining
  PRECISION           float32 or bfloat16 (sets --fdl.FPROP_DTYPE)
  NUM_GPUS            devices on this node; ICI_MESH_SHAPE defaults to [NUM_GPUS,1,1]
  PERCORE_BATCH_SIZE  eval sequences per device
  LOGDIR              the LOGDIR of the pretraining run: its latest checkpoint is evaluated
  extra flags         passed to main.py as is

Environment: EXPERIMENT (default Lambada126M), ICI_MESH_SHAPE, PYTHON, XLA_FLAGS,
JAX_PLATFORMS=cpu, as for run_pile_singlenode.sh.

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
# Evaluation reads a checkpoint, so unlike training a missing LOGDIR is a mistake.
require_dir LOGDIR "$LOG_DIR"

EXPERIMENT=${EXPERIMENT:-Lambada126M}
ICI_MESH_SHAPE=${ICI_MESH_SHAPE-[${NUM_GPUS},1,1]}
export VOCAB_PATH
fake_cpu_devices "$NUM_GPUS"

args=(
  --fdl_config="$(fdl_config "$EXPERIMENT")"
  --mode=eval
  --job_log_dir="$LOG_DIR"
  --data_dir="$TFDS_DATA_DIR"
  --vocab_path="$VOCAB_PATH"
  --fdl.FPROP_DTYPE=\""$PREC"\"
  --fdl.PERCORE_BATCH_SIZE="$PERCORE_BATCH_SIZE"
)
if [[ -n "$ICI_MESH_SHAPE" ]]; then args+=(--fdl.ICI_MESH_SHAPE="$ICI_MESH_SHAPE"); fi

echo "+ $PYTHON -u $MAIN_PY ${args[*]} $*" >&2
exec "$PYTHON" -u "$MAIN_PY" "${args[@]}" "$@"
