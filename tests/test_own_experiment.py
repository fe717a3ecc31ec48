"""The three seams, used from outside the repository: a module of the user's own (in a
temporary directory, on PYTHONPATH, nothing of runner/, experiments/ or tasks/ edited)
defines a dataset class, a callback and an experiment that uses both. It trains through
main.py on 2x2x2 fake devices, is killed with SIGKILL after a checkpoint, resumes, and ends
bitwise where an uninterrupted run ends; the callback sees every step of each run."""

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import jax
import pytest

from paxloom.runner.state import checkpoints
from tests.support.paths import REPO_ROOT
from tests.support.processes import TIMEOUT_S, isolated_env, start_main, wait_or_kill

MAX_STEPS = 8

USER_MODULE = '''
"""A user's own experiment module: its own data, its own callback."""

import dataclasses
import json
import os

import fiddle as fdl
import numpy as np

import experiments
from paxloom.core.callbacks import Callback
from tasks.packing import make_batch


class CountingInput:
    """Rows of a counting sequence with a per-row stride: learnable, and restartable."""

    def __init__(self, *, seq_len, vocab_size, seed, global_batch_size, process_rows):
        self.seq_len, self.vocab_size, self.seed = seq_len, vocab_size, seed
        self.rows = range(*process_rows)
        self.batch_index = 0

    def next_batch(self):
        rng = np.random.default_rng([self.seed, self.batch_index])
        starts = rng.integers(1, self.vocab_size, size=max(self.rows) + 1)[list(self.rows)]
        rows = (starts[:, None] + 3 * np.arange(self.seq_len + 1)) % (self.vocab_size - 1) + 1
        self.batch_index += 1
        lengths = np.full(len(rows), self.seq_len + 1)
        return make_batch(rows, lengths, eos_id=self.vocab_size - 1, packed=False)

    def get_state(self):
        return {"batch_index": self.batch_index}

    def set_state(self, state):
        self.batch_index = state["batch_index"]


@dataclasses.dataclass(frozen=True)
class Counting:
    """The dataset: token ids, no tokenizer, no evaluation."""

    def train_input(self, settings):
        return fdl.Partial(CountingInput, seq_len=settings.seq_len,
                           vocab_size=settings.vocab_size, seed=settings.seed)

    def evaluations(self, settings):
        return []

    def tokenizer(self, settings):
        return None


class StepLog(Callback):
    """Appends every step's number and loss to job_log_dir/my_steps.jsonl."""

    def on_start(self, run):
        self.path = os.path.join(run.job_log_dir, "my_steps.jsonl")
        with open(self.path, "a") as f:
            f.write(json.dumps({"start": run.start_step}) + "\\n")

    def after_step(self, info):
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": info.step, "loss": float(info.metrics["loss"])}) + "\\n")


@experiments.register
class MyCounting(experiments.BaseExperiment):
    NUM_LAYERS = 2
    MODEL_DIMS = 64
    HIDDEN_DIMS = 128
    NUM_HEADS = 4
    DIMS_PER_HEAD = 16
    MAX_SEQ_LEN = 64
    VOCAB_SIZE = 128
    ICI_MESH_SHAPE = [2, 2, 2]
    PERCORE_BATCH_SIZE = 1
    SUMMARY_INTERVAL_STEPS = 1
    CHECKPOINT_EVERY_N_STEPS = 2

    def dataset(self):
        return Counting()

    def callbacks(self):
        return [StepLog()]
'''


def start(job_dir: Path, user_dir: Path) -> subprocess.Popen:
    env = isolated_env(8, compilation_cache=str(user_dir / "jax_cache"),
                       PYTHONPATH=f"{user_dir}{os.pathsep}{REPO_ROOT}")
    job_dir.mkdir(parents=True, exist_ok=True)
    with open(job_dir / "out.txt", "a") as out:
        return start_main("--fdl_config=my_exps.MyCounting", f"--job_log_dir={job_dir}",
                          f"--fdl.MAX_STEPS={MAX_STEPS}", cwd=user_dir, env=env, stdout=out,
                          stderr=subprocess.STDOUT, start_new_session=True)


def finish(proc: subprocess.Popen, job_dir: Path) -> str:
    code = wait_or_kill(proc)
    out = (job_dir / "out.txt").read_text()
    assert code == 0, out[-3000:]
    return out


def runs(job_dir: Path) -> list[list[dict]]:
    """The callback's records, one list per run."""
    found = []
    for line in (job_dir / "my_steps.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "start" in record:
            found.append([])
        else:
            found[-1].append(record)
    return found, [json.loads(line)["start"] for line in
                   (job_dir / "my_steps.jsonl").read_text().splitlines() if "start" in line]


@pytest.mark.process
@pytest.mark.slow  # 18 s: three main.py runs
def test_own_dataset_and_callback_train_resume_exactly_and_see_every_step(tmp_path):
    user_dir = tmp_path / "user"
    user_dir.mkdir()
    (user_dir / "my_exps.py").write_text(textwrap.dedent(USER_MODULE))
    before = subprocess.run(["git", "status", "--porcelain", "runner", "experiments", "tasks"],
                            cwd=REPO_ROOT, capture_output=True, text=True).stdout

    reference = tmp_path / "reference"
    finish(start(reference, user_dir), reference)  # also fills the compilation cache
    job = tmp_path / "job"
    proc = start(job, user_dir)
    deadline = time.monotonic() + TIMEOUT_S
    while not (job / "checkpoints" / "4").is_dir():
        assert proc.poll() is None and time.monotonic() < deadline, (job / "out.txt").read_text()
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = checkpoints.latest_step(str(job / "checkpoints"))
    finish(start(job, user_dir), job)

    # Bitwise the uninterrupted run's parameters and optimizer state.
    step, state = checkpoints.load_numpy(str(job / "checkpoints"))
    _, expected = checkpoints.load_numpy(str(reference / "checkpoints"))
    assert step == MAX_STEPS
    for x, y in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(expected),
                    strict=True):
        assert x.tobytes() == y.tobytes()
    # The callback saw every step of every run, in order, with the reference's losses.
    (ref_run,), _ = runs(reference)
    assert [r["step"] for r in ref_run] == list(range(1, MAX_STEPS + 1))
    (first, second), starts = runs(job)
    assert starts == [0, killed_at]
    assert [r["step"] for r in first] == list(range(1, len(first) + 1))
    assert len(first) >= killed_at >= 4
    assert [r["step"] for r in second] == list(range(killed_at + 1, MAX_STEPS + 1))
    assert second == ref_run[killed_at:]
    assert first == ref_run[:len(first)]
    # Nothing of the framework was edited for it.
    assert subprocess.run(["git", "status", "--porcelain", "runner", "experiments", "tasks"],
                          cwd=REPO_ROOT, capture_output=True, text=True).stdout == before
