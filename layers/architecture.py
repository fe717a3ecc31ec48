"""What a trained decoder is, in plain terms, for code that runs it outside praxis.

`architecture_of(model_config)` reads a praxis LanguageModel config (layers/gpt.py,
layers/llama.py, or a user's variant of them) and returns an `Architecture`: sizes,
norms (QK-norm's included, layers/qk_norm.py), position encoding (RoPE's scaling
included, layers/rope.py), activation, biases, query scaling, and the mixture of experts
(layers/moe.py's MoeFeedForward) with the layers that have it. Anything the cached
decoder (layers/cached_lm.py) would compute differently from praxis is refused with
`UnsupportedModel`, one line naming the setting, never approximated. One deliberate
exception: a mixture trained with a capacity (CAPACITY_FACTOR > 0) is described, and
decoded, dropless, as Hugging Face's Mixtral and Qwen-MoE compute: which tokens a capacity
drops depends on the rest of the batch, a training-time bound, not part of the model.

`canonical_weights(params, arch)` turns praxis's parameter tree into one layout that
hides praxis's storage conventions: norm scales are the effective multipliers (praxis
stores `scale - 1` unless `direct_scale`), the combined QKV projection is split into
q, k, v, the tied embedding appears as both the input embedding and the output
projection, and the layers become a list, whether stored per layer, repeated (scanned,
one layer or a block of several per repeat) or in pipeline stages
(layers/layer_layout.py). The cached decoder and the
Hugging Face export (paxloom/tools/export_hf.py) both read this layout, so praxis's layout
is decoded in one place. It works on numpy and jax arrays alike.
"""

import dataclasses

import fiddle as fdl
import jax.numpy as jnp
import numpy as np
from praxis.layers import (
    activations,
    attentions,
    embedding_softmax,
    linears,
    models,
    multi_query_attention,
    normalizations,
    transformer_models,
    transformers,
)

from layers import attention as fused_attention
from layers import layer_layout, lora, moe, qk_norm, rope
from layers import softmax as softmax_layers
from layers.stack import transformer_layer_template


class UnsupportedModel(ValueError):
    """The model has a setting that Paxloom's inference code does not reproduce."""


@dataclasses.dataclass(frozen=True)
class Norm:
    kind: str  # "layer_norm" (mean and variance) or "rms_norm"
    epsilon: float
    direct_scale: bool  # False: praxis stores scale - 1 and multiplies by 1 + scale
    bias: bool


# praxis activation class -> its name here (and, for GELU, by `approximate`).
_ACTIVATIONS = {activations.SiLU: "silu", activations.ReLU: "relu"}
_GELU_NAMES = {True: "gelu_tanh", False: "gelu"}
# Attention classes whose maths is DotProductAttention's (the fused one only swaps kernels).
# The QK-norm ones add a norm that Architecture.qk_norm describes.
_DOT_PRODUCT_ATTENTIONS = (attentions.DotProductAttention,
                           qk_norm.QkNormDotProductAttention,
                           fused_attention.FusedDotProductAttention)
_MULTI_QUERY_ATTENTIONS = (multi_query_attention.MultiQueryDotProductAttention,
                           qk_norm.QkNormMultiQueryDotProductAttention,
                           fused_attention.FusedMultiQueryDotProductAttention)
# An attention's projection templates and the praxis class each must be (or adapt: LoRA's
# low-rank term merges into the weight, canonical_weights).
_PROJECTIONS = {"proj_tpl": attentions.AttentionProjection,
                "combined_qkv_proj_tpl": attentions.CombinedQKVProjectionLayer,
                "headless_proj_tpl": multi_query_attention.OneHeadedAttentionProjection}
# Output layers whose logits are praxis's (the chunked ones only change the training loss).
_TIED_SOFTMAXES = (embedding_softmax.SharedEmbeddingSoftmax,
                   softmax_layers.ChunkedSharedEmbeddingSoftmax)
_UNTIED_SOFTMAXES = (embedding_softmax.FullSoftmax, softmax_layers.ChunkedFullSoftmax)
# Rotary embeddings the cached decoder reproduces (layers/rope.py: scaled frequencies).
_ROTARY_EMBEDDINGS = (embedding_softmax.RotaryPositionalEmbedding,
                      rope.ScaledRotaryPositionalEmbedding)


@dataclasses.dataclass(frozen=True)
class Experts:
    """A dropless top-k mixture of gated experts (layers/moe.py), the feed-forward of the
    layers Architecture.moe_layers names. Its norm and activation are the model's
    feed-forward ones (mlp_norm, activation)."""

    num_experts: int
    per_token: int  # k of the top-k routing
    hidden_dims: int  # each expert's
    renormalize: bool  # a token's k router weights are rescaled to sum to 1
    shared_hidden_dims: int = 0  # > 0: a shared expert every token goes through
    gate_shared_expert: bool = False  # the shared expert's output times sigmoid(x @ w)
    # Training only (no part of the forward pass): the load-balancing loss's weight per
    # mixture layer, which Hugging Face configs carry as router_aux_loss_coef.
    load_balancing_weight: float = 0.0


@dataclasses.dataclass(frozen=True)
class Architecture:
    num_layers: int
    model_dims: int
    hidden_dims: int  # the dense feed-forward's (unused when every layer is a mixture)
    num_heads: int
    num_kv_heads: int  # == num_heads without grouped-query attention
    dims_per_head: int
    vocab_size: int
    attention_norm: Norm
    mlp_norm: Norm
    final_norm: Norm | None
    positions: str  # "learned" (a table added to the embedding) or "rotary"
    max_positions: int | None  # rows of the learned table
    rope_min_timescale: float | None
    rope_max_timescale: float | None  # RoPE's base ("theta")
    activation: str  # "gelu_tanh", "gelu", "silu" or "relu"
    gated_mlp: bool  # act(x @ gate) * (x @ up) instead of act(x @ up)
    attention_bias: bool  # q, k, v and output projections have biases
    mlp_bias: bool
    unembed_bias: bool  # the output projection has a bias
    tied_embedding: bool  # the output projection is the embedding table, transposed
    embedding_scale: float  # the looked-up embedding is multiplied by this
    query_scale: float  # queries are multiplied by this before the dot product
    repeated: bool  # layers stored stacked (StackedTransformerRepeated), or a pipeline stage's
    fprop_dtype: str
    # Where each layer's parameters sit (plain, repeated, pipeline stages); None: as
    # `repeated` says, unpipelined (an Architecture made by hand).
    stack_layout: layer_layout.StackLayout | None = None
    experts: Experts | None = None  # the mixture of experts, in the layers moe_layers names
    moe_layers: tuple[int, ...] = ()  # layers (0 = next to the embedding) with `experts`
    rope_scaling: rope.RopeScaling = rope.NONE  # of a rotary model's frequencies
    # Each head's queries and keys normalised before RoPE (QK-norm, layers/qk_norm.py)
    qk_norm: Norm | None = None

    @property
    def layout(self) -> layer_layout.StackLayout:
        return self.stack_layout or layer_layout.StackLayout(self.num_layers, self.repeated)


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise UnsupportedModel(what)


def _cls(config) -> type:
    return fdl.get_callable(config)


def _norm(config, where: str) -> Norm:
    cls = _cls(config)
    if cls is normalizations.LayerNorm:
        _require(config.use_scale, f"{where}: LayerNorm without a scale")
        return Norm("layer_norm", float(config.epsilon), bool(config.direct_scale),
                    bool(config.use_bias))
    if cls is normalizations.RmsNorm:
        _require(config.intermediate_dtype is None, f"{where}: RmsNorm with intermediate_dtype")
        return Norm("rms_norm", float(config.epsilon), bool(config.direct_scale), False)
    raise UnsupportedModel(f"{where} is {cls.__name__}; only LayerNorm and RmsNorm are known")


def _activation(config, where: str) -> str:
    cls = _cls(config)
    if cls is activations.GELU:
        return _GELU_NAMES[bool(config.approximate)]
    if cls in _ACTIVATIONS:
        return _ACTIVATIONS[cls]
    raise UnsupportedModel(f"{where} is {cls.__name__}; known: GELU, SiLU, ReLU")


def architecture_of(model) -> Architecture:
    """The Architecture of a praxis LanguageModel config; UnsupportedModel for what the
    cached decoder does not reproduce exactly."""
    _require(_cls(model) is models.LanguageModel,
             f"the model is {_cls(model).__name__}, not a praxis LanguageModel")
    _require(model.model_type == transformer_models.LanguageModelType.CAUSAL,
             f"the model is {model.model_type}, not a causal language model")
    lm = model.lm_tpl
    _require(_cls(lm) is transformer_models.TransformerLm, f"lm_tpl is {_cls(lm).__name__}")
    _require(lm.ngrammer_tpl is None, "the model has an n-grammer layer")
    layout, repeated, block, layer = _decoder_layers(lm.stacked_transformer_tpl)
    # The feed-forwards first: praxis's GShard mixture (Pax's GLaM) is refused by name.
    dense, mixture, moe_layers = _feed_forwards(block, layer, layout.num_layers)
    experts = None if mixture is None else _experts(mixture, block)
    # The feed-forward's norm and activation: the dense layer's, which a mixture shares
    # (moe.with_experts copies them); the mixture's when every layer is one.
    ffn = dense if dense is not None else mixture
    mlp_norm = _norm(ffn.ln_tpl, "the feed-forward norm")
    activation = _activation(ffn.activation_tpl, "the feed-forward activation")
    if mixture is not None:
        _require(_norm(mixture.ln_tpl, "the mixture's norm") == mlp_norm,
                 "the mixture of experts' norm differs from the dense feed-forward's")
        _require(_activation(mixture.activation_tpl, "the mixture's activation") == activation,
                 "the mixture of experts' activation differs from the dense feed-forward's")
    atten, softmax = layer.tr_atten_tpl, lm.softmax_tpl
    num_kv_heads, query_scale, qk = _attention(atten, block)
    positions, max_positions, rope_min, rope_max, rope_scaling = _positions(lm, atten)
    tied, embedding_scale = _softmax(lm, block.model_dims)
    return Architecture(
        num_layers=layout.num_layers, model_dims=block.model_dims,
        hidden_dims=block.hidden_dims, num_heads=block.num_heads, num_kv_heads=num_kv_heads,
        dims_per_head=_dims_per_head(block), vocab_size=lm.vocab_size,
        attention_norm=_norm(layer.ln_tpl, "the attention norm"),
        mlp_norm=mlp_norm,
        final_norm=None if lm.final_ln_tpl is None else _norm(lm.final_ln_tpl, "the final norm"),
        positions=positions, max_positions=max_positions,
        rope_min_timescale=rope_min, rope_max_timescale=rope_max,
        activation=activation,
        # experts are gated and bias-free (layers/moe.py)
        gated_mlp=True if dense is None else bool(dense.use_gated_activation),
        attention_bias=bool(atten.use_bias),
        mlp_bias=False if dense is None else bool(dense.has_bias),
        unembed_bias=bool(softmax.feed_forward_tpl.has_bias),
        tied_embedding=tied,
        embedding_scale=embedding_scale, query_scale=query_scale, repeated=repeated,
        fprop_dtype=jnp.dtype(model.fprop_dtype).name, stack_layout=layout,
        experts=experts, moe_layers=moe_layers, rope_scaling=rope_scaling, qk_norm=qk,
    )


def _dims_per_head(block) -> int:
    return block.dim_per_head or block.model_dims // block.num_heads  # praxis's default


def _decoder_layers(stack):
    """(layout, repeated, the stack of one block, its layer template) of a decoder stack
    whose layers are all one plain pre-norm causal transformer layer (but for their
    feed-forward: a mixture of experts in some, _feed_forwards)."""
    try:
        layout = layer_layout.of_stack(stack)
    except layer_layout.LayoutMismatch as error:
        raise UnsupportedModel(str(error)) from None
    if issubclass(_cls(stack), transformers.PipelinedTransformer):
        stack = stack.pipeline_stage  # each stage's layers: the maths of the plain stack
    repeated = issubclass(_cls(stack), transformers.StackedTransformerRepeated)
    block = stack.block if repeated else stack
    _require(_cls(block) is transformers.StackedTransformer,
             f"the layer stack is {_cls(block).__name__}")
    _require(block.mask_self_attention, "self-attention is not causal (mask_self_attention)")
    _require(not block.use_cross_attention, "the layers have cross-attention")
    _require(not block.ngrammer_tpls, "the layers have n-grammers")
    layer = transformer_layer_template(stack)
    _require(not isinstance(layer, (list, tuple)), "the layers differ from one another")
    _require(_cls(layer) is transformers.Transformer, f"the layer is {_cls(layer).__name__}")
    _require(layer.norm_policy == "pre", f"norm_policy={layer.norm_policy!r}; only 'pre'")
    _require(layer.ngrammer_tpl is None, "the layers have an n-grammer")
    return layout, repeated, block, layer


def _attention(atten, block) -> tuple[int, float, Norm | None]:
    """(key/value heads, query scale, QK-norm) of an attention template the decoder
    reproduces."""
    if issubclass(_cls(atten), multi_query_attention.MultiQueryDotProductAttention):
        _require(_cls(atten) in _MULTI_QUERY_ATTENTIONS, f"attention is {_cls(atten).__name__}")
        num_kv_heads = atten.num_kv_heads
    else:
        _require(_cls(atten) in _DOT_PRODUCT_ATTENTIONS, f"attention is {_cls(atten).__name__}")
        num_kv_heads = block.num_heads
        _require(not atten.internal_enable_per_dim_scale,
                 "attention has a learned per-dimension query scale (per_dim_scale)")
        _require(atten.internal_enable_query_scale, "attention does not scale queries")
        _require(not atten.scale_logits_by_head_dims, "attention scales logits by head dims")
        _require(not atten.dconv_qkv, "attention has depthwise convolutions (dconv_qkv)")
        _require(atten.ln_tpl is None, "attention normalises queries and keys (ln_tpl)")
        _require(not atten.output_proj_use_nhd_shape, "attention's output projection is NHD")
    _require(atten.relative_bias_tpl is None, "attention has a relative position bias")
    _require(not atten.atten_logit_cap or atten.atten_logit_cap <= 0,
             f"attention caps logits (atten_logit_cap={atten.atten_logit_cap})")
    _require(atten.attention_extra_logit is None, "attention has an extra logit")
    for name, projection in _PROJECTIONS.items():
        template = getattr(atten, name, None)
        _require(template is None or lora.base_class(_cls(template)) is projection,
                 f"attention's {name} is {template and _cls(template).__name__}")
    # praxis scales queries by the head size, or by model_dims // num_heads (_scale_query).
    by_head_dim = atten.scale_query_by_dim_per_head
    scale = _dims_per_head(block) if by_head_dim else block.model_dims // block.num_heads
    norm = getattr(atten, "qk_norm_tpl", None)
    return (num_kv_heads, float(scale) ** -0.5,
            None if norm is None else _norm(norm, "the query/key norm (QK-norm)"))


def _positions(lm, atten):
    """(kind, learned table size, RoPE min and max timescales, RoPE scaling) of the model's
    positions."""
    positions, max_positions, rope_min, rope_max, scaling = None, None, None, None, rope.NONE
    if atten.use_rotary_position_emb:
        rotary = atten.rotary_position_emb_tpl
        _require(_cls(rotary) in _ROTARY_EMBEDDINGS,
                 f"rotary position embedding is {_cls(rotary).__name__}")
        positions, rope_min, rope_max = "rotary", float(rotary.min_timescale), float(
            rotary.max_timescale)
        scaling = rope.scaling_of(rotary)
    if lm.position_emb_tpl is not None:
        _require(positions is None, "the model has both learned and rotary positions")
        _require(_cls(lm.position_emb_tpl) is embedding_softmax.TrainablePositionalEmbedding,
                 f"position embedding is {_cls(lm.position_emb_tpl).__name__}")
        positions, max_positions = "learned", lm.position_emb_tpl.max_seq_length
    _require(positions is not None, "the model has no position information")
    return positions, max_positions, rope_min, rope_max, scaling


def _feed_forwards(block, layer, num_layers: int):
    """(the dense feed-forward template, None when every layer is a mixture; the mixture
    of experts' template, None without one; the mixture's layers) of a decoder whose
    layers share `layer`. praxis puts a mixture in every layer as the layer's feed-forward,
    or in the `moe_layers` of each stack `block` (every Nth layer: layers/moe.py's
    with_experts; a repeated stack scans blocks of N layers)."""
    ffn = layer.tr_fflayer_tpl
    if _is_mixture(ffn):
        _require(not block.moe_layers, "the layers have two mixture-of-experts templates")
        return None, ffn, tuple(range(num_layers))
    _check_feed_forward(ffn)
    if not block.moe_layers:
        return ffn, None, ()
    slots = set(block.moe_layers)  # of the block's layers; the block repeats down the stack
    return ffn, block.moe_layer_tpl, tuple(
        i for i in range(num_layers) if i % block.num_layers in slots)


def _is_mixture(ffn) -> bool:
    return issubclass(_cls(ffn), (moe.MoeFeedForward, transformers.TransformerFeedForwardMoe))


def _experts(mixture, block) -> Experts:
    """The Experts of a MoeFeedForward template; praxis's StackedTransformer sets
    `num_experts` on the templates of its moe_layers from its own."""
    cls = _cls(mixture)
    _require(not issubclass(cls, transformers.TransformerFeedForwardMoe),
             f"the mixture of experts is praxis's GShard {cls.__name__} (Pax's GLaM), which "
             f"the cached decoder does not reproduce; layers/moe.py's MoeFeedForward it does")
    _require(cls is moe.MoeFeedForward, f"the mixture of experts is {cls.__name__}")
    _require(mixture.add_skip_connection, "the mixture of experts has no residual connection")
    return Experts(
        num_experts=int(block.num_experts if block.moe_layers else mixture.num_experts),
        per_token=int(mixture.num_experts_per_token),
        hidden_dims=int(mixture.expert_hidden_dims),
        renormalize=bool(mixture.renormalize_top_k),
        shared_hidden_dims=int(mixture.shared_hidden_dims),
        gate_shared_expert=bool(mixture.shared_hidden_dims and mixture.gate_shared_expert),
        load_balancing_weight=float(mixture.load_balancing_weight))


def _check_feed_forward(ffn) -> None:
    _require(_cls(ffn) is transformers.TransformerFeedForward,
             f"the feed-forward layer is {_cls(ffn).__name__}")
    _require(ffn.norm_policy == "pre", f"feed-forward norm_policy={ffn.norm_policy!r}")
    _require(ffn.add_skip_connection and ffn.residual_weight == 1.0,
             "the feed-forward residual is not plain x + f(x)")
    _require(_cls(ffn.fflayer_tpl) is linears.FeedForward,
             f"the feed-forward projection is {_cls(ffn.fflayer_tpl).__name__}")
    linear = _cls(ffn.fflayer_tpl.linear_tpl)
    _require(lora.base_class(linear) is linears.Linear,
             f"the feed-forward projection's linear layer is {linear.__name__}")


def _softmax(lm, model_dims: int) -> tuple[bool, float]:
    """(tied embedding, embedding scale) of the model's softmax and input embedding."""
    softmax = lm.softmax_tpl
    tied = _cls(softmax) in _TIED_SOFTMAXES
    _require(tied or _cls(softmax) in _UNTIED_SOFTMAXES,
             f"the softmax is {_cls(softmax).__name__}")
    _require(not softmax.soft_cap_logits, f"logits are soft-capped ({softmax.soft_cap_logits})")
    _require(not softmax.scale_before_logits, "the softmax scales its input (scale_before_logits)")
    _require(softmax.feed_forward_tpl is not None, "the softmax has no output projection")
    if tied:
        _require(lm.separate_embedding_tpl is None, "a tied softmax and a separate embedding")
        embedding = softmax
    else:
        embedding = lm.separate_embedding_tpl
        _require(embedding is not None and _cls(embedding) is embedding_softmax.Embedding,
                 "an untied softmax needs a separate praxis Embedding")
    return tied, float(model_dims) ** 0.5 if embedding.scale_sqrt_depth else 1.0


def _norm_weights(params: dict, norm: Norm) -> dict:
    scale = params["scale"] if norm.direct_scale else params["scale"] + 1
    return {"scale": scale, "bias": params["bias"]} if norm.bias else {"scale": scale}


def _linear(params: dict, prefix: str, out: dict, name: str) -> None:
    """praxis FeedForward {linear: {w}, bias: {b}} -> out[name], out[name_bias]."""
    out[name] = params[prefix]["linear"]["w"]
    if "bias" in params[prefix]:
        out[f"{name}_bias"] = params[prefix]["bias"]["b"]


# The QK-norm's children of an attention, and their canonical names (layers/qk_norm.py).
_QK_NORMS = ("q_norm", "k_norm")


def _attention_weights(params: dict, arch: Architecture, out: dict) -> None:
    if "combined_qkv" in params:  # w [3, D, N, H], b [3, N, H]
        for i, name in enumerate("qkv"):
            out[name] = params["combined_qkv"]["w"][i]
            if "b" in params["combined_qkv"]:
                out[f"{name}_bias"] = params["combined_qkv"]["b"][i]
    else:  # query/key/value w [D, heads, H]; a single key/value head is stored as [D, H]
        for name, praxis_name in (("q", "query"), ("k", "key"), ("v", "value")):
            heads = arch.num_heads if name == "q" else arch.num_kv_heads
            w = params[praxis_name]["w"]
            out[name] = w.reshape(arch.model_dims, heads, arch.dims_per_head)
            if "b" in params[praxis_name]:
                out[f"{name}_bias"] = params[praxis_name]["b"].reshape(heads, arch.dims_per_head)
    out["o"] = params["post"]["w"]  # [D, N, H]: out = einsum('...NH,DNH->...D')
    if "b" in params["post"]:
        out["o_bias"] = params["post"]["b"]
    if arch.qk_norm is not None:
        for name in _QK_NORMS:
            out[name] = _norm_weights(params[name], arch.qk_norm)


# A mixture's weights: canonical name -> MoeFeedForward's (router [D, E], expert_gate and
# expert_up [E, D, F], expert_down [E, F, D]; a shared expert's [D, Fs], [D, Fs], [Fs, D]
# and its gate [D, 1]).
_EXPERT_WEIGHTS = {"router": "router", "expert_gate": "wi_gate", "expert_up": "wi_up",
                   "expert_down": "wo", "shared_gate": "shared_gate", "shared_up": "shared_up",
                   "shared_down": "shared_down", "shared_expert_gate": "shared_expert_gate"}


def _layer_weights(params: dict, arch: Architecture, mixture: bool) -> dict:
    """One layer's canonical weights: attention_norm {scale, bias?}, q/k/v [D, heads, H]
    (+ _bias [heads, H]), o [D, N, H] (+ o_bias [D]), q_norm and k_norm {scale [H]} with
    QK-norm, mlp_norm, and either up [D, F], gate [D, F] (gated only), down [F, D]
    (+ _bias), or, in a mixture layer, _EXPERT_WEIGHTS."""
    out = {"attention_norm": _norm_weights(params["layer_norm"], arch.attention_norm)}
    _attention_weights(params["self_attention"], arch, out)
    ff = params["ff_layer"]
    out["mlp_norm"] = _norm_weights(ff["layer_norm"], arch.mlp_norm)
    if mixture:
        out.update({name: ff[praxis_name] for name, praxis_name in _EXPERT_WEIGHTS.items()
                    if praxis_name in ff})
        return out
    _linear(ff, "ffn_layer1", out, "up")
    if arch.gated_mlp:  # praxis applies the activation to ffn_layer1_gate, not ffn_layer1
        _linear(ff, "ffn_layer1_gate", out, "gate")
    _linear(ff, "ffn_layer2", out, "down")
    return out


def canonical_weights(params: dict, arch: Architecture) -> dict:
    """praxis params ({'lm': ...}) -> {embed [V, D], positions [S, D] (learned only),
    final_norm, unembed [D, V], unembed_bias [V]?, layers: [per-layer dicts]}. LoRA
    adapters are merged into their weights: these are the fine-tuned model's weights."""
    lm = lora.merge_adapters(params)["lm"]
    logits_ffn = lm["softmax"]["logits_ffn"]
    out = {"unembed": logits_ffn["linear"]["w"]}  # [D, V]
    if "bias" in logits_ffn:
        out["unembed_bias"] = logits_ffn["bias"]["b"]
    out["embed"] = out["unembed"].T if arch.tied_embedding else lm["embedding_lookup"]["emb_var"]
    if arch.positions == "learned":
        out["positions"] = lm["position_emb"]["emb_var"]
    if arch.final_norm is not None:
        out["final_norm"] = _norm_weights(lm["final_ln"], arch.final_norm)
    per_layer = layer_layout.to_layers(lm["transformer"], arch.layout)
    out["layers"] = [_layer_weights(p, arch, i in arch.moe_layers)
                     for i, p in enumerate(per_layer)]
    return out


# ----- the inverse: canonical weights -> praxis params -----------------------------------
# Used to read other formats (a Hugging Face checkpoint, paxloom/runner/state/hf_format.py) into a
# run's parameter tree. The run's abstract tree (`like`) decides what praxis's layout
# leaves open: combined or separate q/k/v, per-layer or repeated (stacked) layers, and
# how praxis stores a single key/value head.


class WeightMismatch(ValueError):
    """Canonical weights that do not fit the model's parameter tree."""


def praxis_params(canonical: dict, arch: Architecture, like: dict) -> dict:
    """The inverse of `canonical_weights`: praxis params ({'lm': ...}, float32 numpy) with
    every leaf of `like` (the model's parameter tree; any leaves with a `.shape`) except
    LoRA adapters, which no checkpoint of the base model holds. `canonical` is
    canonical_weights' layout; its "layers" may be any iterable (a generator reading one
    layer at a time keeps one layer beyond the result in memory); `unembed` may be left
    out of a tied model. A canonical weight the tree has no place for must be zero (an
    exported bias the model lacks); otherwise, and for a missing or misshapen weight,
    WeightMismatch naming the parameter."""
    lm_like = like["lm"]
    unembed = canonical.get("unembed")
    if unembed is None:
        unembed = canonical["embed"].T
    logits_ffn = {"linear": {"w": unembed}}
    if "unembed_bias" in canonical:
        logits_ffn["bias"] = {"b": canonical["unembed_bias"]}
    lm = {"softmax": {"logits_ffn": logits_ffn}}
    if not arch.tied_embedding:
        lm["embedding_lookup"] = {"emb_var": canonical["embed"]}
    if arch.positions == "learned":
        lm["position_emb"] = {"emb_var": canonical["positions"]}
    if arch.final_norm is not None:
        lm["final_ln"] = _praxis_norm(canonical["final_norm"], arch.final_norm)
    out = _fit(lm, {k: v for k, v in lm_like.items() if k != "transformer"}, "lm")
    out["transformer"] = _praxis_stack(canonical["layers"], arch, lm_like["transformer"])
    return {"lm": out}


def _praxis_stack(layers, arch: Architecture, like: dict) -> dict:
    """The transformer's params from per-layer canonical weights, read once, in order, and
    written into the model's layer layout (per layer, repeated, pipeline stages)."""
    layout = arch.layout
    lead = len(layout.lead_shape)
    out: dict = {}
    for path in layout.body_paths():  # stacked layouts: arrays to write each layer into
        if lead:
            body_like = _subtree(like, path)
            _subtree(out, path[:-1], create=True)[path[-1]] = _map_shapes(
                body_like, lambda shape: np.empty(shape, np.float32))
    count = 0
    for i, layer in enumerate(layers):
        _mismatch(i < arch.num_layers, f"more than the model's {arch.num_layers} layers")
        where = f"lm/transformer/x_layers_{i}"
        path, index = layout.locate(i)
        body_like = _subtree(like, path)
        one_like = _map_shapes(body_like, lambda shape: shape[lead:]) if lead else body_like
        params = _fit(_praxis_layer(layer, arch, one_like), one_like, where)
        if lead:
            _assign(_subtree(out, path), params, index)
        else:
            _subtree(out, path[:-1], create=True)[path[-1]] = params
        count += 1
    _mismatch(count == arch.num_layers, f"{count} layers, the model has {arch.num_layers}")
    return out


def _subtree(tree: dict, path: tuple, create: bool = False) -> dict:
    for key in path:
        if create:
            tree = tree.setdefault(key, {})
        else:
            _mismatch(isinstance(tree, dict) and key in tree,
                      f"the model has no lm/transformer/{'/'.join(path)}")
            tree = tree[key]
    return tree


def _praxis_norm(weights: dict, norm: Norm) -> dict:
    # the inverse of _norm_weights; subtracting 1 is exact for multipliers in [0.5, 2], and
    # 1 + (multiplier - 1) gives back the multiplier itself wherever praxis adds the 1
    scale = weights["scale"] if norm.direct_scale else weights["scale"] - 1
    return {"scale": scale, "bias": weights["bias"]} if "bias" in weights else {"scale": scale}


def _praxis_linear(layer: dict, name: str) -> dict:
    out = {"linear": {"w": layer[name]}}
    if f"{name}_bias" in layer:
        out["bias"] = {"b": layer[f"{name}_bias"]}
    return out


def _praxis_layer(layer: dict, arch: Architecture, like: dict) -> dict:
    """One layer's params from its canonical weights (the inverse of _layer_weights)."""
    attention = {}
    if "combined_qkv" in like["self_attention"]:  # w [3, D, N, H], b [3, N, H]
        attention["combined_qkv"] = {"w": np.stack([layer[n] for n in "qkv"])}
        if "q_bias" in layer:
            attention["combined_qkv"]["b"] = np.stack([layer[f"{n}_bias"] for n in "qkv"])
    else:
        for name, praxis_name in (("q", "query"), ("k", "key"), ("v", "value")):
            attention[praxis_name] = {"w": layer[name]}
            if f"{name}_bias" in layer:
                attention[praxis_name]["b"] = layer[f"{name}_bias"]
    attention["post"] = {"w": layer["o"]}
    if "o_bias" in layer:
        attention["post"]["b"] = layer["o_bias"]
    for name in _QK_NORMS:  # as they are for a model without QK-norm: _fit refuses them
        if name in layer:
            attention[name] = (layer[name] if arch.qk_norm is None
                               else _praxis_norm(layer[name], arch.qk_norm))
    ff = {"layer_norm": _praxis_norm(layer["mlp_norm"], arch.mlp_norm)}
    if "router" in layer:  # a mixture layer
        ff.update({praxis_name: layer[name] for name, praxis_name in _EXPERT_WEIGHTS.items()
                   if name in layer})
    else:
        ff["ffn_layer1"] = _praxis_linear(layer, "up")
        ff["ffn_layer2"] = _praxis_linear(layer, "down")
        if "gate" in layer:
            ff["ffn_layer1_gate"] = _praxis_linear(layer, "gate")
    return {"layer_norm": _praxis_norm(layer["attention_norm"], arch.attention_norm),
            "self_attention": attention, "ff_layer": ff}


def _mismatch(condition: bool, what: str) -> None:
    if not condition:
        raise WeightMismatch(what)


def _fit(built: dict, like: dict, where: str) -> dict:
    """`built`'s arrays in `like`'s tree and shapes, as float32; `like` holds shapes or
    objects with a `.shape`. Shapes may differ only by axes of size 1 (praxis stores a
    single key/value head as [D, H])."""
    out = {}
    for key, spec in like.items():
        path = f"{where}/{key}"
        if lora.is_adapter(key):
            continue
        if isinstance(spec, dict):
            _mismatch(isinstance(built.get(key), dict), f"no weights for {path}")
            out[key] = _fit(built[key], spec, path)
            continue
        _mismatch(key in built, f"no weight for {path}")
        value = built[key]
        shape = tuple(spec) if isinstance(spec, tuple) else tuple(spec.shape)
        _mismatch([d for d in value.shape if d != 1] == [d for d in shape if d != 1],
                  f"{path} is {tuple(value.shape)} in the checkpoint, {shape} in the model")
        out[key] = np.ascontiguousarray(value, np.float32).reshape(shape)
    for key in built.keys() - like.keys():
        _mismatch(not _any_nonzero(built[key]),
                  f"the checkpoint has {where}/{key}, which the model has no place for")
    return out


def _any_nonzero(tree) -> bool:
    if isinstance(tree, dict):
        return any(_any_nonzero(v) for v in tree.values())
    return bool(np.any(tree))


def _map_shapes(like: dict, fn) -> dict:
    """`like` with each non-adapter leaf replaced by fn(its shape as a tuple)."""
    return {k: _map_shapes(v, fn) if isinstance(v, dict)
            else fn(tuple(v) if isinstance(v, tuple) else tuple(v.shape))
            for k, v in like.items() if not lora.is_adapter(k)}


def _assign(stacked: dict, one: dict, i: int) -> None:
    for key, value in one.items():
        if isinstance(value, dict):
            _assign(stacked[key], value, i)
        else:
            stacked[key][i] = value
