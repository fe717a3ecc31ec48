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

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

read_launcher_args NUM_GPUS "$@"
shift 6
# Evaluation reads a checkpoint, so unlike training a missing LOGDIR is a mistake.
require_dir LOGDIR "$LOG_DIR"

EXPERIMENT=${EXPERIMENT:-Lambada126M}
fake_cpu_devices "$NUM_GPUS"

main_args --mode=eval
add_mesh_flag ICI_MESH_SHAPE

exec_main "" "$@"
