"""The Llama-style family, added through the model seam: sharded training on two meshes,
checkpoints, resume and evaluation (Pile loss and Lambada) like the GPT."""

import re

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import experiments
from experiments.llama import LlamaBase
from paxloom.core.errors import UserError
from paxloom.launch import job
from tests.support.training import make_trainer, train_losses

pytestmark = pytest.mark.usefixtures("compilation_cache")

LLAMA = dict(NUM_KV_HEADS=4)  # with tests.support.tiny.TINY: 8 query heads in 4 key/value groups


@pytest.fixture(scope="module")
def single_device_losses(tmp_path_factory):
    trainer = make_trainer(tmp_path_factory.mktemp("one"), devices=jax.devices()[:1],
                           experiment=LlamaBase, ICI_MESH_SHAPE=[1, 1, 1], PERCORE_BATCH_SIZE=8,
                           **LLAMA)
    return train_losses(trainer, 5)


@pytest.mark.parametrize("ici", [[2, 2, 2], pytest.param([1, 2, 4], marks=pytest.mark.slow)])
def test_llama_trains_sharded_like_one_device(ici, tmp_path, single_device_losses):
    trainer = make_trainer(tmp_path, experiment=LlamaBase, ICI_MESH_SHAPE=ici,
                           PERCORE_BATCH_SIZE=1, **LLAMA)
    specs = jax.tree_util.tree_map(lambda s: s.spec, trainer.state_shardings["params"])
    lm = specs["lm"]
    layer = lm["transformer"]["x_layers_0"]
    for name in ("query", "key", "value", "post"):  # [D, heads, H]
        assert layer["self_attention"][name]["w"] == P("data", "mdl", None), name
    for name in ("ffn_layer1", "ffn_layer1_gate"):  # [D, F]
        assert layer["ff_layer"][name]["linear"]["w"] == P("data", "mdl"), name
    assert layer["ff_layer"]["ffn_layer2"]["linear"]["w"] == P("mdl", "data")
    assert lm["embedding_lookup"]["emb_var"] == P("data", "mdl")  # [V, D]
    assert lm["softmax"]["logits_ffn"]["linear"]["w"] == P("data", "mdl")  # [D, V], untied
    key = trainer.abstract_state["params"]["lm"]["transformer"]["x_layers_0"]["self_attention"][
        "key"]["w"]
    assert key.shape == (64, 4, 8)
    assert key.sharding.shard_shape(key.shape) == (64 // ici[1], 4 // ici[2], 8)

    losses = train_losses(trainer, 5)
    np.testing.assert_allclose(losses, single_device_losses, rtol=1e-4)


def test_llama_learns(tmp_path):
    trainer = make_trainer(tmp_path, experiment=LlamaBase, ICI_MESH_SHAPE=[2, 2, 2],
                           PERCORE_BATCH_SIZE=2, LEARNING_RATE=3e-3, LR_COS_WARMUP=10,
                           LR_COS_DECAY_START=10, LR_COS_DECAY_END=100, **LLAMA)
    losses = train_losses(trainer, 60)
    assert np.mean(losses[-5:]) < 0.7 * losses[0], losses[::10]


@pytest.mark.slow  # resuming is the same code for every family (tests/test_checkpoints.py)
def test_llama_checkpoints_resumes_and_evaluates(tmp_path, capsys):
    tiny = experiments.resolve("experiments.LlamaTiny")
    settings = dict(NUM_LAYERS=2, MAX_SEQ_LEN=64, PERCORE_BATCH_SIZE=1, SUMMARY_INTERVAL_STEPS=1,
                    CHECKPOINT_EVERY_N_STEPS=3, EVAL_INTERVAL_STEPS=6, LAMBADA_MAX_EXAMPLES=16,
                    EVAL_BATCHES=2)
    job.run(tiny(**settings, MAX_STEPS=3), job.RunOptions(mode="train", job_log_dir=str(tmp_path)))
    job.run(tiny(**settings, MAX_STEPS=6), job.RunOptions(mode="train", job_log_dir=str(tmp_path)))
    out = capsys.readouterr().out
    assert re.search(r"restored step 3 from .*/checkpoints/3", out)
    assert "step      6 | eval pile_val | loss" in out
    assert "step      6 | eval lambada | accuracy" in out

    uninterrupted = tmp_path / "whole"
    job.run(tiny(**settings, MAX_STEPS=6), job.RunOptions(mode="train", job_log_dir=str(uninterrupted)))
    resumed_losses = re.findall(r"^step +[456] \| loss ([\d.]+)", out, re.M)
    whole_losses = re.findall(r"^step +[456] \| loss ([\d.]+)", capsys.readouterr().out, re.M)
    assert resumed_losses == whole_losses and len(whole_losses) == 3

    results = job.run(tiny(**settings, MAX_STEPS=6), job.RunOptions(mode="eval", job_log_dir=str(tmp_path)))
    assert set(results) == {"pile_val", "lambada"}
    assert (tmp_path / "lambada_predictions.jsonl").exists()


def test_llama_refuses_heads_that_do_not_group():
    with pytest.raises(UserError, match="NUM_HEADS=8 must be a multiple of NUM_KV_HEADS=3"):
        LlamaBase(NUM_HEADS=8, NUM_KV_HEADS=3)
    with pytest.raises(UserError, match="NUM_KV_HEADS=2 does not split over the 4-way"):
        LlamaBase(NUM_HEADS=8, NUM_KV_HEADS=2, ICI_MESH_SHAPE=[1, 2, 4])
    with pytest.raises(UserError, match="use 'save_qkv_out_proj_separate'"):
        LlamaBase(NUM_HEADS=8, NUM_KV_HEADS=2, CHECKPOINT_POLICY="save_qkv_out_proj")
