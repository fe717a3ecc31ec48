"""A Llama-style decoder on praxis layers (Touvron et al. 2023, "Llama 2", section 2.2).

Differences from the GPT (layers/gpt.py): rotary position embeddings instead of
learned positions, RMSNorm instead of LayerNorm, a gated SiLU feed-forward
(SwiGLU), no biases anywhere, an output layer separate from the input embedding,
and optional grouped-query attention (num_kv_heads < num_heads).

RMSNorm scales are stored as offsets from 1 (`direct_scale=False`, like praxis's
LayerNorm), so weight decay pulls them towards 1, not 0.

With `use_qk_norm`, each head's queries and keys also pass an RMSNorm before RoPE
(layers/qk_norm.py: Qwen3 and Qwen3-MoE), the family's RMSNorm with its epsilon.

With `loss_chunk_len` > 0 the output layer is layers/softmax.py's FullSoftmax subclass,
whose training cross-entropy runs over chunks of the sequence (same parameters, same loss).
"""

from praxis import pax_fiddle
from praxis.layers import (
    activations,
    attentions,
    multi_query_attention,
    normalizations,
)

from layers import moe, qk_norm, rope
from layers.stack import (
    language_model,
    separate_softmax,
    transformer_layer_template,
    transformer_lm,
)


def llama_model(
    stack: pax_fiddle.Config,
    *,
    model_dims: int,
    vocab_size: int,
    num_heads: int,
    num_kv_heads: int,
    packed_input: bool,
    fprop_dtype: str,
    init_std: float,
    softmax_init_std: float,
    norm_epsilon: float,
    rope_max_wavelength: float,
    rope_scaling: rope.RopeScaling = rope.NONE,
    embedding_lookup_style: str = "index",
    loss_chunk_len: int = 0,
    experts: pax_fiddle.Config | None = None,
    experts_interval: int = 1,
    use_qk_norm: bool = False,
) -> pax_fiddle.Config:
    """The unsharded praxis LanguageModel config of a Llama-style decoder around `stack`;
    with `experts` (a layers/moe.py MoeFeedForward config), every `experts_interval`-th
    layer's feed-forward is that mixture of experts (Mixtral, Qwen-MoE); `rope_scaling`
    scales RoPE's frequencies for a longer context (layers/rope.py: Llama 3.1, YaRN);
    `use_qk_norm` normalises each head's queries and keys before RoPE (Qwen3)."""
    rms_norm = pax_fiddle.Config(normalizations.RmsNorm, epsilon=norm_epsilon,
                                 direct_scale=False)
    lm = transformer_lm(
        stack, model_dims=model_dims, vocab_size=vocab_size, packed_input=packed_input,
        position_emb_tpl=None,  # positions enter through RoPE in every attention layer
        final_ln_tpl=rms_norm.clone(),
    )
    separate_softmax(lm, loss_chunk_len=loss_chunk_len, softmax_init_std=softmax_init_std,
                     embedding_lookup_style=embedding_lookup_style)

    layer = transformer_layer_template(stack)
    layer.ln_tpl = rms_norm.clone()
    ffn = layer.tr_fflayer_tpl
    ffn.ln_tpl = rms_norm.clone()
    ffn.activation_tpl = pax_fiddle.Config(activations.SiLU)
    ffn.use_gated_activation = True
    ffn.has_bias = False
    if num_kv_heads == num_heads:
        layer.tr_atten_tpl = pax_fiddle.Config(
            attentions.DotProductAttention, combine_qkv=True,
            internal_enable_per_dim_scale=False)
    else:
        layer.tr_atten_tpl = pax_fiddle.Config(
            multi_query_attention.MultiQueryDotProductAttention,
            num_kv_heads=num_kv_heads, scale_query_by_dim_per_head=True)
    layer.tr_atten_tpl.set(use_bias=False, use_rotary_position_emb=True,
                           rotary_position_emb_tpl=rope.template(rope_max_wavelength,
                                                                 rope_scaling))
    if use_qk_norm:
        qk_norm.use_qk_norm(layer.tr_atten_tpl, rms_norm.clone())
    if experts is not None:
        moe.with_experts(lm.stacked_transformer_tpl, experts, experts_interval)
    return language_model(lm, fprop_dtype=fprop_dtype, init_std=init_std)
