"""Checkpoints in one process: round trip, exact resume, other meshes, refusals, crash
safety, non-finite losses, evaluation from a checkpoint, preemption by signal.

Jobs run through launch.job.run, the code path main.py takes, on the tiny model.
"""

import errno
import json
import os
import re
import signal

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import experiments
from paxloom.core.errors import UserError
from paxloom.launch import job
from paxloom.runner.state import checkpoints
from paxloom.runner.training import preemption
from paxloom.runner.training.builtin_callbacks import NonFiniteLossError
from paxloom.runner.training.trainer import Trainer
from tests.support.tiny import TINY
from tests.support.training import make_trainer

JOB = dict(TINY, ICI_MESH_SHAPE=[1, 8, 1], SUMMARY_INTERVAL_STEPS=1, MAX_STEPS=8,
           CHECKPOINT_EVERY_N_STEPS=4)


pytestmark = pytest.mark.usefixtures("compilation_cache")


def run_job(job_dir, mode="train", experiment=experiments.BaseExperiment, restore_dir=None,
            restore_step=None, **overrides):
    exp = experiment(**{**JOB, **overrides})
    return job.run(exp, job.RunOptions(mode=mode, job_log_dir=str(job_dir),
                                       restore_checkpoint_dir=restore_dir,
                                       restore_checkpoint_step=restore_step))


def ckpt_dir(job_dir) -> str:
    return checkpoints.job_checkpoint_dir(str(job_dir))


def assert_bitwise_equal(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()


def console_losses(text: str) -> dict[int, str]:
    return {int(s): loss for s, loss in re.findall(r"^step +(\d+) \| loss ([\d.]+)", text, re.M)}


class HookedInput:
    """A train input whose batch number `at` (0-based) passes through `hook` first."""

    def __init__(self, inner, at: int, hook):
        self.inner, self.at, self.hook = inner, at, hook

    def next_batch(self):
        index = self.inner.get_state()["batch_index"]
        batch = self.inner.next_batch()
        return self.hook(batch) if index == self.at else batch

    def get_state(self):
        return self.inner.get_state()

    def set_state(self, state):
        self.inner.set_state(state)


def hook_input(monkeypatch, at: int, hook):
    original = Trainer.make_train_input
    monkeypatch.setattr(Trainer, "make_train_input",
                        lambda self: HookedInput(original(self), at, hook))


def nan_weights(batch):
    return {**batch, "weights": np.full_like(batch["weights"], np.nan)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 8-step job (checkpoints at 4 and 8): its directory, console, final state."""
    import contextlib
    import io

    job_dir = tmp_path_factory.mktemp("reference")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run_job(job_dir)
    step, state = checkpoints.load_numpy(ckpt_dir(job_dir))
    assert step == 8
    return {"dir": job_dir, "console": out.getvalue(), "state": state}


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """A Trainer of the reference job's model and mesh (no compiled step needed)."""
    return make_trainer(tmp_path_factory.mktemp("trainer"), ICI_MESH_SHAPE=[1, 8, 1])


# ----- save and restore ---------------------------------------------------------------


class RecordingWriter:
    """Stands for the loop's `publish` (RunInfo.publish): records what a callback publishes."""

    def __init__(self):
        self.scalars_written = []

    def __call__(self, split, step, values):
        self.scalars_written.append((step, values))


def test_round_trip_state_input_position_and_metadata(tmp_path, trainer, capsys):
    state = trainer.init_state()
    writer = RecordingWriter()
    metadata = checkpoints.run_metadata("tests.Tiny", {**TINY, "MAX_STEPS": 5},
                                        trainer.abstract_state["params"])
    with checkpoints.Checkpointer(tmp_path / "ckpt", metadata=metadata, every_n_steps=0,
                                  max_to_keep=2) as ckpt:
        ckpt.publish = writer
        ckpt.save(3, state, {"batch_index": 7, "seed": 1}, final=True)
    step = 3
    restored = checkpoints.restore(str(tmp_path / "ckpt"), None, trainer.abstract_state)
    assert restored.step == step and restored.path == str(tmp_path / "ckpt" / str(step))
    assert_bitwise_equal(restored.state, state)
    assert restored.input_state == {"batch_index": 7, "seed": 1}
    assert restored.metadata["experiment"] == "tests.Tiny"
    assert restored.metadata["hyperparameters"]["MODEL_DIMS"] == TINY["MODEL_DIMS"]
    assert "MAX_STEPS" not in restored.metadata["hyperparameters"]  # not a shape
    assert restored.metadata["params"]["lm/softmax/logits_ffn/linear/w"] == {
        "shape": [TINY["MODEL_DIMS"], TINY["VOCAB_SIZE"]], "dtype": "float32"}
    # Restored straight into the run's layout.
    w = restored.state["params"]["lm"]["softmax"]["logits_ffn"]["linear"]["w"]
    assert w.sharding == (
        trainer.state_shardings["params"]["lm"]["softmax"]["logits_ffn"]["linear"]["w"])
    assert [s for s, v in writer.scalars_written if "checkpoint/save_seconds" in v] == [step]
    assert f"step {step:>6} | checkpoint {tmp_path / 'ckpt' / str(step)} complete" in (
        capsys.readouterr().out)


@pytest.fixture(scope="module")
def saved_1x8x1(reference):
    """The reference job's checkpoints: written from an ICI [1,8,1] mesh, steps 4 and 8."""
    return ckpt_dir(reference["dir"])


@pytest.mark.process
@pytest.mark.parametrize("ici, num_devices", [([2, 2, 2], 8), ([8, 1, 1], 8), ([1, 1, 1], 1),
                                              ([1, 4, 1], 4)])
def test_restore_onto_another_mesh_or_fewer_devices(tmp_path, saved_1x8x1, ici, num_devices):
    other = make_trainer(tmp_path, devices=jax.devices()[:num_devices], ICI_MESH_SHAPE=ici)
    restored = checkpoints.restore(saved_1x8x1, None, other.abstract_state)
    _, saved = checkpoints.load_numpy(saved_1x8x1)
    assert_bitwise_equal(restored.state, saved)
    restored_shardings = jax.tree_util.tree_map(lambda a: a.sharding, restored.state)
    assert restored_shardings == other.state_shardings


@pytest.mark.process
def test_checkpoint_of_another_model_is_refused_naming_the_parameter(tmp_path, saved_1x8x1,
                                                                     trainer):
    wider = make_trainer(tmp_path, ICI_MESH_SHAPE=[1, 8, 1], HIDDEN_DIMS=128)
    with pytest.raises(UserError, match=r"parameter lm/transformer/x_layers_0/ff_layer/"
                       r"ffn_layer1/bias/b with shape \(256,\), but this model's is \(128,\)"):
        checkpoints.restore(saved_1x8x1, None, wider.abstract_state)
    # A third layer (NUM_LAYERS=3 without USE_REPEATED_LAYER): a parameter the checkpoint lacks.
    params = trainer.abstract_state["params"]
    layers = params["lm"]["transformer"]
    deeper = {"params": {**params, "lm": {**params["lm"], "transformer": {
        **layers, "x_layers_2": layers["x_layers_1"]}}}}
    with pytest.raises(UserError, match=r"has no parameter lm/transformer/x_layers_2/"):
        checkpoints.restore(saved_1x8x1, None, deeper)
    shallower = {"params": {**params, "lm": {**params["lm"], "transformer": {
        "x_layers_0": layers["x_layers_0"]}}}}
    with pytest.raises(UserError, match=r"holds parameter lm/transformer/x_layers_1/\S+ \(\d+"
                       r".*which this model lacks"):
        checkpoints.restore(saved_1x8x1, None, shallower)


@pytest.mark.process
def test_restore_of_a_missing_step_lists_the_steps(saved_1x8x1, trainer):
    with pytest.raises(UserError, match=r"no checkpoint for step 3 in .*; it has steps \[4, 8\]"):
        checkpoints.restore(saved_1x8x1, 3, trainer.abstract_state)


# ----- resume -----------------------------------------------------------------------------


@pytest.mark.process
def test_resume_continues_bitwise_like_an_uninterrupted_run(tmp_path, reference, capsys):
    run_job(tmp_path, MAX_STEPS=3)  # saves at 3 (the end)
    run_job(tmp_path)  # finds step 3, trains 4..8
    out = capsys.readouterr().out
    assert f"restored step 3 from {ckpt_dir(tmp_path)}/3" in out
    assert "steps 3 -> 8" in out
    _, state = checkpoints.load_numpy(ckpt_dir(tmp_path))
    assert_bitwise_equal(state, reference["state"])
    after = {s: v for s, v in console_losses(out).items() if s > 3}
    assert after == {s: v for s, v in console_losses(reference["console"]).items() if s > 3}


@pytest.mark.process
def test_a_resume_keeps_the_record_and_appends_changed_hyperparameters(tmp_path, capsys):
    run_job(tmp_path, MAX_STEPS=4)
    first = (tmp_path / "hyperparameters.json").read_bytes()
    # Refused (another model): nothing about the run's record changes.
    with pytest.raises(UserError, match="has no parameter"):
        run_job(tmp_path, MAX_STEPS=8, NUM_LAYERS=3)
    assert (tmp_path / "hyperparameters.json").read_bytes() == first
    assert not (tmp_path / "hyperparameters_history.jsonl").exists()
    # Resumed with another schedule: the record stays; the change is appended with its step.
    run_job(tmp_path, MAX_STEPS=6, LEARNING_RATE=1e-3)
    assert (tmp_path / "hyperparameters.json").read_bytes() == first
    history = [json.loads(line) for line in
               (tmp_path / "hyperparameters_history.jsonl").read_text().splitlines()]
    assert history == [{"step": 4, "changed": {"LEARNING_RATE": [6e-4, 1e-3],
                                                "MAX_STEPS": [4, 6]}}]
    assert ("resuming at step 4 with changed hyperparameters (appended to "
            "hyperparameters_history.jsonl): LEARNING_RATE 0.0006 -> 0.001, MAX_STEPS 4 -> 6"
            ) in capsys.readouterr().out


@pytest.mark.process
def test_restore_checkpoint_dir_and_step_start_a_new_job_from_another_run(tmp_path, reference,
                                                                          capsys):
    run_job(tmp_path, restore_dir=str(reference["dir"]), restore_step=4)
    assert f"restored step 4 from {ckpt_dir(reference['dir'])}/4" in capsys.readouterr().out
    _, state = checkpoints.load_numpy(ckpt_dir(tmp_path))
    assert_bitwise_equal(state, reference["state"])  # same state, same data position
    assert checkpoints.latest_step(ckpt_dir(reference["dir"])) == 8  # the source is untouched


@pytest.mark.process
def test_restore_source_rules(tmp_path, reference):
    own, other = ckpt_dir(reference["dir"]), str(reference["dir"])
    empty = ckpt_dir(tmp_path)
    assert checkpoints.restore_source(empty, None, None, "train") is None
    assert checkpoints.restore_source(own, None, None, "train") == (own, 8)
    # A job with checkpoints of its own resumes from them, whatever seeded it.
    assert checkpoints.restore_source(own, "/elsewhere", 2, "train") == (own, 8)
    # A job_log_dir or its checkpoints/ are both accepted.
    assert checkpoints.restore_source(empty, other, None, "train") == (own, 8)
    assert checkpoints.restore_source(empty, own, 4, "train") == (own, 4)
    assert checkpoints.restore_source(own, other, 4, "eval") == (own, 4)
    assert checkpoints.restore_source(own, None, 4, "eval") == (own, 4)
    with pytest.raises(UserError, match="has later checkpoints"):
        checkpoints.restore_source(own, None, 4, "train")
    with pytest.raises(UserError, match="no checkpoint in"):
        checkpoints.restore_source(empty, str(tmp_path), None, "train")
    with pytest.raises(UserError, match="has no checkpoints"):
        checkpoints.restore_source(empty, None, 4, "train")


class OtherExperiment(experiments.BaseExperiment):
    """Same model, another experiment."""


@pytest.mark.process
def test_job_dir_of_another_experiment_is_refused_and_left_alone(tmp_path, reference):
    config = (reference["dir"] / "hyperparameters.json").read_bytes()
    steps = sorted(os.listdir(ckpt_dir(reference["dir"])))
    with pytest.raises(UserError, match=r"holds checkpoints of experiments.base.BaseExperiment "
                       r"\(latest step 8\), not (tests\.)?test_checkpoints.OtherExperiment"):
        run_job(reference["dir"], experiment=OtherExperiment)
    assert (reference["dir"] / "hyperparameters.json").read_bytes() == config
    assert sorted(os.listdir(ckpt_dir(reference["dir"]))) == steps


# ----- crash safety -----------------------------------------------------------------------


@pytest.mark.process
def test_an_interrupted_save_is_not_taken_for_a_checkpoint(tmp_path, saved_1x8x1, trainer):
    import shutil

    directory = str(tmp_path / "ckpt")
    shutil.copytree(saved_1x8x1, directory)
    # What a save killed half-way leaves: orbax's temporary name, some of the items.
    partial = tmp_path / "ckpt" / ("9" + ocp.path.atomicity_types.TMP_DIR_SUFFIX)
    (partial / "state").mkdir(parents=True)
    (partial / "state" / "partial_write").write_bytes(b"\0" * 100)
    assert checkpoints.latest_step(directory) == 8
    assert checkpoints.restore(directory, None, trainer.abstract_state).step == 8
    # The next run's Checkpointer clears the debris before it saves.
    with checkpoints.Checkpointer(directory, metadata={}, every_n_steps=0,
                                  max_to_keep=2) as ckpt:
        ckpt.save(10, trainer.init_state(), {}, final=True)
    assert sorted(os.listdir(directory)) == ["10", "8"]


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("where", ["writing arrays", "finishing in the background"])
def test_a_failed_save_is_a_user_error_and_keeps_the_previous_checkpoint(
        tmp_path, monkeypatch, trainer, where):
    state = trainer.init_state()
    directory = str(tmp_path / "ckpt")
    ckpt = checkpoints.Checkpointer(directory, metadata={}, every_n_steps=1, max_to_keep=1)
    ckpt.save(1, state, {"batch_index": 1}, final=True)
    if where == "writing arrays":
        monkeypatch.setattr(ocp.type_handlers.ArrayHandler, "serialize", _disk_full)
    else:  # the rename that publishes a complete step
        from orbax.checkpoint._src.path import atomicity

        monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", _disk_full)
    with pytest.raises(UserError, match=r"could not write checkpoint step 2 to .*No space left "
                       r"on device.*the last complete checkpoint, step 1, is intact"):
        with ckpt:
            ckpt.save(2, state, {"batch_index": 2}, final=True)
    monkeypatch.undo()
    assert checkpoints.latest_step(directory) == 1  # max_to_keep=1 did not delete it
    restored = checkpoints.restore(directory, None, trainer.abstract_state)
    assert_bitwise_equal(restored.state, state)
    assert restored.input_state == {"batch_index": 1}


@pytest.mark.parametrize("defined_in, reported", [("/site-packages/orbax/checkpoint/io.py", False),
                                                  ("/home/user/my_writer.py", True)])
def test_orbax_write_tasks_that_fail_unseen_are_not_reported_twice(defined_in, reported):
    """A full disk fails several of orbax's write tasks; the first is the UserError, the rest
    would each print asyncio's "Task exception was never retrieved" traceback."""
    import asyncio
    import gc
    import logging

    namespace = {}
    exec(compile("async def write():\n    raise OSError(28, 'No space left on device')\n",
                 defined_in, "exec"), namespace)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("asyncio").addHandler(handler)
    try:
        async def leave_a_failed_task():
            asyncio.ensure_future(namespace["write"]())
            await asyncio.sleep(0)

        asyncio.run(leave_a_failed_task())
        gc.collect()
    finally:
        logging.getLogger("asyncio").removeHandler(handler)
    assert [r.getMessage().startswith("Task exception was never retrieved")
            for r in records] == ([True] if reported else [])


# ----- non-finite losses ---------------------------------------------------------------------


@pytest.mark.process
def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    hook_input(monkeypatch, at=4, hook=nan_weights)  # step 5
    with pytest.raises(NonFiniteLossError, match="NaN/Inf at step 5"):
        run_job(tmp_path, CHECKPOINT_EVERY_N_STEPS=2, SUMMARY_INTERVAL_STEPS=100)
    step, state = checkpoints.load_numpy(ckpt_dir(tmp_path))
    assert step == 4
    assert all(np.isfinite(x).all() for x in jax.tree_util.tree_leaves(state))


@pytest.mark.process
def test_a_finite_step_with_a_non_finite_update_is_never_saved(tmp_path):
    # 1e39 overflows float32: the first update makes every weight infinite while the loss
    # and gradient norm of that step are still finite.
    with pytest.raises(NonFiniteLossError, match="parameters became NaN/Inf at step 1"):
        run_job(tmp_path, LEARNING_RATE=1e39, LR_COS_WARMUP=0, LR_COS_DECAY_START=0,
                CHECKPOINT_EVERY_N_STEPS=1, SUMMARY_INTERVAL_STEPS=100)
    assert checkpoints.latest_step(ckpt_dir(tmp_path)) is None


@pytest.mark.process
def test_skip_nonfinite_steps_skips_the_step_and_goes_on(tmp_path, monkeypatch, capsys):
    hook_input(monkeypatch, at=4, hook=nan_weights)  # step 5
    run_job(tmp_path, SKIP_NONFINITE_STEPS=True, MAX_STEPS=6, CHECKPOINT_EVERY_N_STEPS=1,
            CHECKPOINT_MAX_TO_KEEP=10)
    assert "skipped 1 non-finite step(s)" in capsys.readouterr().out
    states = {s: checkpoints.load_numpy(ckpt_dir(tmp_path), s)[1] for s in (4, 5, 6)}
    assert int(states[5]["step"]) == 5
    # Step 5 kept the parameters and moments of step 4; step 6 trained again.
    assert_bitwise_equal(states[5]["params"], states[4]["params"])
    assert_bitwise_equal(states[5]["opt_state"], states[4]["opt_state"])
    w5, w6 = (states[s]["params"]["lm"]["softmax"]["logits_ffn"]["linear"]["w"] for s in (5, 6))
    assert np.isfinite(w6).all() and not np.array_equal(w5, w6)


# ----- evaluation ---------------------------------------------------------------------------


@pytest.mark.process
def test_eval_mode_evaluates_the_latest_checkpoint_once(tmp_path, reference, monkeypatch, capsys):
    calls = []
    original = Trainer.evaluate

    def recording(self, params, step, **kwargs):
        calls.append((jax.device_get(params), step))
        return original(self, params, step, **kwargs)

    monkeypatch.setattr(Trainer, "evaluate", recording)
    config = (reference["dir"] / "hyperparameters.json").read_bytes()
    results = run_job(reference["dir"], mode="eval", EVAL_INTERVAL_STEPS=1000,
                      experiment=OtherExperiment)  # an eval experiment may differ from training
    assert len(calls) == 1 and calls[0][1] == 8
    assert_bitwise_equal(calls[0][0], reference["state"]["params"])
    assert np.isfinite(results["synthetic_eval"]["loss"])
    assert f"evaluating step 8 (experiments.base.BaseExperiment) from {ckpt_dir(reference['dir'])}/8" \
        in capsys.readouterr().out
    # The training run's record is kept.
    assert (reference["dir"] / "hyperparameters.json").read_bytes() == config

    run_job(tmp_path / "eval", mode="eval", EVAL_INTERVAL_STEPS=1000,
            restore_dir=str(reference["dir"]), restore_step=4)
    assert calls[1][1] == 4


@pytest.mark.process
def test_eval_mode_without_a_checkpoint_says_where_it_looked(tmp_path):
    with pytest.raises(UserError, match=f"evaluates a checkpoint, and {ckpt_dir(tmp_path)} has "
                       f"none"):
        run_job(tmp_path, mode="eval", EVAL_INTERVAL_STEPS=1000)


# ----- preemption -----------------------------------------------------------------------------


@pytest.mark.process
def test_preemption_signal_saves_stops_and_resumes_exactly(tmp_path, reference, monkeypatch,
                                                           capsys):
    hook_input(monkeypatch, at=2, hook=lambda batch: os.kill(os.getpid(), signal.SIGUSR1)
               or batch)
    before = signal.getsignal(signal.SIGTERM)
    run_job(tmp_path, CHECKPOINT_EVERY_N_STEPS=0)
    out = capsys.readouterr().out
    stopped = checkpoints.latest_step(ckpt_dir(tmp_path))
    assert stopped is not None and stopped < 8  # the prefetcher reads ahead: >= 1
    assert f"step {stopped}: SIGUSR1 received; saving a checkpoint and stopping" in out
    assert f"checkpoint {ckpt_dir(tmp_path)}/{stopped} complete" in out
    assert signal.getsignal(signal.SIGTERM) is before  # handlers are put back
    monkeypatch.undo()
    run_job(tmp_path, CHECKPOINT_EVERY_N_STEPS=0)
    _, state = checkpoints.load_numpy(ckpt_dir(tmp_path))
    assert_bitwise_equal(state, reference["state"])


@pytest.mark.parametrize("name, expected", [("SIGUSR1", signal.SIGUSR1), ("usr2", signal.SIGUSR2),
                                            ("15", signal.SIGTERM), ("none", None), ("", None)])
def test_parse_signal(name, expected):
    assert preemption.parse_signal(name) == expected


def test_bad_preemption_signals_are_user_errors():
    with pytest.raises(UserError, match="--preemption_signal=SIGFOO: not a signal name"):
        preemption.parse_signal("SIGFOO")
    with pytest.raises(UserError, match="SIGKILL cannot be caught"):
        preemption.PreemptionWatcher("SIGKILL")


@pytest.mark.process
def test_metadata_is_json_a_person_can_read(reference):
    path = os.path.join(ckpt_dir(reference["dir"]), "8", "metadata", "metadata")
    with open(path) as f:
        metadata = json.load(f)
    assert metadata["experiment"] == "experiments.base.BaseExperiment"
    assert metadata["step"] == 8
    assert metadata["hyperparameters"]["ICI_MESH_SHAPE"] == [1, 8, 1]
