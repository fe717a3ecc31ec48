"""The hang watchdog (paxloom/runner/training/watchdog.py): a run that stops making progress ends
within --hang_timeout_s with every thread's stack, one line naming what it waited for, and
its own exit status, its last checkpoint intact."""

import os
import textwrap
import time

import pytest

from paxloom.runner.training.watchdog import HANG_EXIT_STATUS
from tests.support.paths import REPO_ROOT
from tests.support.processes import (
    Job,
    free_port,
    isolated_env,
    main_commands,
    run_main,
    session_env,
)
from tests.support.tiny import tiny_flags

# An experiment whose own callback never returns from step 2: a stalled step, as a hung
# collective or a dead peer leaves the loop.
STALLING = """
    import time

    from paxloom.core.callbacks import Callback
    from experiments.base import BaseExperiment


    class Stall(Callback):
        def after_step(self, info):
            if info.step == 2:
                time.sleep(3600)


    class Stalling(BaseExperiment):
        def callbacks(self):
            return [Stall()]
"""


@pytest.mark.process
@pytest.mark.slow
def test_a_stalled_step_ends_the_run_in_one_line_with_its_status(tmp_path):
    (tmp_path / "stalling.py").write_text(textwrap.dedent(STALLING))
    env = session_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO_ROOT}")
    job = tmp_path / "job"
    start = time.monotonic()
    out = run_main("--fdl_config=stalling.Stalling", *tiny_flags(MAX_STEPS=5,
                   CHECKPOINT_EVERY_N_STEPS=1), f"--job_log_dir={job}", "--hang_timeout_s=15",
                   env=env, timeout=300)
    took = time.monotonic() - start
    assert out.returncode == HANG_EXIT_STATUS, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: no progress for 1") and "on process 0 of 1 while waiting " \
        "for what follows train step 2" in last and "--hang_timeout_s=15" in last, last
    assert 'File "' in out.stderr and "in after_step" in out.stderr  # the stalled thread
    assert took < 240, took
    assert (job / "checkpoints" / "1").is_dir()


def test_the_watchdog_is_quiet_while_there_is_progress(tmp_path):
    from paxloom.runner.training.watchdog import Watchdog

    with Watchdog(0.5, "a test") as watchdog:
        for step in range(8):
            time.sleep(0.1)
            watchdog.before_step(step)
    time.sleep(0.7)  # stopped: no longer watching


# Process 1 of two stalls at step 2: process 0 waits for it in a collective.
PEER = """
    import time

    import jax

    from paxloom.core.callbacks import Callback
    from experiments.base import BaseExperiment


    class Peer(Callback):
        def after_step(self, info):
            if info.step == 2 and jax.process_index() == 1:
                time.sleep(3600)


    class TwoProcesses(BaseExperiment):
        def callbacks(self):
            return [Peer()]
"""


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_stalled_peer_ends_every_process(tmp_path):
    """Both end: the stalled one, and the one its collective leaves waiting. (A peer that
    dies is different: jax.distributed's client aborts the others itself, with a C++ stack
    trace, when the coordination service misses its heartbeat; see the watchdog's doc.)"""
    (tmp_path / "peer.py").write_text(textwrap.dedent(PEER))
    env = isolated_env(4, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO_ROOT}")
    commands = main_commands(2, "--fdl_config=peer.TwoProcesses",
                             *tiny_flags(MAX_STEPS=6, CHECKPOINT_EVERY_N_STEPS=1,
                                         ICI_MESH_SHAPE=[1, 4, 1], DCN_MESH_SHAPE=[2, 1, 1]),
                             f"--job_log_dir={tmp_path / 'job'}", "--hang_timeout_s=20",
                             port=free_port())
    job = Job(commands, [env, env], tmp_path / "logs")
    start, deadline = time.monotonic(), time.monotonic() + 280
    try:
        while any(p.poll() is None for p in job.procs) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        job.kill()
    took = time.monotonic() - start
    for i in (0, 1):
        assert job.procs[i].returncode == HANG_EXIT_STATUS, job.tails()
        last = job.stderr(i).strip().splitlines()[-1]
        assert last.startswith("error: no progress for") and f"on process {i} of 2" in last, \
            job.tails()
    assert took < 240, (took, job.tails())
    assert (tmp_path / "job" / "checkpoints" / "1").is_dir()
