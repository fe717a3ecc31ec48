"""QK-norm (USE_QK_NORM, layers/qk_norm.py): each head's queries and keys RMS-normalised
before RoPE, as Qwen3 and Qwen3-MoE do. Hugging Face's Qwen3ForCausalLM and
Qwen3MoeForCausalLM (random weights far from their init, norm scales included) compute
the logits Paxloom computes from their import, with praxis's attentions and with the fused
ones; greedy decoding with the cache continues prompts as transformers' generate does; a
Paxloom model with QK-norm exports to those classes and back, bit for bit; a checkpoint
with and a run without QK-norm (or the reverse) are refused in one line; and LoRA on the
attention projections trains beside the norms."""

import jax
import numpy as np
import pytest
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from experiments.llama import LlamaBase
from layers import architecture, cached_lm, lora
from paxloom.core.errors import UserError
from paxloom.runner.state import hf_format
from paxloom.tools import import_hf
from tests.support.inference import praxis_logits
from tests.support.tiny import TINY
from tests.support.training import make_trainer, run_steps
from tests.test_import_hf import (
    ON_8_DEVICES,
    PROBE_SEQUENCES,
    SEQ_LEN,
    assert_export_round_trips,
    assert_imported_logits_equal,
    randomized,
    write_config,
)
from tests.test_moe_hf import (
    SHAPES,
    assert_greedy_decoding_continues_as_transformers,
)

pytestmark = pytest.mark.usefixtures("compilation_cache", "exact_matmuls")


def qwen3(num_kv_heads: int, head_dim: int):
    """SHAPES (2 layers, 64 wide, 4 query heads) with `num_kv_heads` key/value heads of
    `head_dim`, a dense feed-forward of width 96."""
    return randomized(Qwen3ForCausalLM(Qwen3Config(
        **{**SHAPES, "num_key_value_heads": num_kv_heads}, head_dim=head_dim,
        intermediate_size=96)))


def qwen3_moe(step: int = 1, experts: int = 8, normalize: bool = True, num_kv_heads: int = 2):
    """SHAPES with heads of 24 (not 64 / 4): the last of every `step` layers a mixture of
    `experts` of width 32, top-2, no shared expert; the others a dense feed-forward of
    width 96."""
    return randomized(Qwen3MoeForCausalLM(Qwen3MoeConfig(
        **{**SHAPES, "num_key_value_heads": num_kv_heads}, head_dim=24, intermediate_size=96,
        moe_intermediate_size=32, num_experts=experts, num_experts_per_tok=2,
        norm_topk_prob=normalize, decoder_sparse_step=step, router_aux_loss_coef=0.01)))


MODELS = {
    # As many key/value heads as query heads: DotProductAttention's combined projection.
    # Heads of 32 over a width of 64: praxis scales queries by (64 // 4) ** -0.5, and the
    # import folds the ratio into q_norm's scale (the norm would undo it on the weights);
    # the layers stacked for a scan.
    "qwen3_wide_heads_repeated": (lambda: qwen3(4, 32), dict(USE_REPEATED_LAYER=True)),
    # 4 query heads over 2 key/value heads, through the fused kernel's subclass
    # (layers/attention.py), which keeps the norm.
    "qwen3_gqa_fused": (lambda: qwen3(2, 16), dict(ATTENTION_IMPL="xla")),
    # One key/value head (praxis stores its projection as [D, H]), praxis's attention; no
    # tensor parallelism to split it over.
    "qwen3_mqa": (lambda: qwen3(1, 16), dict(ICI_MESH_SHAPE=[1, 8, 1])),
    # Every layer a mixture of 8 experts, renormalised top-2; on [1, 8, 1] the experts
    # split over the 8-way data axis.
    "qwen3_moe": (qwen3_moe, dict(ICI_MESH_SHAPE=[1, 8, 1])),
    # A dense layer, then a mixture of 4 experts (not renormalised); no grouping: the
    # combined projection, fused.
    "qwen3_moe_every_2nd_fused": (
        lambda: qwen3_moe(step=2, experts=4, normalize=False, num_kv_heads=4),
        dict(ATTENTION_IMPL="xla")),
}


@pytest.mark.parametrize("name", MODELS)
def test_paxloom_computes_the_logits_of_a_transformers_qwen3(name, tmp_path):
    make, overrides = MODELS[name]
    _, arch = assert_imported_logits_equal(make(), tmp_path, **overrides)
    assert arch.qk_norm == architecture.Norm("rms_norm", 1e-5, direct_scale=False, bias=False)


@pytest.mark.parametrize("name", ["qwen3_gqa_fused", "qwen3_moe"])
def test_cached_greedy_decoding_of_an_imported_qwen3_continues_as_transformers(name, tmp_path):
    make, overrides = MODELS[name]
    assert_greedy_decoding_continues_as_transformers(make(), tmp_path, **overrides)


# Paxloom models with QK-norm (TINY's shapes: 8 heads of 8), on the 8 devices.
PAXLOOM_MODELS = {
    # 8 query heads in 4 groups
    "dense_gqa": (dict(NUM_KV_HEADS=4), "Qwen3ForCausalLM"),
    # no grouping (the combined projection); a dense layer, then a mixture of 4 experts,
    # the block of two scanned twice
    "moe_every_2nd_repeated": (dict(
        NUM_LAYERS=4, NUM_KV_HEADS=8, NUM_EXPERTS=4, NUM_EXPERTS_PER_TOKEN=2,
        MOE_HIDDEN_DIMS=32, MOE_LAYER_INTERVAL=2, LOAD_BALANCING_WEIGHT=0.01,
        USE_REPEATED_LAYER=True), "Qwen3MoeForCausalLM"),
}


@pytest.mark.parametrize("name", PAXLOOM_MODELS)
def test_export_then_import_gives_back_the_parameters(name, tmp_path):
    overrides, target = PAXLOOM_MODELS[name]
    exp = LlamaBase(**{**TINY, **ON_8_DEVICES, **overrides, "USE_QK_NORM": True})
    assert_export_round_trips(exp, tmp_path, target, sequences=PROBE_SEQUENCES)


def test_the_config_maps_to_use_qk_norm_and_a_run_without_it_is_refused(tmp_path):
    qwen3(2, 16).save_pretrained(tmp_path / "qwen3")
    qwen3_moe().save_pretrained(tmp_path / "qwen3_moe")
    shapes = dict(NUM_LAYERS=2, MODEL_DIMS=64, NUM_HEADS=4, VOCAB_SIZE=256,
                  MAX_SEQ_LEN=SEQ_LEN, LAYERNORM_EPSILON=1e-5, NUM_KV_HEADS=2,
                  ROPE_MAX_WAVELENGTH=500.0, USE_QK_NORM=True, HIDDEN_DIMS=96)
    assert hf_format.hyperparameters(tmp_path / "qwen3") == ("llama", dict(
        shapes, DIMS_PER_HEAD=16))
    # no shared expert; router_aux_loss_coef over both mixture layers, per layer here
    assert hf_format.hyperparameters(tmp_path / "qwen3_moe") == ("llama", dict(
        shapes, DIMS_PER_HEAD=24, NUM_EXPERTS=8, NUM_EXPERTS_PER_TOKEN=2,
        MOE_HIDDEN_DIMS=32, MOE_LAYER_INTERVAL=1, MOE_RENORMALIZE=True,
        MOE_SHARED_HIDDEN_DIMS=0, MOE_SHARED_EXPERT_GATE=False, LOAD_BALANCING_WEIGHT=0.005))
    assert "--fdl.USE_QK_NORM=True" in import_hf.run_flags(str(tmp_path / "qwen3"))

    def run(path, **overrides):
        hyperparameters = {**hf_format.hyperparameters(path)[1], **overrides}
        return architecture.architecture_of(LlamaBase(**hyperparameters).model_template())

    with pytest.raises(UserError) as error:
        hf_format.check_config(tmp_path / "qwen3", run(tmp_path / "qwen3", USE_QK_NORM=False))
    assert str(error.value) == ("config.json (qwen3: q_norm, k_norm)=true differs from the "
                                "run's model (USE_QK_NORM=False); set --fdl.USE_QK_NORM=True")
    llama = write_config(tmp_path / "llama", **dict(
        model_type="llama", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
        max_position_embeddings=SEQ_LEN))
    with pytest.raises(UserError) as error:
        hf_format.check_config(llama, run(llama, USE_QK_NORM=True))
    assert str(error.value) == ("config.json has no query and key norms (q_norm, k_norm: a "
                                "Qwen3's), the run's model has USE_QK_NORM=True; set "
                                "--fdl.USE_QK_NORM=False")
    # a dense Qwen3 into a run with a mixture of experts
    with pytest.raises(UserError) as error:
        hf_format.check_config(tmp_path / "qwen3", run(
            tmp_path / "qwen3", NUM_EXPERTS=8))
    assert str(error.value) == ('config.json model_type="qwen3": the run\'s model is a mixture '
                                "of experts (Qwen3MoeForCausalLM); set --fdl.NUM_EXPERTS=0")


@pytest.mark.parametrize("config,message", [
    (dict(use_sliding_window=True),
     "config.json use_sliding_window=true: Paxloom's attention sees the whole context (no "
     "sliding window)"),
    (dict(attention_bias=True),
     "config.json attention_bias=true: Paxloom's Llama has no attention biases"),
], ids=["sliding_window", "attention_bias"])
def test_what_paxloom_does_not_model_is_refused_in_one_line(config, message, tmp_path):
    path = write_config(tmp_path, model_type="qwen3", num_hidden_layers=2, hidden_size=64,
                        intermediate_size=96, num_attention_heads=4, vocab_size=256,
                        max_position_embeddings=SEQ_LEN, **config)
    with pytest.raises(UserError) as error:
        hf_format.hyperparameters(path)
    assert str(error.value) == message


def test_qwen3_head_dim_defaults_to_transformers(tmp_path):
    """Qwen3Config's head_dim is 128 when config.json leaves it out, not width / heads."""
    path = write_config(tmp_path, model_type="qwen3", num_hidden_layers=2, hidden_size=64,
                        intermediate_size=96, num_attention_heads=4, vocab_size=256,
                        max_position_embeddings=SEQ_LEN)
    assert hf_format.hyperparameters(path)[1]["DIMS_PER_HEAD"] == 128 == Qwen3Config(
        hidden_size=64, num_attention_heads=4).head_dim


def test_lora_on_attention_trains_beside_the_norms_and_merges(tmp_path):
    """Adapters on the query, key, value and output projections of a grouped-query model
    with QK-norm: only they train (the norms stay), and the merged weights, decoded with
    the cache from canonical weights, give praxis's logits of the adapted model."""
    # No warmup: the first update already moves the adapters (as tests/test_lora.py).
    overrides = dict(ON_8_DEVICES, USE_QK_NORM=True, NUM_KV_HEADS=4, USE_LORA=True,
                     LORA_RANK=4, LORA_TARGET_LAYERS="attention", MAX_SEQ_LEN=32,
                     LR_COS_WARMUP=0, LR_COS_DECAY_START=0, LEARNING_RATE=1e-3)
    trainer = make_trainer(tmp_path, experiment=LlamaBase, **overrides)
    before = jax.device_get(trainer.init_state()["params"])
    losses, state = run_steps(trainer, 3)
    after = jax.device_get(state["params"])
    flat_before, flat_after = (
        {jax.tree_util.keystr(p, simple=True, separator="/"): v
         for p, v in jax.tree_util.tree_leaves_with_path(tree)} for tree in (before, after))
    attention = {name.split("self_attention/")[1] for name in flat_before
                 if "x_layers_0/self_attention/" in name}
    assert attention == {"q_norm/scale", "k_norm/scale", *(
        f"{p}/{w}" for p in ("query", "key", "value", "post") for w in ("w", *lora.ADAPTER_NAMES))}
    for name, old in flat_before.items():
        if name.endswith("lora_b"):
            assert np.any(flat_after[name] != old), f"{name} did not train"
        elif not lora.is_adapter(name):
            np.testing.assert_array_equal(flat_after[name], old, err_msg=f"{name} changed")
    assert all(np.isfinite(losses))

    arch = architecture.architecture_of(LlamaBase(**{**TINY, **overrides}).run_config().model)
    weights = architecture.canonical_weights(after, arch)
    sequence = [3, 1, 4, 1, 5, 9, 2, 6]
    want = praxis_logits(trainer, state["params"], [sequence])[0]
    cache = cached_lm.init_cache(arch, 1, len(sequence), np.float32)
    tokens = np.array([sequence], np.int32)
    hidden, _ = cached_lm.forward(arch, weights, tokens, np.arange(len(sequence))[None],
                                  cache, 0, np.zeros(1, np.int32))
    np.testing.assert_allclose(cached_lm.logits(weights, hidden[0]), want, rtol=1e-4,
                               atol=1e-4)
