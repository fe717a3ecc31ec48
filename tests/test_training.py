"""Sharded training on 8 fake CPU devices: layouts, equivalence, one compile, learning."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests.support.training import make_trainer, train_losses

MESHES = [[8, 1, 1], [1, 8, 1], [1, 1, 8], [2, 2, 2]]


@pytest.fixture(scope="module")
def single_device_losses(tmp_path_factory):
    trainer = make_trainer(tmp_path_factory.mktemp("one"), devices=jax.devices()[:1],
                           ICI_MESH_SHAPE=[1, 1, 1], PERCORE_BATCH_SIZE=8)
    return train_losses(trainer, 5)


def _spec(state, *path):
    node = state["params"]
    for key in path:
        node = node[key]
    return node.sharding.spec, node


@pytest.mark.parametrize("ici", MESHES)
def test_sharding_and_losses_match_one_device(ici, tmp_path, single_device_losses):
    trainer = make_trainer(tmp_path, ICI_MESH_SHAPE=ici, PERCORE_BATCH_SIZE=1)
    state = trainer.init_state()
    layer = ("lm", "transformer", "x_layers_0")
    ffn_spec, ffn = _spec(state, *layer, "ff_layer", "ffn_layer1", "linear", "w")  # [D, F]
    qkv_spec, _ = _spec(state, *layer, "self_attention", "combined_qkv", "w")  # [3, D, N, H]
    emb_spec, _ = _spec(state, "lm", "softmax", "logits_ffn", "linear", "w")  # [D, V], tied
    # Weights live on (data, mdl) and are replicated over replica (praxis annotations).
    assert ffn_spec == P("data", "mdl")
    assert qkv_spec == P(None, "data", "mdl", None)
    assert emb_spec == P("data", "mdl")
    data, mdl = ici[1], ici[2]
    shard_shape = ffn.addressable_shards[0].data.shape
    assert shard_shape == (64 // data, 256 // mdl)
    # Adam moments are laid out like their parameter.
    mu = state["opt_state"][1][0].mu["lm"]["transformer"]["x_layers_0"]["ff_layer"]
    assert mu["ffn_layer1"]["linear"]["w"].sharding.spec == P("data", "mdl")

    losses = train_losses(trainer, 5)
    np.testing.assert_allclose(losses, single_device_losses, rtol=1e-4)


def test_train_step_compiles_once_over_ten_steps(tmp_path):
    trainer = make_trainer(tmp_path, ICI_MESH_SHAPE=[2, 2, 2], PERCORE_BATCH_SIZE=1)
    train_losses(trainer, 10)
    assert trainer.train_step._cache_size() == 1


def test_repeated_layers_train_like_stacked(tmp_path):
    fast = dict(ICI_MESH_SHAPE=[1, 8, 1], LEARNING_RATE=3e-3, LR_COS_WARMUP=1,
                LR_COS_DECAY_START=1, LR_COS_DECAY_END=100)
    stacked = train_losses(make_trainer(tmp_path / "s", **fast), 12)
    repeated = train_losses(make_trainer(tmp_path / "r", USE_REPEATED_LAYER=True, **fast), 12)
    # Same maths, different parameter layout (one stacked [L, ...] array per weight,
    # so different random draws): the trajectories agree closely, and both learn.
    np.testing.assert_allclose(repeated, stacked, rtol=0.01)
    assert repeated[-1] < repeated[0] - 0.3


def test_bfloat16_compute_keeps_float32_parameters(tmp_path):
    trainer = make_trainer(tmp_path, ICI_MESH_SHAPE=[1, 8, 1], FPROP_DTYPE="bfloat16",
                           USE_REPEATED_LAYER=True)
    losses = train_losses(trainer, 2)
    assert all(np.isfinite(losses))
    params = trainer.abstract_state["params"]
    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(params)} == {np.dtype("float32")}


def test_loss_falls_by_30_percent_in_100_steps(tmp_path):
    trainer = make_trainer(tmp_path, ICI_MESH_SHAPE=[2, 2, 2], PERCORE_BATCH_SIZE=2,
                           LEARNING_RATE=3e-3, LR_COS_WARMUP=10, LR_COS_DECAY_START=10,
                           LR_COS_DECAY_END=100)
    losses = train_losses(trainer, 100)
    assert np.mean(losses[-5:]) < 0.7 * losses[0], losses[::10]
