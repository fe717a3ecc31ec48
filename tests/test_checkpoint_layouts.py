"""Checkpoints across layer layouts: a pipelined run's checkpoint restores into a plain
model (and a plain run's into a pipelined one) with the same parameters, Adam moments,
step and input position, placed in the restoring run's shardings; a layout that cannot be
mapped is refused in one line naming both; decoding reads a pipelined run's checkpoint."""

import jax
import numpy as np
import pytest

import experiments
from layers import layer_layout as ll
from paxloom.core.errors import UserError
from paxloom.launch import decode as launch_decode
from paxloom.runner.inference import decode
from paxloom.runner.inference import model as inference
from paxloom.runner.state import checkpoints
from tests.support.inference import greedy_reference, save_job
from tests.support.tiny import TINY
from tests.support.training import make_trainer

pytestmark = pytest.mark.usefixtures("compilation_cache")

# The learning rate moves the weights from step 2 on.
COMMON = dict(NUM_LAYERS=4, PERCORE_BATCH_SIZE=1, LEARNING_RATE=3e-3, LR_COS_WARMUP=1,
              LR_COS_DECAY_START=1, LR_COS_DECAY_END=100)
SAVED_AT, MORE = 2, 3  # the pipelined run saves at step 2 and trains to step 5
PIPELINED = dict(COMMON, ICI_MESH_SHAPE=[2, 1, 2, 2], NUM_MICROBATCHES=2)  # 2 stages x 2
PLAIN = dict(COMMON, ICI_MESH_SHAPE=[1, 4, 2])
# 2 circular repeats x 2 stages x 1 repeated layer
CIRCULAR = dict(COMMON, ICI_MESH_SHAPE=[2, 1, 4, 1], NUM_MICROBATCHES=2, CIRCULAR_REPEAT=2,
                USE_REPEATED_LAYER=True)


def train_and_save(tmp_path, name, steps, more=1, **overrides):
    """(trainer, checkpoint directory, host state after `steps` steps, input state, the
    losses of every step) of a run that saved at `steps` and trained `more` steps on."""
    trainer = make_trainer(tmp_path / name, **overrides)
    state, data = trainer.init_state(), trainer.make_train_input()
    losses = []
    directory = str(tmp_path / name / "checkpoints")
    with checkpoints.Checkpointer(directory, metadata={}, every_n_steps=0,
                                  max_to_keep=0) as saver:
        for step in range(1, steps + more + 1):
            with jax.set_mesh(trainer.mesh):
                state, metrics = trainer.train_step(state, trainer.to_device(data.next_batch()))
            losses.append(float(metrics["loss"]))
            if step == steps:
                saver.save(step, state, data.get_state(), final=True)
                saved, input_state = jax.device_get(state), data.get_state()
    return trainer, directory, saved, input_state, losses


def layout_of(state) -> ll.StackLayout:
    return ll.from_shapes(checkpoints.flat_params(state["params"]))


def assert_equal_trees(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def pipelined_run(tmp_path_factory):
    return train_and_save(tmp_path_factory.mktemp("layouts"), "pipelined", SAVED_AT, MORE,
                          **PIPELINED)


def test_a_pipelined_checkpoint_resumes_in_a_plain_model(tmp_path, pipelined_run):
    _, directory, saved, input_state, losses = pipelined_run
    assert str(layout_of(saved)) == "4 layers as 2 stages x 2"
    plain = make_trainer(tmp_path, **PLAIN)
    restored = checkpoints.restore(directory, None, plain.abstract_state)
    assert restored.step == SAVED_AT and restored.input_state == input_state
    want = ll.relayout_tree(saved, layout_of(saved), ll.StackLayout(4))
    assert_equal_trees(jax.device_get(restored.state), want)  # params, moments and step
    assert jax.tree_util.tree_map(lambda a: a.sharding, restored.state) == plain.state_shardings
    # The plain model continues to the losses of the uninterrupted pipelined run.
    data = plain.make_train_input()
    data.set_state(restored.input_state)
    state, resumed = restored.state, []
    for _ in range(MORE):
        with jax.set_mesh(plain.mesh):
            state, metrics = plain.train_step(state, plain.to_device(data.next_batch()))
        resumed.append(float(metrics["loss"]))
    np.testing.assert_allclose(resumed, losses[SAVED_AT:], rtol=1e-4)
    assert abs(losses[-1] - losses[SAVED_AT]) > 1e-3  # the weights moved meanwhile
    # Evaluation reads the parameters only.
    params_only = checkpoints.restore(directory, None, plain.abstract_state, params_only=True)
    assert_equal_trees(jax.device_get(params_only.state), {"params": want["params"]})


@pytest.mark.slow  # the pipelined -> plain resume above runs in make test
def test_a_plain_checkpoint_restores_into_a_circular_pipeline(tmp_path):
    _, directory, saved, _, _ = train_and_save(tmp_path, "plain", 1, **PLAIN)
    circular = make_trainer(tmp_path / "circular", **CIRCULAR)
    target = ll.from_shapes(checkpoints.flat_params(circular.abstract_state["params"]))
    assert str(target) == "4 layers as 2 circular repeats x 2 stages x 1 repeated"
    restored = checkpoints.restore(directory, None, circular.abstract_state)
    assert_equal_trees(jax.device_get(restored.state),
                       ll.relayout_tree(saved, ll.StackLayout(4), target))
    assert jax.tree_util.tree_map(lambda a: a.sharding, restored.state) == \
        circular.state_shardings
    # CHECKPOINT_RESTORE_PATH's reader relays too.
    relaid = checkpoints.relaid_params(directory, 1, circular.abstract_state["params"])
    assert_equal_trees(relaid, checkpoints.flat_params(
        ll.relayout_tree(saved, ll.StackLayout(4), target)["params"]))


def test_a_checkpoint_of_another_depth_is_refused_in_one_line_naming_both(tmp_path,
                                                                          pipelined_run):
    _, directory, *_ = pipelined_run
    deeper = make_trainer(tmp_path, **dict(PLAIN, NUM_LAYERS=6))
    with pytest.raises(UserError) as error:
        checkpoints.restore(directory, None, deeper.abstract_state)
    message = str(error.value)
    assert "\n" not in message
    assert "holds 4 layers as 2 stages x 2; this model has 6 layers" in message


def test_decoding_a_pipelined_run_equals_praxis_pipelined_forward_pass(tmp_path):
    exp = experiments.BaseExperiment(**{**TINY, **PIPELINED})
    params, trainer = save_job(tmp_path, exp)
    model = inference.load(exp.run_config(), str(tmp_path), what="test")
    assert model.arch.layout == ll.StackLayout(4)  # read unpipelined
    prompts = ["5 6 7", "100 3 400 17 9 23 250 11"]
    records = launch_decode.run(exp, exp.run_config(), decode.DecodeOptions(
        job_log_dir=str(tmp_path), prompts=prompts, max_decode_steps=6))
    expected = greedy_reference(trainer, params, [[int(t) for t in p.split()] for p in prompts],
                                steps=6)
    assert [[int(t) for t in r["continuation"].split()] for r in records] == expected
