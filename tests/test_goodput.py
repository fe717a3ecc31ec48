"""The goodput ledger: where a job's wall time went, across a run killed with SIGKILL and
the run that resumed it."""

import json
import signal
import subprocess
import time

import pytest

from paxloom.runner.state import checkpoints
from paxloom.runner.training import goodput
from tests.support.processes import run_main, run_python, start_main
from tests.support.tiny import tiny_flags


def train_args(job_dir, max_steps: int) -> list[str]:
    return ["--fdl_config=experiments.base.BaseExperiment",
            *tiny_flags(ICI_MESH_SHAPE=[8, 1, 1], CHECKPOINT_EVERY_N_STEPS=4,
                        SUMMARY_INTERVAL_STEPS=1),
            f"--fdl.MAX_STEPS={max_steps}", f"--job_log_dir={job_dir}"]


@pytest.mark.process
def test_a_killed_run_counts_the_steps_after_its_last_checkpoint_as_lost(tmp_path):
    job_dir = tmp_path / "job"
    log = open(tmp_path / "first.out", "w+")
    first = start_main(*train_args(job_dir, 1000), stdout=log, stderr=subprocess.STDOUT)
    # Kill it once a checkpoint is complete (saves are asynchronous) and 3 more steps ran.
    ckpt = checkpoints.job_checkpoint_dir(str(job_dir))
    deadline = time.monotonic() + 240
    while not (checkpoints.latest_step(ckpt) and _step(job_dir) >= checkpoints.latest_step(
            ckpt) + 3):
        assert first.poll() is None and time.monotonic() < deadline, log.read()
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    died_at, saved = _step(job_dir), checkpoints.latest_step(ckpt)
    assert died_at >= saved + 3

    out = run_main(*train_args(job_dir, died_at + 2), unbuffered=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"restored step {saved}" in out.stdout
    assert (f"goodput: the previous run died at step {died_at}; steps {saved + 1}..{died_at} "
            f"({died_at - saved}) are trained again") in out.stdout

    first_run, second_run = goodput.read(str(job_dir))  # the killed run, then the resume
    assert first_run["ended"] == "died" and second_run["ended"] == "finished"
    assert second_run["lost_steps"] == died_at - saved  # exactly the steps after its last checkpoint
    per_step = first_run["seconds"]["productive"] / died_at
    assert second_run["lost_seconds"] == pytest.approx(per_step * (died_at - saved))
    for run in (first_run, second_run):  # the phases account for the run's wall time
        assert all(v >= -0.05 for v in run["seconds"].values()), run
        assert sum(run["seconds"].values()) == pytest.approx(run["wall"], abs=0.05)
        assert run["seconds"]["compile"] > 0 and run["seconds"]["productive"] > 0
    totals = goodput.job_totals([first_run, second_run])
    assert 0 < totals["goodput"] < 1 and totals["lost_steps"] == died_at - saved
    assert not (job_dir / "goodput_current.json").exists()
    assert "goodput " in out.stdout.splitlines()[-1]  # the closing line

    shown = run_python("-m", "paxloom.runner.training.goodput", str(job_dir), timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "died" in shown.stdout and "finished" in shown.stdout
    assert f"({died_at - saved} steps trained again)" in shown.stdout
    # TensorBoard has the split at every summary.
    records = [json.loads(line) for line in open(job_dir / "tb" / "train" / "metrics.jsonl")]
    assert "goodput/goodput" in records[-2] and "goodput/compile" in records[-2]


def _step(job_dir) -> int:
    """How far the running job got (the ledger's in-place record), 0 before its first step."""
    try:
        return json.loads((job_dir / "goodput_current.json").read_text())["step"]
    except (OSError, ValueError):
        return 0


@pytest.mark.process
def test_ledger_cli_on_a_directory_without_records(tmp_path):
    shown = run_python("-m", "paxloom.runner.training.goodput", str(tmp_path), timeout=60)
    assert shown.returncode == 2 and shown.stderr.startswith("error: ")
    assert len(shown.stderr.strip().splitlines()) == 1
