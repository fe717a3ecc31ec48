"""GRADIENT_ACCUMULATION_STEPS: K sub-batches per update give the K = 1 update, in less
memory, with a dropout key of their own; a batch that does not split is one line."""

import jax
import numpy as np
import pytest

import experiments
from paxloom.core.errors import UserError
from paxloom.launch import record
from paxloom.runner.training import accumulation
from tests.support.processes import assert_one_line, run_main
from tests.support.training import make_trainer
from tests.test_bad_inputs import TINY_FLAGS

pytestmark = pytest.mark.usefixtures("compilation_cache")

K = 4
# 32 sequences on 8 data-parallel shards: 4 rows per device, one of each sub-batch.
SPLIT = dict(ICI_MESH_SHAPE=[1, 8, 1], PERCORE_BATCH_SIZE=4, LEARNING_RATE=1e-2)


def unequal_weights(batch: dict) -> dict:
    """Sub-batch k (rows k, K+k, ...) weighs the first (k+1)/K of each row's tokens, so the
    sub-batches' token weights are 1:2:3:4 and a plain mean of their means is wrong."""
    weights = np.array(batch["weights"])
    seq_len = weights.shape[1]
    for row in range(weights.shape[0]):
        weights[row, seq_len * (row % K + 1) // K:] = 0
    return {**batch, "weights": weights}


def run_weighted_steps(trainer, steps: int):
    state, data, losses = trainer.init_state(), trainer.make_train_input(), []
    for _ in range(steps):
        batch = trainer.to_device(unequal_weights(data.next_batch()))
        with jax.set_mesh(trainer.mesh):
            state, metrics = trainer.train_step(state, batch)
        losses.append(float(metrics["loss"]))
    return losses, jax.tree_util.tree_map(np.array, jax.device_get(state["params"]))


def test_accumulated_update_equals_one_pass(tmp_path):
    one_losses, one_params = run_weighted_steps(make_trainer(tmp_path, **SPLIT), 5)
    trainer = make_trainer(tmp_path, GRADIENT_ACCUMULATION_STEPS=K, **SPLIT)
    assert trainer.accumulation_steps == K
    losses, params = run_weighted_steps(trainer, 5)
    np.testing.assert_allclose(losses, one_losses, rtol=1e-5)
    assert losses[-1] < losses[0] - 0.1  # it trains: the comparison is not of constants
    for layer in ("x_layers_0", "x_layers_1"):
        # The key bias's gradient is zero in exact arithmetic (softmax ignores a shift of
        # all its logits), so it is rounding noise, which Adam scales to full-size steps.
        for tree in (params, one_params):
            tree["lm"]["transformer"][layer]["self_attention"]["combined_qkv"]["b"][1] = 0
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                           params, one_params)


def temp_bytes(trainer) -> int:
    batch = {k: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=trainer.data_sharding)
             for k, s in trainer.batch_shapes.items()}
    with jax.set_mesh(trainer.mesh):
        compiled = trainer.train_step.lower(trainer.abstract_state, batch).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_sub_batches_need_less_memory(tmp_path):
    shape = dict(ICI_MESH_SHAPE=[1, 8, 1], PERCORE_BATCH_SIZE=8)
    one = temp_bytes(make_trainer(tmp_path, **shape))
    accumulated = temp_bytes(make_trainer(tmp_path, GRADIENT_ACCUMULATION_STEPS=K, **shape))
    assert accumulated < 0.6 * one, (accumulated, one)


@pytest.mark.process
def test_batch_that_does_not_split_is_one_line(tmp_path):
    # 8 sequences on 8 shards cannot make 3 sub-batches.
    with pytest.raises(UserError) as info:
        make_trainer(tmp_path, ICI_MESH_SHAPE=[1, 8, 1], GRADIENT_ACCUMULATION_STEPS=3)
    message = str(info.value)
    assert "\n" not in message
    assert "GRADIENT_ACCUMULATION_STEPS=3" in message and "PERCORE_BATCH_SIZE=1 " in message
    assert "--fdl.PERCORE_BATCH_SIZE=3 or --fdl.GRADIENT_ACCUMULATION_STEPS=1" in message
    with pytest.raises(UserError, match="GRADIENT_ACCUMULATION_STEPS=0 must be >= 1"):
        experiments.BaseExperiment(GRADIENT_ACCUMULATION_STEPS=0).validate()
    out = run_main("--fdl_config=experiments.base.BaseExperiment", *TINY_FLAGS,
                   "--fdl.GRADIENT_ACCUMULATION_STEPS=3", f"--job_log_dir={tmp_path / 'job'}")
    assert_one_line(out, "GRADIENT_ACCUMULATION_STEPS=3 does not split GLOBAL_BATCH_SIZE=8")
    exp = experiments.BaseExperiment(PERCORE_BATCH_SIZE=2, GRADIENT_ACCUMULATION_STEPS=4)
    assert ("global batch = PERCORE_BATCH_SIZE 2 x 8 devices = 16 sequences per optimizer "
            "update, run as GRADIENT_ACCUMULATION_STEPS = 4 sub-batches of 4"
            ) in record.config_report(exp, exp.run_config())


def sub_batch_losses(tmp_path, dropout: float) -> np.ndarray:
    """The K sub-batch losses of a global batch whose sub-batches hold the same rows."""
    trainer = make_trainer(tmp_path, DROPOUT_PROB=dropout, GRADIENT_ACCUMULATION_STEPS=K,
                           **SPLIT)
    rows = trainer.make_train_input().next_batch()
    # Global row i*K + k is sub-batch k's row i: repeating each row K times gives every
    # sub-batch the same rows, in the same places on the devices.
    same = trainer.to_device({k: np.repeat(v[:trainer.global_batch_size // K], K, axis=0)
                              for k, v in rows.items()})
    state = trainer.init_state()

    def losses(params, batch):
        return accumulation.loss_and_grads(trainer._weighted_loss, params, batch,
                                           jax.random.key(0), K, trainer.mesh)[2]

    with jax.set_mesh(trainer.mesh):
        return np.asarray(jax.jit(losses)(state["params"], same))


def test_each_sub_batch_draws_its_own_dropout(tmp_path):
    without = sub_batch_losses(tmp_path, 0.0)
    np.testing.assert_allclose(without, without[0], rtol=1e-6)  # same rows, same loss
    with_dropout = sub_batch_losses(tmp_path, 0.5)
    # One key for all would give K equal losses again; K keys give K different ones.
    assert len(set(np.round(with_dropout, 6).tolist())) == K, with_dropout
    assert np.all(np.abs(with_dropout - without[0]) > 1e-5)  # dropout is really on
