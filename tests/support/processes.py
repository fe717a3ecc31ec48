"""main.py and the repository's other programs in subprocesses, with this virtual
environment's Python: the command lines, the environments they run in, one process run to its
end or started in the background, and jobs of several processes.

An environment, wherever one is taken, is the whole environment of the child:
- session_env(): this test session's (tests/conftest.py: 8 fake CPU devices, XLA:CPU's cheap
  compile settings, one persistent compilation cache for the session), the default;
- bare_env(): only what jax needs of it, and the session's token cache (nothing else of the
  caller's leaks in);
- isolated_env(devices): a clean one for a process of its own, or one of a job's, with
  `devices` fake CPU devices and no launcher (SLURM, Open MPI) variables.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.paths import MAIN_PY, REPO_ROOT

PYTHON = sys.executable  # the virtual environment's, which runs the tests
TIMEOUT_S = 300  # one main.py run; 10-40 s on 2 idle cores
JOB_TIMEOUT_S = 300  # a whole multi-process job; they take 30-90 s on 2 cores
DISTRIBUTED_TIMEOUT_S = 120  # --distributed_timeout_s: generous, imports are slow under load
# What a main.py subprocess with an otherwise bare environment needs of tests/conftest.py's
# (the token cache too: tokenized data never go to the user's ~/.cache).
JAX_ENV = ("XLA_FLAGS", "JAX_PLATFORMS", "JAX_COMPILATION_CACHE_DIR", "PAXLOOM_TOKEN_CACHE_DIR")
# Launcher variables would make jax (or runner.cluster.distributed) detect a cluster.
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI", "JAX_COORDINATOR")


# ----- environments ---------------------------------------------------------------------


def xla_flags(devices: int = 8) -> str:
    """`devices` fake CPU devices, compiled with XLA:CPU's cheap settings: these runs are
    mostly compile time on 2 cores (-25% CPU), and the maths is unchanged (bit-identical)."""
    return (f"--xla_force_host_platform_device_count={devices} "
            "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")


def session_env(**extra: str) -> dict[str, str]:
    """This test session's environment (conftest: 8 CPU devices) and `extra`."""
    return {**os.environ, **extra}


def bare_env(**extra: str) -> dict[str, str]:
    """Only JAX_ENV of this session's environment, and `extra`."""
    return {**{name: os.environ[name] for name in JAX_ENV}, **extra}


def isolated_env(devices: int = 8, compilation_cache: str = "", **extra: str) -> dict[str, str]:
    """A clean environment for one CPU process with `devices` fake devices: no launcher
    variables, the repository on PYTHONPATH, and `compilation_cache` as the persistent
    compilation cache ("": none; main.py's default would be the user's ~/.cache/paxloom;
    the session's cache is for single-process runs)."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith((*LAUNCHER_PREFIXES, "JAX_COMPILATION_CACHE"))}
    env.update(XLA_FLAGS=xla_flags(devices), JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=str(REPO_ROOT), JAX_COMPILATION_CACHE_DIR=compilation_cache)
    return {**env, **extra}


# ----- command lines --------------------------------------------------------------------


def main_command(*args: str, unbuffered: bool = False,
                 without_tensorflow: bool = False) -> list[str]:
    """`python [-u] main.py ARGS`; `without_tensorflow` makes `import tensorflow` fail in
    it, as on GPU machines that lack it."""
    if without_tensorflow:
        return [PYTHON, "-c", "import runpy, sys; sys.modules['tensorflow'] = None; "
                f"sys.argv = {[str(MAIN_PY), *args]!r}; runpy.run_path({str(MAIN_PY)!r}, "
                "run_name='__main__')"]
    return [PYTHON, *(["-u"] if unbuffered else []), str(MAIN_PY), *args]


def main_commands(num: int, *args: str, port: int | None = None, multiprocess_gpu: bool = True,
                  timeout_s: int = DISTRIBUTED_TIMEOUT_S) -> list[list[str]]:
    """main.py (unbuffered) for each of the `num` processes of one job: `args`, then its
    place in the job. With `port`: [--multiprocess_gpu,] coordinator 127.0.0.1:port,
    --num_hosts and --host_idx; without, none (a launcher's environment tells, as srun's).
    A job of several processes also gets --distributed_timeout_s=`timeout_s`."""
    def place(i: int) -> list[str]:
        flags = []
        if port is not None:
            flags = [*(["--multiprocess_gpu"] if multiprocess_gpu else []),
                     f"--server_addr=127.0.0.1:{port}", f"--num_hosts={num}", f"--host_idx={i}"]
        if num > 1:
            flags.append(f"--distributed_timeout_s={timeout_s}")
        return flags

    return [main_command(*args, *place(i), unbuffered=True) for i in range(num)]


# ----- one process ----------------------------------------------------------------------


def run_command(command: list[str], env: dict | None = None, cwd=REPO_ROOT,
                timeout: float | None = TIMEOUT_S, check: bool = False):
    """`command` run to its end (environment: session_env() unless given), its output
    captured as text; `check`: it must exit 0."""
    out = subprocess.run(command, cwd=cwd, env=session_env() if env is None else env,
                         capture_output=True, text=True, timeout=timeout)
    if check:
        assert out.returncode == 0, f"exit {out.returncode}\n{out.stderr[-3000:]}"
    return out


def run_python(*args: str, **options) -> subprocess.CompletedProcess:
    """`python ARGS` (a module with -m, or a script) run to its end; `options` as run_command's."""
    return run_command([PYTHON, *args], **options)


def run_main(*args: str, env: dict | None = None, cwd=REPO_ROOT, timeout: float = TIMEOUT_S,
             check: bool = False, unbuffered: bool = False,
             without_tensorflow: bool = False) -> subprocess.CompletedProcess:
    """main.py ARGS run to its end, in `env` (default session_env(): the 8 fake CPU devices)."""
    return run_command(main_command(*args, unbuffered=unbuffered,
                                    without_tensorflow=without_tensorflow),
                       env=env, cwd=cwd, timeout=timeout, check=check)


def start_python(*args: str, env: dict | None = None, cwd=REPO_ROOT,
                 **popen_options) -> subprocess.Popen:
    """`python ARGS` started in the background (environment: session_env() unless given);
    `popen_options` go to subprocess.Popen (stdout, stderr, start_new_session, ...)."""
    return subprocess.Popen([PYTHON, *args], cwd=cwd,
                            env=session_env() if env is None else env, **popen_options)


def start_main(*args: str, unbuffered: bool = True, **options) -> subprocess.Popen:
    """main.py ARGS started in the background; `options` as start_python's."""
    return start_python(*main_command(*args, unbuffered=unbuffered)[1:], **options)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to `proc`'s process group (start_new_session=True), if it still runs."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def wait_or_kill(proc: subprocess.Popen, timeout: float = TIMEOUT_S) -> int:
    """`proc`'s exit status; its process group is killed if it is not done in `timeout`."""
    try:
        return proc.wait(timeout)
    finally:
        kill_group(proc)


def assert_one_line(out, message: str, status: int = 2):
    """The run ended with `status` and one line on stderr, which says `message`."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == status and len(lines) == 1, out.stderr[-3000:]
    assert message in lines[0], lines[0]


# ----- jobs of several processes --------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """Processes started together; `wait` bounds their time and reports failures."""

    def __init__(self, commands: list[list[str]], envs: list[dict[str, str]], log_dir: Path):
        self.logs = []
        self.procs: list[subprocess.Popen] = []
        log_dir.mkdir(parents=True, exist_ok=True)
        for i, (command, env) in enumerate(zip(commands, envs, strict=True)):
            out, err = log_dir / f"process{i}.out", log_dir / f"process{i}.err"
            self.logs.append((out, err))
            with open(out, "w") as fout, open(err, "w") as ferr:
                self.procs.append(subprocess.Popen(
                    command, cwd=REPO_ROOT, env=env, stdout=fout, stderr=ferr,
                    start_new_session=True))  # its own process group, killed as one

    def wait(self, timeout_s: float) -> list[int]:
        """Exit codes; kills everything and fails at the deadline or on a failing process."""
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in self.procs):
            # A failed process leaves its peers blocked in collectives: stop at once.
            if any(p.poll() not in (None, 0) for p in self.procs):
                break
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"job did not finish in {timeout_s}s\n{self.tails()}")
            time.sleep(0.2)
        self.kill()
        return [p.returncode for p in self.procs]

    def kill(self) -> None:
        for p in self.procs:
            kill_group(p)

    def stdout(self, i: int) -> str:
        return self.logs[i][0].read_text()

    def stderr(self, i: int) -> str:
        return self.logs[i][1].read_text()

    def tails(self) -> str:
        return "\n".join(f"--- process {i} rc={p.returncode}\n{self.stdout(i)[-1500:]}"
                         f"{self.stderr(i)[-3000:]}" for i, p in enumerate(self.procs))


def run_job(commands, devices, log_dir, envs=None) -> Job:
    """Run `commands` together (default environment: `isolated_env(devices)`); all must pass."""
    job = Job(commands, envs or [isolated_env(devices)] * len(commands), log_dir)
    try:
        codes = job.wait(JOB_TIMEOUT_S)
    finally:
        job.kill()
    assert codes == [0] * len(commands), job.tails()
    return job
