"""Pipeline parallelism: a stage mesh axis, praxis's PipelinedTransformer, Pax's checks.

The pipelined model is checked against the plain one, an independent program (no
pipeline loop, no stage axis): from the same parameters (relaid by layers/layer_layout.py)
both train 5 steps on the same batches and must give the same losses. Each family (the Pax
GPT, the Llama-style model with grouped-query attention, a dropless mixture of experts, its
experts split over the data axis) runs on [2 stages, 2 data, 2 model] against the
unpipelined [4 data, 2 model].
"""

import importlib.util

import jax
import pytest

import experiments
from experiments.llama import LlamaTiny
from layers import layer_layout
from layers.stack import transformer_layer_template
from paxloom.core import spec
from paxloom.core.errors import UserError
from paxloom.runner.state import checkpoints
from tests.support.tiny import TINY
from tests.support.training import make_trainer, run_steps

STEPS = 5
# The learning rate moves the weights from step 2 on (step 1 runs at rate 0).
TRAIN = dict(PERCORE_BATCH_SIZE=1, LEARNING_RATE=3e-3, LR_COS_WARMUP=1, LR_COS_DECAY_START=1,
             LR_COS_DECAY_END=100)
PIPELINED = dict(ICI_MESH_SHAPE=[2, 1, 2, 2], NUM_MICROBATCHES=2)
PLAIN = dict(ICI_MESH_SHAPE=[1, 4, 2])


# Dropless experts in every layer, their router losses off: these are statistics of a
# (micro)batch, which the pipeline computes per microbatch (see the test below).
MIXTURE = dict(NUM_KV_HEADS=2, LAMBADA_EVAL=False, NUM_EXPERTS=4, NUM_EXPERTS_PER_TOKEN=2,
               MOE_HIDDEN_DIMS=32, LOAD_BALANCING_WEIGHT=0.0, ROUTER_Z_LOSS_WEIGHT=0.0)


@pytest.mark.parametrize("experiment, overrides", [
    (experiments.BaseExperiment, {}),
    (LlamaTiny, dict(NUM_KV_HEADS=2, LAMBADA_EVAL=False)),
    (LlamaTiny, MIXTURE),
    pytest.param(LlamaTiny, dict(MIXTURE, NUM_LAYERS=4, MOE_LAYER_INTERVAL=2,
                                 USE_REPEATED_LAYER=True), marks=pytest.mark.slow),
    # tokamax's grouped matmul under the stages' vmap (an optional extra).
    pytest.param(LlamaTiny, dict(MIXTURE, MOE_BACKEND="tokamax"), marks=[
        pytest.mark.slow, pytest.mark.skipif(not importlib.util.find_spec("tokamax"),
                                             reason="tokamax is not installed")]),
], ids=["gpt", "llama-gqa", "llama-moe", "llama-moe-every-2nd-repeated", "llama-moe-tokamax"])
def test_pipelined_run_trains_like_the_unpipelined_one(tmp_path, experiment, overrides):
    plain = make_trainer(tmp_path / "plain", experiment=experiment, **TRAIN, **overrides,
                         **PLAIN)
    pipelined = make_trainer(tmp_path / "pipelined", experiment=experiment, **TRAIN,
                             **overrides, **PIPELINED)
    assert pipelined.run.pipeline == spec.PipelineSpec(num_stages=2, num_microbatches=2)
    params = jax.device_get(plain.init_state()["params"])
    relaid = layer_layout.relayout_tree(params, layer_layout.of_model(plain.model),
                                        layer_layout.of_model(pipelined.model))
    # The stage dimension of every pipelined layer weight is split over the stage axis.
    stage_specs = {name: sharding.spec[0] for name, sharding in checkpoints.flat_params(
        pipelined.state_shardings["params"]).items() if "/pipeline/" in name}
    assert stage_specs and set(stage_specs.values()) == {"stage"}, stage_specs
    expected = run_steps(plain, STEPS, params)[0]
    got = run_steps(pipelined, STEPS, relaid)[0]
    print(f"{experiment.__name__}: pipelined {got} vs plain {expected}")
    assert got == pytest.approx(expected, rel=1e-4)
    # The weights moved: a pipeline that dropped the layers' updates would still match step 1.
    assert abs(expected[-1] - expected[0]) > 1e-3


@pytest.mark.slow  # four trainers: about 25 s
def test_router_losses_enter_the_pipelined_loss(tmp_path):
    """The experts' load-balancing loss, an aux loss of each mixture layer, enters the
    pipelined loss as it enters the plain one: the first step's loss rises by about the
    same amount (the pipeline averages it over microbatches, the plain run takes it over
    the batch)."""
    def rise(name, mesh):
        first = {weight: run_steps(make_trainer(
            tmp_path / f"{name}{weight}", experiment=LlamaTiny,
            **{**TRAIN, **MIXTURE, **mesh, "LOAD_BALANCING_WEIGHT": weight}), 1)[0][0]
            for weight in (0.0, 0.5)}
        return first[0.5] - first[0.0]

    plain, pipelined = rise("plain", PLAIN), rise("pipelined", PIPELINED)
    # 0.5 x 2 layers x a balance loss E * sum(f * p) near its minimum, k = 2
    assert plain > 1.5
    assert pipelined == pytest.approx(plain, rel=0.1)


def test_bubble_fraction_of_gpipe_and_the_circular_schedule():
    assert spec.PipelineSpec(num_stages=4, num_microbatches=8).bubble_fraction() == 3 / 11
    # Each stage holds 2 layer blocks: twice the work per microbatch for the same S-1 fill.
    assert spec.PipelineSpec(4, 8, circular_repeat=2).bubble_fraction() == 3 / 19
    assert spec.PipelineSpec(1, 8).bubble_fraction() == 0


@pytest.mark.parametrize("overrides, message", [
    (dict(NUM_LAYERS=3, ICI_MESH_SHAPE=[2, 1, 4, 1], NUM_MICROBATCHES=2),
     "NUM_LAYERS=3 does not split into 2 stages x CIRCULAR_REPEAT=1 blocks"),
    (dict(NUM_LAYERS=4, ICI_MESH_SHAPE=[2, 1, 4, 1], NUM_MICROBATCHES=2, CIRCULAR_REPEAT=4),
     "NUM_LAYERS=4 does not split into 2 stages x CIRCULAR_REPEAT=4 blocks"),
    (dict(ICI_MESH_SHAPE=[2, 1, 4, 1]), "needs exactly one of NUM_MICROBATCHES or "
                                        "MICROBATCH_SIZE"),
    (dict(ICI_MESH_SHAPE=[2, 1, 4, 1], NUM_MICROBATCHES=3),
     "NUM_MICROBATCHES=3 does not divide the batch of 8 sequences"),
    (dict(ICI_MESH_SHAPE=[2, 1, 4, 1], MICROBATCH_SIZE=3),
     "MICROBATCH_SIZE=3 does not divide the batch of 8 sequences"),
    (dict(ICI_MESH_SHAPE=[2, 1, 4, 1], NUM_MICROBATCHES=4),
     "NUM_MICROBATCHES=4 makes microbatches of 2 sequences, which do not split over the 4"),
    (dict(ICI_MESH_SHAPE=[2, 1, 4, 1], NUM_MICROBATCHES=2, NUM_STAGES=4),
     "NUM_STAGES=4, but the mesh has 2 stage(s)"),
    (dict(ICI_MESH_SHAPE=[2, 1, 1, 4], NUM_MICROBATCHES=1, CIRCULAR_REPEAT=2, NUM_LAYERS=4),
     "needs at least as many microbatches as stages: 1 < 2"),
    (dict(ICI_MESH_SHAPE=[2, 1, 2, 2, 1, 1]), "must be three positive sizes"),
], ids=["layers", "circular-layers", "no-microbatches", "microbatches", "microbatch-size",
        "microbatch-shards", "num-stages", "circular-microbatches", "six-axes"])
def test_bad_pipeline_settings_are_one_line(overrides, message):
    with pytest.raises(UserError) as info:
        experiments.BaseExperiment(**{**TINY, **overrides})
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_stage_axis_that_does_not_cover_the_devices_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"ICI_MESH_SHAPE=\[2, 1, 2, 1\] x DCN_MESH_SHAPE="
                                        r"\[1, 1, 1, 1\] covers 4 devices, but this job has 8"):
        make_trainer(tmp_path, ICI_MESH_SHAPE=[2, 1, 2, 1], NUM_MICROBATCHES=2)


def test_every_attention_implementation_runs_inside_the_pipeline(tmp_path):
    """The fused attention kernels (layers/attention.py) under the pipeline's vmap over
    stages: the same first loss as praxis's own attention (Pallas in interpret mode on the
    CPU; cuDNN needs a GPU)."""
    llama = dict(NUM_KV_HEADS=2, LAMBADA_EVAL=False, **TRAIN, **PIPELINED)
    first, kernels = {}, set()
    for impl in ("praxis", "xla", "pallas"):
        trainer = make_trainer(tmp_path / impl, experiment=LlamaTiny, ATTENTION_IMPL=impl,
                               **llama)
        layer = transformer_layer_template(trainer.model.lm_tpl.stacked_transformer_tpl)
        atten = layer.tr_atten_tpl
        kernels.add((atten.cls.__name__, getattr(atten, "attention_impl", "praxis")))
        first[impl] = run_steps(trainer, 1)[0][0]
    assert len(kernels) == 3, kernels  # three different attention programs ran
    assert first["xla"] == pytest.approx(first["praxis"], rel=1e-5), first
    assert first["pallas"] == pytest.approx(first["praxis"], rel=1e-5), first
