"""Start `jax.distributed` when the job runs as several processes (one per node on GPUs).

When it starts:
- `--multiprocess_gpu` (the Pax flag): always. Whatever the flags below leave unset is
  found by jax's own cluster detection (SLURM `srun`, Open MPI `mpirun`, Kubernetes,
  Cloud TPU).
- `--server_addr`, `--num_hosts` or `--host_idx` given: always; they override what
  detection would find. Outside a detected cluster all three are needed.
- No flag, but the process was started by `srun` or `mpirun` as one of several tasks:
  N copies of the same command would otherwise train N unrelated models into the same
  job_log_dir, which is never what was meant, so it starts here too. Other launchers
  (Kubernetes, plain ssh) need the flags: their environment is not proof of intent.

Devices per process: `local_device_ids` is left to jax, so `JAX_LOCAL_DEVICE_IDS`
(for example "0,1,2,3,4,5,6,7") is honoured. Without it, jax gives each process under
SLURM or Open MPI the one GPU numbered by its local rank (one process per GPU); the
one-process-per-node launch scripts in scripts_gpu/ export JAX_LOCAL_DEVICE_IDS.

A peer that never arrives must not hang the job. jax (0.10) does not raise on a
connection timeout; its coordination client aborts the process with a C++ fatal log
some time after `initialization_timeout`. A watchdog thread therefore ends the process
itself at the deadline with one line naming the coordinator, and exit status 2.
"""

import dataclasses
import os
import re
import sys
import threading

import jax

from paxloom.core.errors import UserError
from paxloom.runner.cluster import roll_call

# Cluster environments in which a launcher has started this same command several times.
_SLURM_STEP_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
                    "SLURM_LOCALID")  # what jax's SlurmCluster needs: set inside `srun`


@dataclasses.dataclass(frozen=True)
class DistributedOptions:
    """The command-line view of a multi-process job (Pax's flag names)."""

    multiprocess_gpu: bool = False
    server_addr: str | None = None  # HOST:PORT of process 0's coordinator service
    num_hosts: int | None = None  # number of processes
    host_idx: int | None = None  # this process's index, 0 .. num_hosts - 1
    timeout_s: int = 300  # how long to wait for every process to reach the coordinator

    @property
    def explicit(self) -> bool:
        return self.server_addr is not None or self.num_hosts is not None or (
            self.host_idx is not None)


def launcher_tasks(environ=os.environ) -> int:
    """How many copies of this command srun or mpirun started (1 if neither did)."""
    if all(var in environ for var in _SLURM_STEP_VARS):
        return _int_or_one(environ["SLURM_NTASKS"])
    if "OMPI_MCA_orte_hnp_uri" in environ:  # only set by Open MPI's mpirun / mpiexec
        return _int_or_one(environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    return 1


def should_initialize(options: DistributedOptions, environ=os.environ) -> bool:
    return options.multiprocess_gpu or options.explicit or launcher_tasks(environ) > 1


def initialize(options: DistributedOptions, environ=os.environ) -> bool:
    """Start jax.distributed if this job is multi-process; True if it did.

    Must run before anything touches a jax device. Raises UserError for bad flags or
    a failed start; a coordinator that not every process reaches within
    `options.timeout_s` ends the process (status 2) with a one-line message.
    """
    if not should_initialize(options, environ):
        return False
    _check_flags(options)
    if options.server_addr and options.num_hosts and options.num_hosts > 1 and (
            options.host_idx is not None):  # indices from flags: two may collide
        if options.host_idx == 0:
            roll_call.start_server(options.server_addr, options.timeout_s)
        else:
            roll_call.report(options.server_addr, options.host_idx, options.timeout_s)
    if "JAX_CPU_COLLECTIVES_IMPLEMENTATION" not in environ:
        # Cross-process collectives on CPU (tests, laptops); the GPU backend uses NCCL
        # and ignores this. gloo is jax 0.10's default, but not every release's.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")

    connected = threading.Event()
    watchdog = threading.Thread(
        target=_exit_unless_connected, args=(connected, options), name="distributed-watchdog",
        daemon=True)
    watchdog.start()
    try:
        jax.distributed.initialize(
            coordinator_address=options.server_addr,
            num_processes=options.num_hosts,
            process_id=options.host_idx,
            local_device_ids=None,  # None: JAX_LOCAL_DEVICE_IDS, else jax's per-cluster default
            initialization_timeout=options.timeout_s,
        )
    except (ValueError, TypeError, RuntimeError) as error:
        connected.set()  # stand the watchdog down: this failure is reported normally
        raise UserError(_start_failure(error, options)) from None
    connected.set()
    return True


def process_summary(environ=os.environ) -> str:
    """One line about the running multi-process job (for process 0's log)."""
    line = (f"jax.distributed: {jax.process_count()} processes, coordinator "
            f"{_coordinator_address() or '?'}, {jax.local_device_count()} local and "
            f"{jax.device_count()} global devices")
    if (jax.default_backend() == "gpu" and jax.local_device_count() == 1
            and "JAX_LOCAL_DEVICE_IDS" not in environ and _one_task_per_node(environ)):
        # jax's SLURM/Open MPI default is one process per GPU; the mesh error that
        # follows would not say why a node's other GPUs are missing.
        line += ("; only 1 GPU per process: jax assumes one process per GPU under "
                 "SLURM/Open MPI, so with one task per node export "
                 "JAX_LOCAL_DEVICE_IDS=0,1,...,7 (scripts_gpu/run_pile_multinode.sh does)")
    return line


def _one_task_per_node(environ) -> bool:
    tasks = environ.get("SLURM_STEP_TASKS_PER_NODE", "")  # e.g. "1(x8)", "2,1"
    return bool(re.fullmatch(r"1(\(x\d+\))?", tasks)) or (
        environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") == "1")


def _check_flags(options: DistributedOptions) -> None:
    if options.server_addr is not None:
        host, sep, port = options.server_addr.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise UserError(f"--server_addr={options.server_addr}: expected HOST:PORT of "
                            f"process 0 (e.g. node001:12345)")
    if options.num_hosts is not None and options.num_hosts < 1:
        raise UserError(f"--num_hosts={options.num_hosts}: must be at least 1")
    if options.host_idx is not None and not (
            0 <= options.host_idx < (options.num_hosts or sys.maxsize)):
        raise UserError(f"--host_idx={options.host_idx}: must be in 0 .. --num_hosts - 1")
    if options.timeout_s < 1:
        raise UserError(f"--distributed_timeout_s={options.timeout_s}: must be at least 1")


def _start_failure(error: Exception, options: DistributedOptions) -> str:
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
    if isinstance(error, ValueError) and "defined" in reason:
        # jax found no cluster environment to supply what the flags left out.
        return (f"cannot start jax.distributed: no cluster environment (SLURM srun, Open MPI "
                f"mpirun, ...) supplies the job's layout ({reason}); pass "
                f"--server_addr=HOST:PORT --num_hosts=N --host_idx=I on every process")
    address = _coordinator_address() or options.server_addr or "the coordinator"
    return (f"could not start jax.distributed with coordinator {address}: {reason} "
            f"(if process 0's port is taken, choose another --server_addr port)")


def _exit_unless_connected(connected: threading.Event, options: DistributedOptions) -> None:
    if connected.wait(options.timeout_s):
        return
    # The main thread is blocked inside jax's C++ client and cannot raise, and jax would
    # soon abort with a stack trace, so report here and end the process ourselves.
    address = _coordinator_address() or options.server_addr or "the coordinator"
    state = _jax_state()
    who = (f"process {state.process_id} of {state.num_processes}" if state is not None
           and state.num_processes > 1 else "this process")
    sys.stderr.write(
        f"error: jax.distributed: not every process reached the coordinator at {address} "
        f"within --distributed_timeout_s={options.timeout_s} ({who}); check that all "
        f"processes were started with the same --server_addr/--num_hosts and that "
        f"{address} is reachable from every node\n")
    sys.stderr.flush()
    os._exit(2)


def _jax_state():
    """jax's record of the distributed job: it knows the detected coordinator address
    before the connection completes. Private, hence read defensively."""
    try:
        from jax._src import distributed as jax_distributed

        return jax_distributed.global_state
    except (ImportError, AttributeError):
        return None


def _coordinator_address() -> str | None:
    state = _jax_state()
    return getattr(state, "coordinator_address", None) or os.environ.get(
        "JAX_COORDINATOR_ADDRESS")


def _int_or_one(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 1
