"""Pax's hyperparameter vocabulary: the names paxml's GPU configs (and the LM base classes
they inherit, c4.TransformerLmSpmdAdam over model_params.TransformerLmSpmdAdafactor) set are
declared, honoured as Pax does, or refused in one line."""

import math
import re

import jax
import pytest
from praxis import layers as praxis_layers
from praxis.layers import activations, attentions, embedding_softmax

import experiments
from experiments.base import BaseExperiment
from layers.stack import transformer_layer_template
from paxloom.core.errors import UserError
from paxloom.runner.state import checkpoints
from tests.support.tiny import TINY
from tests.support.training import make_trainer, run_steps

# The values of paxml/contrib/gpu/scripts_gpu/configs.py (GPT126M, GPT175B).
PAX_GPU_VALUES = dict(
    ACTIVATION_CLS=praxis_layers.GELU, USE_GATED_ACTIVATION=False, USE_BIAS=True,
    ATTEN_LOGIT_CAP=-1.0, SEPARATE_EMBEDDING=False, TRAINABLE_POSITION_EMB=True,
    TRAINABLE_PE_MAX_SEQ_LEN=TINY["MAX_SEQ_LEN"],  # GPT126M: = MAX_SEQ_LEN
    ADAM_EPSILON_ROOT=0.0, ADAM_CLIP_THRESHOLD=-1.0, LR_SCHEDULE="linear_rampup_cosine_decay",
    LR_COS_MAX=1.0,
    # paxml's LM base classes (model_params.TransformerLmSpmdAdafactor, c4.TransformerLmSpmdAdam)
    RELATIVE_BIAS=False, USE_ROTARY_POSITION_EMB=False, NORM_POLICY="pre", ENABLE_DCONV=False,
    COMBINE_QKV=True, DECAY_END=100000, TRAINING_OPTIMIZED_SHARDING=True, LR_LRED_WARMUP=4000,
    LR_LRED_DECAY_START=4001, LR_LRED_DECAY_END=300000, LR_LRED_MIN_RATIO=0.1, LR_LRED_MAX=1.0)


class PaxPorted(BaseExperiment):
    """A class as a user ports it from the Pax GPU configs (tiny sizes)."""

    ACTIVATION_CLS = praxis_layers.GELU
    USE_GATED_ACTIVATION = False
    USE_BIAS = True
    ATTEN_LOGIT_CAP = -1.0
    SEPARATE_EMBEDDING = False
    TRAINABLE_POSITION_EMB = True
    TRAINABLE_PE_MAX_SEQ_LEN = 64
    ADAM_EPSILON_ROOT = 0.0
    ADAM_CLIP_THRESHOLD = -1.0
    LR_SCHEDULE = "linear_rampup_cosine_decay"
    LR_COS_MAX = 1.0
    RELATIVE_BIAS = False
    USE_ROTARY_POSITION_EMB = False
    NORM_POLICY = "pre"
    ENABLE_DCONV = False
    COMBINE_QKV = True
    DECAY_END = 100000
    TRAINING_OPTIMIZED_SHARDING = True
    LR_LRED_WARMUP = 4000
    LR_LRED_DECAY_START = 4001
    LR_LRED_DECAY_END = 300000
    LR_LRED_MIN_RATIO = 0.1
    LR_LRED_MAX = 1.0


def _params(state) -> set[str]:
    return {checkpoints.param_path(p)
            for p, _ in jax.tree_util.tree_flatten_with_path(state["params"])[0]}


def test_a_class_ported_from_the_pax_gpu_configs_declares_and_trains(tmp_path):
    assert set(PAX_GPU_VALUES) <= set(BaseExperiment.hyperparameter_types())
    exp = PaxPorted(**TINY)
    assert exp.hyperparameters()["ACTIVATION_CLS"] == "GELU"  # as --fdl.ACTIVATION_CLS takes it
    # The GPU values are the defaults: the same model and optimizer as before these names.
    plain = BaseExperiment(**TINY).run_config()
    assert exp.run_config().model == plain.model
    assert exp.run_config().optimizer == plain.optimizer
    losses, _ = run_steps(make_trainer(tmp_path, experiment=PaxPorted), 2)
    assert all(math.isfinite(x) for x in losses)


def test_honoured_names_change_the_model_and_optimizer_as_pax_would(tmp_path):
    changed = dict(ATTEN_LOGIT_CAP=50.0, USE_GATED_ACTIVATION=True, ACTIVATION_CLS="silu",
                   USE_BIAS=False, SEPARATE_EMBEDDING=True, TRAINABLE_POSITION_EMB=False,
                   ADAM_CLIP_THRESHOLD=1.0, ADAM_EPSILON_ROOT=1e-12, LR_COS_MAX=0.5,
                   COMBINE_QKV=False, SOFTMAX_CAP_LOGITS=30.0)
    config = BaseExperiment(**TINY, **changed).run_config()
    lm = config.model.lm_tpl
    layer = transformer_layer_template(lm.stacked_transformer_tpl)
    assert layer.tr_atten_tpl.atten_logit_cap == 50.0
    assert layer.tr_atten_tpl.cls is attentions.DotProductAttention  # no fused kernel caps
    assert layer.tr_atten_tpl.use_bias is False
    assert layer.tr_atten_tpl.combine_qkv is False
    assert lm.softmax_tpl.soft_cap_logits == 30.0
    assert layer.tr_fflayer_tpl.use_gated_activation is True
    assert layer.tr_fflayer_tpl.activation_tpl.cls is activations.SiLU
    assert lm.separate_embedding_tpl.cls is embedding_softmax.Embedding
    assert issubclass(lm.softmax_tpl.cls, embedding_softmax.FullSoftmax)
    assert lm.position_emb_tpl.cls is embedding_softmax.PositionalEmbedding
    assert config.learning_rate.peak == 0.5
    assert config.optimizer.clip_threshold == 1.0 and config.optimizer.epsilon_root == 1e-12

    trainer = make_trainer(tmp_path, **changed)
    losses, state = run_steps(trainer, 2)
    assert all(math.isfinite(x) for x in losses)
    names = _params(state)
    assert any(n.endswith("ff_layer/ffn_layer1_gate/linear/w") for n in names), names
    assert not any("self_attention" in n and n.endswith("/b") for n in names)
    assert any("embedding_lookup" in n for n in names) and not any("position_emb" in n
                                                                  for n in names)


def test_pile5b_and_pile175b_resolve_as_paxml_registers_them():
    for name, legacy in (("Pile5B", "GPT5B"), ("Pile175B", "GPT175B")):
        cls = experiments.resolve(f"experiments.{name}")
        assert experiments.resolve(f"paxml.contrib.gpu.scripts_gpu.configs.{name}") is cls
        assert issubclass(cls, experiments.resolve(f"experiments.{legacy}"))
        assert cls().hyperparameters() == experiments.resolve(f"experiments.{legacy}")()\
            .hyperparameters()


@pytest.mark.parametrize("overrides,message", [
    (dict(LR_SCHEDULE="linear_rampup_exponential_decay"),
     "LR_SCHEDULE='linear_rampup_exponential_decay': Paxloom has only"),
    (dict(ADAM_CLIP_THRESHOLD=0.0), "ADAM_CLIP_THRESHOLD=0: paxml reads 0 as its default 1.0"),
    (dict(ATTEN_LOGIT_CAP=50.0, ATTENTION_IMPL="xla"),
     "ATTEN_LOGIT_CAP=50.0: ATTENTION_IMPL='xla' has no attention logit cap"),
    (dict(TRAINABLE_PE_MAX_SEQ_LEN=32), "TRAINABLE_PE_MAX_SEQ_LEN=32 is shorter than MAX_SEQ"),
    (dict(ACTIVATION_CLS="gelo"), "ACTIVATION_CLS='gelo' is not a praxis activation (did you"),
    (dict(ACTIVATION_CLS=int), "ACTIVATION_CLS=<class 'int'> is not a subclass of praxis"),
    (dict(LR_COS_MAX=0.0), "LR_COS_MAX=0.0 must be a positive multiplier"),
    (dict(LR_LRED_WARMUP=500), r"LR_LRED_WARMUP=500: LR_LRED_\* configure Pax's exponential-decay"),
    (dict(LR_LRED_MIN_RATIO=0.2), r"LR_LRED_MIN_RATIO=0.2: LR_LRED_\* configure Pax's"),
    (dict(DECAY_END=5000), "DECAY_END=5000: DECAY_END ends Pax's exponential-decay schedule"),
    (dict(RELATIVE_BIAS=True), "RELATIVE_BIAS=True: praxis's RelativeBias"),
    (dict(USE_ROTARY_POSITION_EMB=True), "USE_ROTARY_POSITION_EMB=True: the GPT's positions"),
    (dict(NORM_POLICY="post"), "NORM_POLICY='post': Paxloom's models are pre-norm only"),
    (dict(ENABLE_DCONV=True), "ENABLE_DCONV=True: Primer's depthwise convolutions"),
    (dict(TRAINING_OPTIMIZED_SHARDING=False),
     "TRAINING_OPTIMIZED_SHARDING=False: Paxloom always shards for training"),
    (dict(SOFTMAX_CAP_LOGITS=-1.0), "SOFTMAX_CAP_LOGITS=-1.0 must be > 0"),
])
def test_each_refused_value_is_one_line(overrides, message):
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(").replace(
            "[", r"\[")) as info:
        BaseExperiment(**TINY, **overrides)
    assert "\n" not in str(info.value)


def test_a_llama_refuses_the_gpt_architecture_names():
    llama = experiments.resolve("experiments.LlamaTiny")
    with pytest.raises(UserError, match="^USE_BIAS=False: LlamaTiny's model_template builds "
                                        "its own layers") as info:
        llama(USE_BIAS=False)
    assert "\n" not in str(info.value)
    for overrides, message in ((dict(COMBINE_QKV=False), "COMBINE_QKV=False: LlamaTiny's"),
                               (dict(USE_ROTARY_POSITION_EMB=False),
                                "USE_ROTARY_POSITION_EMB=False: LlamaTiny's layers")):
        with pytest.raises(UserError, match="^" + message) as info:
            llama(**overrides)
        assert "\n" not in str(info.value)
    llama()  # its defaults are fine


def test_paxs_typo_r_cos_min_ratio_is_accepted_with_a_note(capsys):
    """paxml's GPT126MBase sets R_COS_MIN_RATIO = 0.1, which Pax never reads: a class copied
    from it runs, with a one-line note, and its minimum ratio stays LR_COS_MIN_RATIO's."""
    ported = type("Ported", (BaseExperiment,), {"R_COS_MIN_RATIO": 0.5, "LR_COS_MIN_RATIO": 0.2})
    note = capsys.readouterr().err.strip().splitlines()
    assert len(note) == 1 and re.match(r"note: .*Ported sets R_COS_MIN_RATIO: a typo in "
                                       r"paxml's GPU configs .*set LR_COS_MIN_RATIO", note[0])
    exp = ported(**TINY)
    assert "R_COS_MIN_RATIO" not in exp.hyperparameters()
    assert exp.run_config().learning_rate.min_ratio == 0.2
