#!/usr/bin/env bash
# Train GPT-126M on The Pile across nodes: run once per node inside a SLURM step
# (srun --ntasks-per-node=1, as example_slurm_pile.sub does).
set -euo pipefail

usage() {
  cat <<EOF
Usage: $(basename "$0") TFDS_DATA_DIR VOCAB_PATH PRECISION NUM_GPUS_PER_NODE PERCORE_BATCH_SIZE LOGDIR [main.py flags...]

One process per node drives all NUM_GPUS_PER_NODE GPUs of its node. jax.distributed
finds the coordinator, process count and rank from SLURM's environment; explicit
--server_addr/--num_hosts/--host_idx flags among the extra flags override that.

Environment:
  EXPERIMENT=GPT126M  experiment to run (GPT5B, GPT175B, my_pkg.exps.MyGPT, ...)
  ICI_MESH_SHAPE      default [NUM_GPUS_PER_NODE,1,1]; DCN_MESH_SHAPE default [NUM_NODES,1,1].
                      Set either to an empty string to keep the experiment's own mesh
                      (GPT5B and GPT175B carry tuned ones); '' as PRECISION or
                      PERCORE_BATCH_SIZE keeps the experiment's too. The run's start names
                      each value set here that replaces the experiment's own.
  NUM_NODES           default \$SLURM_JOB_NUM_NODES
  PYTHON, XLA_FLAGS   as for run_pile_singlenode.sh

Example (inside an allocation):
  srun --ntasks-per-node=1 $(basename "$0") /data /data/spm.model bfloat16 8 4 runs/pile126m
EOF
}

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# The fourth argument, NUM_GPUS_PER_NODE, becomes NUM_GPUS.
read_launcher_args NUM_GPUS_PER_NODE "$@"
shift 6

NUM_NODES=${NUM_NODES:-${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-}}}
[[ -n "$NUM_NODES" ]] || die "not inside a SLURM job (no SLURM_JOB_NUM_NODES): submit example_slurm_pile.sub, or set NUM_NODES and pass --server_addr/--num_hosts/--host_idx"
require_positive_int NUM_NODES "$NUM_NODES"
# Several tasks per node would each claim every GPU of the node.
if [[ -n "${SLURM_NTASKS:-}" && "$SLURM_NTASKS" != "$NUM_NODES" ]]; then
  die "expected one task per node, got SLURM_NTASKS=$SLURM_NTASKS on $NUM_NODES nodes: launch with srun --ntasks-per-node=1"
fi

EXPERIMENT=${EXPERIMENT:-GPT126M}
DCN_MESH_SHAPE=${DCN_MESH_SHAPE-[${NUM_NODES},1,1]}
# jax.distributed.initialize() under SLURM restricts each process to GPU $SLURM_LOCALID
# (one process per GPU); with one process per node it must see all of the node's GPUs.
JAX_LOCAL_DEVICE_IDS=${JAX_LOCAL_DEVICE_IDS:-$(seq -s, 0 $((NUM_GPUS - 1)))}
export JAX_LOCAL_DEVICE_IDS

main_args
args+=(--multiprocess_gpu)
add_mesh_flag ICI_MESH_SHAPE
add_mesh_flag DCN_MESH_SHAPE

mkdir -p "$LOG_DIR"
exec_main "[node ${SLURM_NODEID:-?}] " "$@"
