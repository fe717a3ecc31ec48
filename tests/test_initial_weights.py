"""CHECKPOINT_RESTORE_PATH and CHECKPOINT_IGNORE_RULES: a new run's parameters from another
run's checkpoint (paxloom/runner/state/initial_weights.py), on another mesh, with Pax's rules.

Hugging Face and Pax sources are tested with their readers (test_import_hf.py,
test_pax_format.py); a restart after kill -9 is in test_checkpoints_process.py.
"""

import contextlib
import io
import re

import jax
import numpy as np
import pytest

import experiments
from paxloom.core.errors import UserError
from paxloom.core.spec import InitialWeights
from paxloom.launch import job
from paxloom.runner.state import checkpoints, initial_weights
from tests.support.files import tree_digest
from tests.support.tiny import TINY
from tests.support.training import make_trainer

pytestmark = pytest.mark.usefixtures("compilation_cache")

SOURCE = dict(TINY, ICI_MESH_SHAPE=[1, 8, 1], MAX_STEPS=3, SUMMARY_INTERVAL_STEPS=1)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A 3-step run: its job directory and its final parameters as numpy."""
    job_dir = tmp_path_factory.mktemp("source")
    with contextlib.redirect_stdout(io.StringIO()):
        job.run(experiments.BaseExperiment(**SOURCE), job.RunOptions(job_log_dir=str(job_dir)))
    step, state = checkpoints.load_numpy(checkpoints.job_checkpoint_dir(str(job_dir)))
    assert step == 3
    return job_dir, state["params"]


def flat(tree) -> dict:
    return {checkpoints.param_path(p): np.asarray(leaf)
            for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def load(trainer, path, rules=()):
    """(fresh state, parameters loaded from `path`) of `trainer`'s model."""
    fresh = trainer.init_state()
    params = initial_weights.load(InitialWeights(str(path), list(rules)), fresh["params"],
                                  trainer.abstract_state["params"], trainer.model_config)
    return fresh, params


def make_target(tmp_path, **overrides):
    trainer = make_trainer(tmp_path, **overrides)
    trainer.model_config = experiments.BaseExperiment(**{**TINY, **overrides}).run_config().model
    return trainer


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """Another mesh ([2,2,2], so every weight is laid out anew) and another seed."""
    return make_target(tmp_path_factory.mktemp("target"), ICI_MESH_SHAPE=[2, 2, 2],
                       RANDOM_SEED=99)


@pytest.mark.parametrize("where", ["job_log_dir", "checkpoints", "step"])
def test_every_parameter_comes_from_the_source_on_this_runs_mesh(source, target, where):
    job_dir, saved = source
    path = {"job_log_dir": job_dir, "checkpoints": job_dir / "checkpoints",
            "step": job_dir / "checkpoints" / "3"}[where]
    _, params = load(target, path)
    loaded, expected = flat(params), flat(saved)
    assert loaded.keys() == expected.keys()
    for name, value in expected.items():
        assert loaded[name].tobytes() == value.tobytes(), name
    for leaf, abstract in zip(jax.tree_util.tree_leaves(params),
                              jax.tree_util.tree_leaves(target.abstract_state["params"]),
                              strict=True):
        assert leaf.sharding == abstract.sharding


def test_ignore_rules_keep_the_fresh_initialisation_in_either_spelling(source, target):
    job_dir, saved = source
    # Pax's own example rule (every bias) and a Paxloom-spelt one (the final norm).
    fresh, params = load(target, job_dir, [r"^.*/b$", r"lm/final_ln/.*"])
    loaded, fresh, saved = flat(params), flat(fresh["params"]), flat(saved)
    kept = [n for n in loaded if n.endswith("/b") or n.startswith("lm/final_ln/")]
    assert len(kept) > 2
    for name in loaded:
        expected = fresh[name] if name in kept else saved[name]
        assert loaded[name].tobytes() == expected.tobytes(), name


def test_a_shape_mismatch_names_the_parameter_and_the_rule_that_skips_it(source, tmp_path):
    job_dir, saved = source
    trainer = make_target(tmp_path, ICI_MESH_SHAPE=[1, 8, 1], VOCAB_SIZE=256)
    with pytest.raises(UserError) as error:
        load(trainer, job_dir)
    message = str(error.value)
    assert "\n" not in message
    assert "lm/softmax/logits_ffn/linear/w with shape (64, 512), this model's is (64, 256)" \
        in message
    rule = message.split("CHECKPOINT_IGNORE_RULES='[\"")[1].split('"]')[0]
    fresh, params = load(trainer, job_dir, [rule])  # the suggested rule does skip it
    assert flat(params)["lm/softmax/logits_ffn/linear/w"].tobytes() == \
        flat(fresh["params"])["lm/softmax/logits_ffn/linear/w"].tobytes()
    assert flat(params)["lm/final_ln/scale"].tobytes() == flat(saved)["lm/final_ln/scale"].tobytes()


def test_a_missing_parameter_names_it_and_the_rule_that_skips_it(source, tmp_path):
    job_dir, saved = source
    trainer = make_target(tmp_path, ICI_MESH_SHAPE=[1, 8, 1], NUM_LAYERS=3)
    with pytest.raises(UserError, match=r"has no parameter lm/transformer/x_layers_2/\S+ .*"
                       r"IGNORE_RULES='\[\"\^lm/transformer/x_layers_2/"):
        load(trainer, job_dir)
    _, params = load(trainer, job_dir, [r"^lm/transformer/x_layers_2/"])  # a new layer
    loaded = flat(params)
    for name, value in flat(saved).items():  # the two layers the source has, and the rest
        assert loaded[name].tobytes() == value.tobytes(), name


@pytest.mark.parametrize("rules, path, message", [
    (["^nothing/.*"], None, "'^nothing/.*' matches no parameter of this model"),
    (["(unclosed"], None, "'(unclosed' is not a regular expression"),
    ([], "missing", "no such file or directory"),
    ([], "empty", "is neither a Paxloom run or checkpoint"),
])
def test_bad_sources_and_rules_are_one_line(source, target, tmp_path, rules, path, message):
    if path == "empty":
        (tmp_path / "empty").mkdir()
    path = source[0] if path is None else tmp_path / path
    with pytest.raises(UserError, match=re.escape(message)) as error:
        load(target, path, rules)
    assert "\n" not in str(error.value)


def test_a_run_starts_from_the_weights_with_a_fresh_optimizer_and_never_writes_the_source(
        source, tmp_path, capsys):
    job_dir, saved = source
    before = tree_digest(job_dir)
    exp = experiments.BaseExperiment(**{**SOURCE, "MAX_STEPS": 2,
                                        "CHECKPOINT_RESTORE_PATH": str(job_dir)})
    job.run(exp, job.RunOptions(job_log_dir=str(tmp_path / "new")))
    assert "initialised 28 of 28 parameters from checkpoint step 3 of" in capsys.readouterr().out
    step, state = checkpoints.load_numpy(checkpoints.job_checkpoint_dir(str(tmp_path / "new")))
    assert step == 2 and int(state["step"]) == 2
    # Adam's step count restarted: two updates, not the source's three plus two.
    counts = {int(leaf) for p, leaf in jax.tree_util.tree_flatten_with_path(state["opt_state"])[0]
              if checkpoints.param_path(p).endswith("count")}
    assert counts == {2}
    assert tree_digest(job_dir) == before
