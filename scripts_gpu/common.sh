# shellcheck shell=bash
# Shared by the scripts_gpu launchers (sourced, never run): XLA flags, Python, small helpers.

# --- XLA flags: the one place they are set ------------------------------------------------
# Recommended by the Pax GPU README, minus the flags current XLA no longer knows:
#   --xla_gpu_enable_async_all_gather / --xla_gpu_enable_async_reduce_scatter (and
#   _async_all_reduce) were deleted in openxla/xla#11422 (April 2024); async collectives
#   have been on by default since. jax 0.10's XLA aborts on them ("Unknown flag in
#   XLA_FLAGS"), as maxtext#645 and paxml#80 found; opt out per op with
#   --xla_gpu_disable_async_collectives=allgather,reducescatter instead.
# --xla_gpu_* flags are parsed (and ignored) on CPU too, so they are set on every platform:
# a flag that a future XLA drops then fails the CPU tests instead of the first GPU run.
# Override the whole block with BASE_XLA_FLAGS (empty disables it); anything already in
# XLA_FLAGS is kept and comes last, so it wins.
BASE_XLA_FLAGS=${BASE_XLA_FLAGS-"--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_triton_gemm=false"}
export XLA_FLAGS="${BASE_XLA_FLAGS} ${XLA_FLAGS:-}"
# Pax's default; JAX alone preallocates 75% of GPU memory.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.85}
# -------------------------------------------------------------------------------------------

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MAIN_PY="${REPO_DIR}/main.py"

# $PYTHON if set, else the clone's virtual environment, else python3 on PATH.
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "${REPO_DIR}/.venv/bin/python" ]]; then
    PYTHON="${REPO_DIR}/.venv/bin/python"
  else
    PYTHON=python3
  fi
fi

die() {
  echo "$(basename "$0"): error: $*" >&2
  exit 2
}

# EXPERIMENT=GPT5B -> experiments.GPT5B; a dotted name (my_pkg.exps.MyGPT) is used as is.
fdl_config() {
  case "$1" in
    *.*) echo "$1" ;;
    *) echo "experiments.$1" ;;
  esac
}

require_positive_int() {  # NAME VALUE
  [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"
}

require_number() {  # NAME VALUE; PERCORE_BATCH_SIZE may be fractional (0.5 with TP=2)
  [[ "$2" =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] || die "$1 must be a number, got '$2'"
}

# Local paths are checked here for a one-line error; URLs (gs://...) are left to main.py.
require_dir() {  # NAME PATH
  [[ "$2" == *://* || -d "$2" ]] || die "$1 '$2' is not a directory"
}

require_file() {  # NAME PATH
  [[ "$2" == *://* || -f "$2" ]] || die "$1 '$2' is not a file"
}

# On CPU (laptops, CI) fake NUM devices so the mesh [NUM,1,1] fits; GPUs are real devices.
fake_cpu_devices() {  # NUM
  if [[ "${JAX_PLATFORMS:-}" == cpu && "${XLA_FLAGS}" != *xla_force_host_platform_device_count* ]]; then
    export XLA_FLAGS="${XLA_FLAGS} --xla_force_host_platform_device_count=$1"
  fi
}

# --- The launchers' shared steps ----------------------------------------------------------
# Every run_*.sh takes the same six positional arguments and builds main.py's command the
# same way; each keeps only what differs (its usage text, defaults, SLURM checks, flags).

# --help, or too few arguments, prints the calling script's usage(). Then the six arguments,
# checked, become TFDS_DATA_DIR VOCAB_PATH PREC NUM_GPUS PERCORE_BATCH_SIZE LOG_DIR; the
# caller shifts them off, so that "$@" is left with the user's extra main.py flags. An empty
# PRECISION or PERCORE_BATCH_SIZE keeps the experiment's own FPROP_DTYPE or batch size.
read_launcher_args() {  # NUM_GPUS_NAME "$@"; NUM_GPUS_NAME: the fourth argument in messages
  local num_gpus_name=$1
  shift
  if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then usage; exit 0; fi
  if (($# < 6)); then usage >&2; exit 2; fi
  TFDS_DATA_DIR=$1 VOCAB_PATH=$2 PREC=$3 NUM_GPUS=$4 PERCORE_BATCH_SIZE=$5 LOG_DIR=$6
  require_positive_int "$num_gpus_name" "$NUM_GPUS"
  if [[ -n "$PERCORE_BATCH_SIZE" ]]; then require_number PERCORE_BATCH_SIZE "$PERCORE_BATCH_SIZE"; fi
  require_dir TFDS_DATA_DIR "$TFDS_DATA_DIR"
  require_file VOCAB_PATH "$VOCAB_PATH"
  ICI_MESH_SHAPE=${ICI_MESH_SHAPE-[${NUM_GPUS},1,1]}
  export VOCAB_PATH
  # How a user keeps the experiment's own precision and batch size (main.py's note names it):
  # the submit file's variable where one passed the arguments on (example_slurm_pile.sub
  # exports PAXLOOM_ARG_NAMES, the names of the six), else the argument itself.
  local names
  read -r -a names <<< "${PAXLOOM_ARG_NAMES:-}"
  if ((${#names[@]} == 6)); then
    KEEP_PREC="set ${names[2]}= to keep it" KEEP_BATCH="set ${names[4]}= to keep it"
  else
    KEEP_PREC="give PRECISION as '' to keep it" KEEP_BATCH="give PERCORE_BATCH_SIZE as '' to keep it"
  fi
}

# What the launcher sets: each hyperparameter the script chooses a value for goes through
# launcher_flag, which adds --fdl.NAME=VALUE to args (an empty VALUE adds nothing: the
# experiment's own stays) and lists it, with how to keep the experiment's own value, in
# PAXLOOM_LAUNCHER_FLAGS (one "--fdl.NAME=VALUE<TAB>HOW" a line, exported to main.py).
# main.py's start names each one that replaces a value the experiment class declares
# (paxloom/launch/launcher.py); the user's own --fdl. flags are not listed.
PAXLOOM_LAUNCHER_FLAGS=""  # this launcher's own, never a caller's
launcher_flag() {  # NAME VALUE HOW
  [[ -n "$2" ]] || return 0
  args+=("--fdl.$1=$2")
  PAXLOOM_LAUNCHER_FLAGS+="--fdl.$1=$2"$'\t'"$3"$'\n'
}

# Sets the array args to main.py's flags for the six arguments; $@ goes right after
# --fdl_config (Lambada's --mode=eval). The caller appends its own, then add_mesh_flag.
# shellcheck disable=SC2120  # the flags are optional; they are not the script's arguments
main_args() {
  args=(
    --fdl_config="$(fdl_config "$EXPERIMENT")"
    "$@"
    --job_log_dir="$LOG_DIR"
    --data_dir="$TFDS_DATA_DIR"
    --vocab_path="$VOCAB_PATH"
  )
  launcher_flag FPROP_DTYPE "${PREC:+\"$PREC\"}" "$KEEP_PREC"
  launcher_flag PERCORE_BATCH_SIZE "$PERCORE_BATCH_SIZE" "$KEEP_BATCH"
}

# An empty ICI_MESH_SHAPE or DCN_MESH_SHAPE keeps the experiment's own mesh.
add_mesh_flag() {  # ICI_MESH_SHAPE|DCN_MESH_SHAPE
  launcher_flag "$1" "${!1}" "set $1= to keep it"
}

# Prints the command (after PREFIX) and runs main.py with args, then the user's flags ($@).
# exec: signals (Ctrl-C, SLURM's SIGTERM) reach the trainer directly.
exec_main() {  # PREFIX "$@"
  local prefix=$1
  shift
  echo "+ ${prefix}$PYTHON -u $MAIN_PY ${args[*]} $*" >&2
  export PAXLOOM_LAUNCHER_FLAGS
  exec "$PYTHON" -u "$MAIN_PY" "${args[@]}" "$@"
}
