"""Mixtures of experts (layers/moe.py) outside training: Hugging Face's Mixtral and
Qwen2-MoE into Paxloom and back (paxloom/runner/state/hf_format.py, paxloom/tools/export_hf.py), the
cached decoder (layers/cached_lm.py) on an imported mixture, and the layouts a mixture
every Nth layer stores its layers in (layers/layer_layout.py).

The real client's models (transformers, random weights far from its init) compute the
logits Paxloom computes from their import; a Paxloom mixture exported and imported gives
back its parameters, and exported again the same tensors; greedy decoding with the cache
continues prompts as transformers' generate does. What no Paxloom model reproduces
(praxis's GShard layer, a sliding window, another class's norms) is refused in one line.
Qwen3-MoE, with its QK-norm, is tests/test_qk_norm.py's."""


import jax
import numpy as np
import pytest
import torch
from praxis import pax_fiddle
from praxis.layers import transformers as praxis_transformers
from safetensors.numpy import load_file
from transformers import (
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
)

from experiments.llama import LlamaBase
from layers import architecture
from layers import layer_layout as ll
from paxloom.core.errors import UserError
from paxloom.runner.state import hf_format
from paxloom.tools import import_hf
from tests.support.inference import (
    assert_greedy_continuations_equal_transformers,
)
from tests.support.tiny import TINY
from tests.test_import_hf import (
    KNOWN,
    ON_8_DEVICES,
    PROBE_SEQUENCES,
    SEQ_LEN,
    assert_export_round_trips,
    assert_imported_logits_equal,
    key,
    paxloom,
    placed,
    randomized,
    write_config,
)

pytestmark = pytest.mark.usefixtures("compilation_cache", "exact_matmuls")

# The shapes every model here shares: 2 layers, 64 wide, 4 query heads over 2 key/value
# heads, with a RoPE base far from the default (an unmapped base shows).
SHAPES = dict(num_hidden_layers=2, hidden_size=64, vocab_size=256, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=SEQ_LEN, rms_norm_eps=1e-5,
              rope_parameters={"rope_type": "default", "rope_theta": 500.0},
              bos_token_id=0, eos_token_id=0, pad_token_id=0)


def mixtral(experts: int = 8, **config):
    """Every layer a mixture: `experts` of width 48, top-2, renormalised."""
    return randomized(MixtralForCausalLM(MixtralConfig(
        **SHAPES, intermediate_size=48, num_local_experts=experts, num_experts_per_tok=2,
        router_aux_loss_coef=0.02, **config)))


def qwen2_moe(step: int = 2, normalize: bool = False, qkv_bias: bool = False,
              layers: int = 2):
    """The last of every `step` layers a mixture (8 experts of width 24, top-2, a gated
    shared expert of width 40), the others a dense feed-forward of width 96; by default no
    q, k, v biases (Paxloom's Llama has none)."""
    return randomized(Qwen2MoeForCausalLM(Qwen2MoeConfig(
        **{**SHAPES, "num_hidden_layers": layers}, intermediate_size=96, moe_intermediate_size=24, num_experts=8,
        num_experts_per_tok=2, shared_expert_intermediate_size=40, decoder_sparse_step=step,
        norm_topk_prob=normalize, qkv_bias=qkv_bias, router_aux_loss_coef=0.01)))


MODELS = {
    "mixtral": (mixtral, {}),
    # 4 experts; one layer's weights stacked per repeat of a scan
    "mixtral_repeated": (lambda: mixtral(experts=4), dict(USE_REPEATED_LAYER=True)),
    # a dense layer, then a mixture: the scan repeats that block of two layers twice (the
    # order of layers in a scanned block, measured against transformers' order)
    "qwen2_moe_every_2nd_repeated": (lambda: qwen2_moe(layers=4), dict(USE_REPEATED_LAYER=True)),
    # every layer a mixture with renormalised top-2 weights (norm_topk_prob), per layer
    "qwen2_moe_renormalized": (lambda: qwen2_moe(step=1, normalize=True), {}),
}


@pytest.mark.parametrize("name", MODELS)
def test_paxloom_computes_the_logits_of_a_transformers_mixture(name, tmp_path):
    make, overrides = MODELS[name]
    # 8 rows of 32 tokens: 512 tokens, each routed to 2 of the experts, which the mesh's
    # data axis splits in two (expert parallelism, as training runs it).
    exp, arch = assert_imported_logits_equal(make(), tmp_path, **overrides)
    assert arch.experts.num_experts == exp.NUM_EXPERTS and arch.moe_layers == tuple(
        i for i in range(exp.NUM_LAYERS) if (i + 1) % exp.MOE_LAYER_INTERVAL == 0)


@pytest.mark.parametrize("make", [mixtral, qwen2_moe], ids=["mixtral", "qwen2_moe"])
def test_transformers_5s_fused_experts_read_as_one_linear_per_expert(make, tmp_path):
    hf_model = make()
    hf_model.save_pretrained(tmp_path / "per_expert")
    hf_model.save_pretrained(tmp_path / "fused", save_original_format=False)
    fused_names = load_file(str(tmp_path / "fused" / "model.safetensors")).keys()
    assert "model.layers.1.mlp.experts.gate_up_proj" in fused_names
    _, arch, _, _, like = paxloom(tmp_path / "per_expert")
    per_expert = hf_format.read_params(tmp_path / "per_expert", arch, like)
    fused = hf_format.read_params(tmp_path / "fused", arch, like)
    assert fused.keys() == per_expert.keys()
    for name, value in per_expert.items():
        np.testing.assert_array_equal(fused[name], value, err_msg=name)


def test_the_config_maps_to_the_mixture_hyperparameters(tmp_path):
    mixtral().save_pretrained(tmp_path / "mixtral")
    qwen2_moe().save_pretrained(tmp_path / "qwen")
    shapes = dict(NUM_LAYERS=2, MODEL_DIMS=64, NUM_HEADS=4, DIMS_PER_HEAD=16, VOCAB_SIZE=256,
                  MAX_SEQ_LEN=SEQ_LEN, LAYERNORM_EPSILON=1e-5, NUM_KV_HEADS=2,
                  ROPE_MAX_WAVELENGTH=500.0)
    # router_aux_loss_coef weighs one loss over both layers' tokens; Paxloom adds one
    # loss per mixture layer
    # a Mixtral has no dense feed-forward: HIDDEN_DIMS stays the experiment's
    assert hf_format.hyperparameters(tmp_path / "mixtral") == ("llama", dict(
        shapes, NUM_EXPERTS=8, NUM_EXPERTS_PER_TOKEN=2, MOE_HIDDEN_DIMS=48,
        MOE_LAYER_INTERVAL=1, MOE_RENORMALIZE=True, MOE_SHARED_HIDDEN_DIMS=0,
        MOE_SHARED_EXPERT_GATE=False, LOAD_BALANCING_WEIGHT=0.01))
    assert hf_format.hyperparameters(tmp_path / "qwen") == ("llama", dict(
        shapes, HIDDEN_DIMS=96, NUM_EXPERTS=8, NUM_EXPERTS_PER_TOKEN=2, MOE_HIDDEN_DIMS=24,
        MOE_LAYER_INTERVAL=2, MOE_RENORMALIZE=False, MOE_SHARED_HIDDEN_DIMS=40,
        MOE_SHARED_EXPERT_GATE=True, LOAD_BALANCING_WEIGHT=0.01))
    flags = import_hf.run_flags(str(tmp_path / "mixtral"))
    assert flags[0] == "--fdl_config=experiments.llama.LlamaBase"
    assert "--fdl.NUM_EXPERTS=8" in flags and "--fdl.MOE_RENORMALIZE=True" in flags


# A Mixtral-style and a Qwen2-MoE-style Paxloom model (TINY's shapes), on the 8 devices.
PAXLOOM_MIXTURES = {
    "mixtral": dict(NUM_EXPERTS=4, NUM_EXPERTS_PER_TOKEN=2, MOE_HIDDEN_DIMS=32,
                    LOAD_BALANCING_WEIGHT=0.02),
    "qwen2_moe_every_2nd_repeated": dict(
        NUM_LAYERS=4, NUM_EXPERTS=4, NUM_EXPERTS_PER_TOKEN=2, MOE_HIDDEN_DIMS=32, MOE_LAYER_INTERVAL=2,
        MOE_RENORMALIZE=False, MOE_SHARED_HIDDEN_DIMS=16, MOE_SHARED_EXPERT_GATE=True,
        USE_REPEATED_LAYER=True),
}


@pytest.mark.parametrize("name,target", [("mixtral", "MixtralForCausalLM"),
                                         ("qwen2_moe_every_2nd_repeated", "Qwen2MoeForCausalLM")])
def test_export_then_import_gives_back_the_parameters(name, target, tmp_path):
    _, family, _ = assert_export_round_trips(
        LlamaBase(**{**TINY, **ON_8_DEVICES, **PAXLOOM_MIXTURES[name]}), tmp_path, target,
        sequences=PROBE_SEQUENCES)
    assert family == "llama"


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe_every_2nd_repeated"])
def test_cached_greedy_decoding_of_an_imported_mixture_continues_as_transformers(
        name, tmp_path):
    make, overrides = MODELS[name]
    assert_greedy_decoding_continues_as_transformers(make(), tmp_path, **overrides)


def assert_greedy_decoding_continues_as_transformers(hf_model, hf_dir, **overrides):
    """Save `hf_model` to `hf_dir`, import it, and check that greedy decoding with the cache
    (layers/cached_lm.py) continues prompts of several lengths, left-padded into one batch,
    as transformers' generate does."""
    hf_model.save_pretrained(hf_dir)
    _, arch, _, mesh, like = paxloom(hf_dir, **overrides)
    params = placed(hf_format.read_params(hf_dir, arch, like), like)
    assert_greedy_continuations_equal_transformers(
        hf_model, arch, mesh, like, params, [[17, 3, 250, 9, 41, 8], [200, 1], [64, 65, 66, 67]],
        steps=8, max_seq_len=SEQ_LEN)


def test_a_repeated_stack_of_blocks_keeps_each_layer_of_the_block_apart():
    """A mixture every 2nd layer, scanned: repeat/sub/x_layers_0 holds the dense layers 0,
    2, ..., x_layers_1 the mixtures 1, 3, ...; relaid to one stack per layer and back."""
    exp = LlamaBase(**{**TINY, **ON_8_DEVICES,
                       **PAXLOOM_MIXTURES["qwen2_moe_every_2nd_repeated"]})
    model = exp.model_template()
    layout = ll.of_model(model)
    assert layout == ll.StackLayout(4, repeated=True, block=2)
    assert str(layout) == "4 repeated layers in blocks of 2"
    assert architecture.architecture_of(model).moe_layers == (1, 3)

    layers = [{"ff_layer": {"router": np.full((3, 4), float(i))} if i % 2 else
               {"ffn_layer1": np.full((3,), float(i))}} for i in range(4)]
    stored = ll.from_layers(layers, layout)
    assert stored["repeat"]["sub"]["x_layers_1"]["ff_layer"]["router"].shape == (2, 3, 4)
    assert stored["repeat"]["sub"]["x_layers_0"]["ff_layer"]["ffn_layer1"][:, 0].tolist() == [
        0.0, 2.0]
    shapes = {"lm/transformer/" + key(path): leaf.shape
              for path, leaf in jax.tree_util.tree_leaves_with_path(stored)}
    assert ll.from_shapes(shapes) == layout
    plain = ll.relayout(stored, layout, ll.StackLayout(4))
    assert sorted(plain) == [f"x_layers_{i}" for i in range(4)]
    back = ll.to_layers(ll.relayout(plain, ll.StackLayout(4), layout), layout)
    for got, want in zip(back, layers, strict=True):
        assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, got, want))
    with pytest.raises(ll.LayoutMismatch, match="its repeated block holds"):
        ll.to_layers(stored, ll.StackLayout(4, repeated=True))


@pytest.mark.parametrize("where", ["moe_layers", "every_layer"])
def test_praxis_gshard_mixture_is_refused_in_one_line(where):
    """Whether in the stack's moe_layers (as Pax's GLaM places it) or as every layer's
    feed-forward, and before anything else the model may have that the decoder lacks."""
    model = LlamaBase(**TINY).model_template()
    stack = model.lm_tpl.stacked_transformer_tpl
    gshard = pax_fiddle.Config(praxis_transformers.TransformerFeedForwardMoe, num_experts=4)
    if where == "moe_layers":
        stack.set(num_experts=4, moe_layers=[1], moe_layer_tpl=gshard)
    else:
        stack.transformer_layer_params_tpl.tr_fflayer_tpl = gshard
    stack.transformer_layer_params_tpl.tr_atten_tpl.internal_enable_query_scale = False
    with pytest.raises(architecture.UnsupportedModel) as error:
        architecture.architecture_of(model)
    assert str(error.value) == (
        "the mixture of experts is praxis's GShard TransformerFeedForwardMoe (Pax's GLaM), "
        "which the cached decoder does not reproduce; layers/moe.py's MoeFeedForward it does")


MIXTRAL = dict(model_type="mixtral", num_hidden_layers=2, hidden_size=64,
               intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
               vocab_size=256, max_position_embeddings=32, num_local_experts=4)
QWEN2_MOE = dict(MIXTRAL, model_type="qwen2_moe", num_experts=4, moe_intermediate_size=24,
                 shared_expert_intermediate_size=40)


@pytest.mark.parametrize("config,message", [
    # OLMoE normalises queries and keys over all heads at once, not head by head as Qwen3
    (dict(QWEN2_MOE, model_type="olmoe"), 'config.json model_type="olmoe": ' + KNOWN),
    (dict(MIXTRAL, sliding_window=4096),
     "config.json sliding_window=4096: Paxloom's attention sees the whole context (no "
     "sliding window)"),
    (dict(MIXTRAL, router_jitter_noise=0.01),
     "config.json router_jitter_noise=0.01: Paxloom's router has no jitter noise"),
    (dict(QWEN2_MOE, decoder_sparse_step=3),
     "config.json decoder_sparse_step=3: Paxloom's mixture layers are the last of every "
     "MOE_LAYER_INTERVAL, which must divide num_hidden_layers=2"),
    (dict(QWEN2_MOE, mlp_only_layers=[0]),
     "config.json mlp_only_layers=[0]: Paxloom's mixture layers are exactly the last of "
     "every decoder_sparse_step=1 (MOE_LAYER_INTERVAL)"),
    (dict(MIXTRAL, model_type="mistral"),
     'config.json model_type="mistral": ' + KNOWN),
], ids=["olmoe", "sliding_window", "router_jitter", "sparse_step", "mlp_only_layers",
        "mistral"])
def test_what_paxloom_does_not_model_is_refused_in_one_line(config, message, tmp_path):
    with pytest.raises(UserError) as error:
        hf_format.hyperparameters(write_config(tmp_path, **config))
    assert str(error.value) == message


def test_a_mixture_and_a_dense_model_do_not_read_each_other(tmp_path):
    mixture = write_config(tmp_path / "mixtral", **MIXTRAL)
    dense = LlamaBase(**{**hf_format.hyperparameters(mixture)[1], "NUM_EXPERTS": 0})
    with pytest.raises(UserError) as error:
        hf_format.check_config(mixture, architecture.architecture_of(dense.model_template()))
    assert str(error.value) == ("config.json num_local_experts=4 differs from the run's model "
                                "(NUM_EXPERTS=0); set --fdl.NUM_EXPERTS=4")

    llama = write_config(tmp_path / "llama", **dict(MIXTRAL, model_type="llama"))
    moe = LlamaBase(**{**hf_format.hyperparameters(llama)[1], **ON_8_DEVICES, "NUM_EXPERTS": 4})
    with pytest.raises(UserError) as error:
        hf_format.check_config(llama, architecture.architecture_of(moe.model_template()))
    assert str(error.value) == ('config.json model_type="llama": the run\'s model is a mixture '
                                "of experts (MixtralForCausalLM); set --fdl.NUM_EXPERTS=0")


def test_what_the_classes_cannot_express_is_refused(tmp_path):
    unnormalized = LlamaBase(**{**TINY, **ON_8_DEVICES, **PAXLOOM_MIXTURES["mixtral"],
                                "MOE_RENORMALIZE": False})
    arch = architecture.architecture_of(unnormalized.model_template())
    assert hf_format.target(arch) == "MixtralForCausalLM"
    with pytest.raises(UserError, match=r"^cannot export to MixtralForCausalLM exactly: "
                                        r"Mixtral renormalises its top-k router weights"):
        hf_format.check_representable(arch, hf_format.target(arch))

    # Qwen2-MoE's q, k, v biases read only as zeros: Paxloom's Llama has none
    hf_model = qwen2_moe(qkv_bias=True)
    hf_model.save_pretrained(tmp_path)
    _, arch, _, _, like = paxloom(tmp_path)
    with pytest.raises(UserError, match=r": the checkpoint does not fit the run's model: the "
                                        r"checkpoint has lm/transformer/x_layers_0/"
                                        r"self_attention/(query|key|value)/b, which the model "
                                        r"has no place for$"):
        hf_format.read_params(tmp_path, arch, like)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            if name.endswith("_proj.bias"):
                p.zero_()
    hf_model.save_pretrained(tmp_path / "zero_biases")
    assert hf_format.read_params(tmp_path / "zero_biases", arch, like).keys() == {
        key(p) for p, _ in jax.tree_util.tree_leaves_with_path(like)}
