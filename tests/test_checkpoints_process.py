"""Checkpoints and signals across real processes.

- main.py killed with SIGKILL at a random step, started again: the final parameters are
  bitwise those of an uninterrupted run, and so is every loss after the restore point.
- main.py sent SIGTERM: it finishes the step, saves it, and exits 0.
- main.py whose loss turns NaN: one line naming the step, exit status 3, good checkpoints kept.
- two jax.distributed processes, one of them signalled: both stop at the same step
  (this file is the worker program: `python -m tests.test_checkpoints_process --worker`).
"""

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from paxloom.runner.state import checkpoints
from tests.support.files import tree_digest
from tests.support.processes import (
    TIMEOUT_S,
    free_port,
    isolated_env,
    kill_group,
    session_env,
    start_main,
    start_python,
    wait_or_kill,
)
from tests.support.tiny import fdl_flags

# experiments.Tiny (the sample corpus through the real text input pipeline, whose position
# the checkpoints record), smaller and without evaluations.
SMALL = dict(MAX_SEQ_LEN=64, ICI_MESH_SHAPE=[1, 8, 1], PERCORE_BATCH_SIZE=1, LAMBADA_EVAL=False,
             EVAL_INTERVAL_STEPS=0)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """8 fake CPU devices, cheap CPU compilation (same maths in every run), and a compilation
    cache shared by this module's runs, so only the first one compiles."""
    return isolated_env(8, compilation_cache=str(tmp_path_factory.mktemp("jax_cache")))


def start(job_dir: Path, env: dict, *flags: str, **hparams) -> subprocess.Popen:
    job_dir.mkdir(parents=True, exist_ok=True)
    with open(job_dir / "stdout.txt", "a") as out, open(job_dir / "stderr.txt", "a") as err:
        return start_main("--fdl_config=experiments.Tiny", f"--job_log_dir={job_dir}", *flags,
                          *fdl_flags(**{**SMALL, **hparams}), env=env, stdout=out, stderr=err,
                          start_new_session=True)


def finish(proc: subprocess.Popen, job_dir: Path) -> tuple[int, str, str]:
    code = wait_or_kill(proc)
    return code, (job_dir / "stdout.txt").read_text(), (job_dir / "stderr.txt").read_text()


def run(job_dir: Path, env: dict, *flags: str, **hparams) -> str:
    code, out, err = finish(start(job_dir, env, *flags, **hparams), job_dir)
    assert code == 0, f"exit {code}\n{out[-3000:]}\n{err[-3000:]}"
    return out


def wait_for(condition, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {TIMEOUT_S}s"
        time.sleep(0.01)


def tensorboard_losses(job_dir: Path) -> list[tuple[int, float]]:
    """(step, loss) as TensorBoard shows them: every run's event files under tb/train, what
    a resumed run redoes purged from the earlier runs' files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(job_dir / "tb" / "train"))
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars("loss")]


def assert_bitwise_equal(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


RESUMABLE = dict(MAX_STEPS=16, CHECKPOINT_EVERY_N_STEPS=2, SUMMARY_INTERVAL_STEPS=1)


@pytest.mark.slow  # 25 s: a killed run and its rerun
@pytest.mark.process
def test_sigkill_at_a_random_step_then_rerun_matches_an_uninterrupted_run(tmp_path, env):
    assert_sigkill_then_rerun_matches_an_uninterrupted_run(tmp_path, env)


def assert_sigkill_then_rerun_matches_an_uninterrupted_run(tmp_path, env, *flags: str):
    """main.py with `flags` (and RESUMABLE) killed with SIGKILL once a random checkpoint
    exists, then rerun: it resumes from the last complete checkpoint and ends bitwise as an
    uninterrupted run, each step logged once. Returns (the reference's console, the final
    state)."""
    kill_after = random.choice(range(2, 12, 2))
    print(f"SIGKILL once checkpoint {kill_after} exists")
    # Compiling is mostly one thread: the reference and the doomed run share 2 cores well.
    reference = start(tmp_path / "reference", env, *flags, **RESUMABLE)
    job = tmp_path / "job"
    proc = start(job, env, *flags, **RESUMABLE)
    wait_for(lambda: (job / "checkpoints" / str(kill_after)).is_dir(), proc,
             f"checkpoint {kill_after}")
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    killed_at = checkpoints.latest_step(str(job / "checkpoints"))
    code, reference_out, err = finish(reference, tmp_path / "reference")
    assert code == 0, err[-3000:]
    out = run(job, env, *flags, **RESUMABLE)
    restored = int(re.search(r"^restored step (\d+) from ", out, re.M).group(1))
    print(f"killed with checkpoint {killed_at} complete; resumed from step {restored}")
    assert kill_after <= restored == killed_at < RESUMABLE["MAX_STEPS"]

    step, state = checkpoints.load_numpy(str(job / "checkpoints"))
    _, expected = checkpoints.load_numpy(str(tmp_path / "reference" / "checkpoints"))
    assert step == RESUMABLE["MAX_STEPS"]
    assert_bitwise_equal(state, expected)
    # Each step once, in order (the killed run's steps after `restored` were purged), and
    # the redone steps log what the uninterrupted run logged.
    losses = tensorboard_losses(job)
    reference = tensorboard_losses(tmp_path / "reference")
    steps = list(range(1, RESUMABLE["MAX_STEPS"] + 1))
    assert [s for s, _ in reference] == steps and [s for s, _ in losses] == steps
    assert [v for s, v in losses if s > restored] == [v for s, v in reference if s > restored]
    return reference_out, state


@pytest.mark.process
@pytest.mark.slow  # the kill -9 resume above covers resuming; this adds the restore path
def test_a_run_from_checkpoint_restore_path_killed_resumes_its_own_checkpoints(tmp_path, env):
    """CHECKPOINT_RESTORE_PATH seeds a new job once: after kill -9 the same command resumes
    the job's own checkpoint (never re-initialising over it), and the source is unchanged."""
    source = tmp_path / "source"
    run(source, env, MAX_STEPS=2)
    before = tree_digest(source / "checkpoints")
    job = tmp_path / "job"
    hparams = dict(RESUMABLE, MAX_STEPS=8, CHECKPOINT_RESTORE_PATH=str(source))
    proc = start(job, env, **hparams)
    wait_for(lambda: (job / "checkpoints" / "4").is_dir(), proc, "checkpoint 4")
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    first = (job / "stdout.txt").read_text()
    assert "parameters from checkpoint step 2 of " in first
    killed_at = checkpoints.latest_step(str(job / "checkpoints"))
    out = run(job, env, **hparams)[len(first):]
    assert f"restored step {killed_at} from {job}/checkpoints/{killed_at}" in out
    assert "initialised" not in out
    assert checkpoints.latest_step(str(job / "checkpoints")) == 8
    assert tree_digest(source / "checkpoints") == before


@pytest.mark.process
def test_sigterm_finishes_the_step_saves_and_exits_0(tmp_path, env):
    proc = start(tmp_path, env, MAX_STEPS=100_000, SUMMARY_INTERVAL_STEPS=1,
                 LR_COS_DECAY_END=100_000)
    wait_for(lambda: "step      3 | loss" in (tmp_path / "stdout.txt").read_text(), proc,
             "step 3")
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc, tmp_path)
    assert code == 0, err[-3000:]
    stopped = int(re.search(r"^step (\d+): SIGTERM received; saving a checkpoint and stopping "
                            r"\(run the same command again to resume\)$", out, re.M).group(1))
    assert 3 <= stopped < 100_000
    assert f"step {stopped:>6} | checkpoint {tmp_path}/checkpoints/{stopped} complete" in out
    assert checkpoints.latest_step(str(tmp_path / "checkpoints")) == stopped


@pytest.mark.process
def test_nonfinite_loss_exits_3_with_one_line_and_keeps_good_checkpoints(tmp_path, env):
    # Adam steps of size 1e6 blow the loss up within a few steps.
    code, out, err = finish(start(tmp_path, env, MAX_STEPS=20, LEARNING_RATE=1e6,
                                  LR_COS_WARMUP=0, LR_COS_DECAY_START=0,
                                  CHECKPOINT_EVERY_N_STEPS=1), tmp_path)
    assert code == 3, f"{out[-2000:]}\n{err[-2000:]}"
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    bad = int(re.fullmatch(
        r"error: loss, gradient norm or parameters became NaN/Inf at step (\d+); .*", line
    ).group(1))
    step, state = checkpoints.load_numpy(str(tmp_path / "checkpoints"))
    assert step == bad - 1
    assert all(np.isfinite(x).all() for x in jax.tree_util.tree_leaves(state["params"]))


# ----- several processes agree on the step ------------------------------------------------


@pytest.mark.process
@pytest.mark.multiprocess
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_processes_stop_at_one_step_when_one_is_signalled(tmp_path, sig):
    port = free_port()
    env = session_env(JAX_PLATFORMS="cpu", XLA_FLAGS="")
    procs, logs = [], []
    for i in range(2):
        logs.append(tmp_path / f"process{i}.txt")
        with open(logs[i], "w") as out:
            procs.append(start_python(
                "-u", "-m", "tests.test_checkpoints_process", "--worker", f"--port={port}",
                f"--host_idx={i}", env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True))
    try:
        for i in range(2):
            wait_for(lambda i=i: "step 20" in logs[i].read_text(), procs[i], "step 20")
        procs[1].send_signal(sig)
        codes = [p.wait(TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            kill_group(p)
    texts = [log.read_text() for log in logs]
    assert codes == [0, 0], texts
    stops = [re.search(r"^stop at (\d+)$", t, re.M) for t in texts]
    assert all(stops), texts
    assert stops[0].group(1) == stops[1].group(1)


@pytest.mark.process
@pytest.mark.multiprocess
@pytest.mark.slow  # two main.py processes: 40-90 s on 2 cores
def test_main_py_processes_save_one_step_when_one_gets_sigterm(tmp_path, env):
    port = free_port()
    env = {**env, "XLA_FLAGS": env["XLA_FLAGS"].replace("count=8", "count=4")}
    procs = [start(tmp_path / f"process{i}", env, "--multiprocess_gpu",
                   f"--server_addr=127.0.0.1:{port}", "--num_hosts=2", f"--host_idx={i}",
                   f"--job_log_dir={tmp_path / 'job'}",  # the last --job_log_dir wins
                   ICI_MESH_SHAPE=[1, 2, 2], DCN_MESH_SHAPE=[2, 1, 1], MAX_STEPS=100_000,
                   SUMMARY_INTERVAL_STEPS=1, LR_COS_DECAY_END=100_000, DATASET="synthetic",
                   VOCAB_SIZE=512)
             for i in range(2)]
    try:
        wait_for(lambda: "step      3 | loss" in (tmp_path / "process0" / "stdout.txt")
                 .read_text(), procs[0], "step 3")
        procs[1].send_signal(signal.SIGTERM)  # only one of them: jax tells the other
        results = [finish(p, tmp_path / f"process{i}") for i, p in enumerate(procs)]
    finally:
        for p in procs:
            kill_group(p)
    assert [code for code, _, _ in results] == [0, 0], [err[-2000:] for _, _, err in results]
    out = results[0][1]
    stopped = int(re.search(r"^step (\d+): SIGTERM received; saving", out, re.M).group(1))
    assert checkpoints.latest_step(str(tmp_path / "job" / "checkpoints")) == stopped


def worker_main(argv: list[str]) -> None:
    """One of two processes stepping in lockstep-free loops until the watcher says stop."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host_idx", type=int, required=True)
    args = parser.parse_args(argv)
    jax.distributed.initialize(f"127.0.0.1:{args.port}", num_processes=2,
                               process_id=args.host_idx, initialization_timeout=120)
    from paxloom.runner.training.preemption import PreemptionWatcher

    with PreemptionWatcher("SIGUSR1") as watcher:
        assert watcher.synchronized
        for step in range(1, 100_000):
            # Different speeds: the processes are at different steps when the signal comes.
            time.sleep(0.01 * (1 + args.host_idx))
            if step % 10 == 0:
                print(f"step {step}", flush=True)
            if watcher.reached(step):
                print(f"stop at {step}", flush=True)
                break
    jax.distributed.shutdown()


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    worker_main(sys.argv[2:])
