"""The GPT of the Pax GPU configs (paxml/contrib/gpu/scripts_gpu/configs.py) on praxis.

What `configure_gpt3_task` and `GPT126M.task()` there set, on top of paxml's
TransformerLmSpmdAdafactor/TransformerLmSpmdAdam model:
- tied input/output embedding: `SharedEmbeddingSoftmax`, its own Gaussian init
  (SOFTMAX_INIT_STD), no sqrt(depth) scaling of the embedding, no logit scaling,
  no softmax bias, no logit soft cap;
- learned position embeddings;
- pre-LayerNorm everywhere (epsilon 1e-5) with reductions in float32;
- attention with biases, combined QKV projection, plain 1/sqrt(head dim) query
  scaling (`internal_enable_per_dim_scale=False`), no attention logit cap;
- feed-forward with biases and tanh-approximated GELU.
Embedding lookups are one-hot matmuls as in the reference (`EMBEDDING_LOOKUP_STYLE`).
With `loss_chunk_len` > 0 the tied softmax is layers/softmax.py's subclass, whose training
cross-entropy runs over chunks of the sequence (same parameters, same loss).
"""

from praxis import pax_fiddle
from praxis.layers import activations, embedding_softmax, transformer_models

from layers.softmax import ChunkedSharedEmbeddingSoftmax
from layers.stack import gaussian, language_model, transformer_layer_template


def gpt_model(
    stack: pax_fiddle.Config,
    *,
    model_dims: int,
    vocab_size: int,
    max_seq_len: int,
    packed_input: bool,
    fprop_dtype: str,
    init_std: float,
    softmax_init_std: float,
    layernorm_epsilon: float,
    embedding_lookup_style: str = "matmul",
    loss_chunk_len: int = 0,
) -> pax_fiddle.Config:
    """The unsharded praxis LanguageModel config of a GPT around `stack` (layers.stack)."""
    lm = pax_fiddle.Config(
        transformer_models.TransformerLm,
        model_dims=model_dims,
        vocab_size=vocab_size,
        packed_input=packed_input,
        stacked_transformer_tpl=stack,
    )
    lm.position_emb_tpl = pax_fiddle.Config(
        embedding_softmax.TrainablePositionalEmbedding,
        max_seq_length=max_seq_len,
        lookup_style=embedding_lookup_style,
    )
    # Chunking changes how the training loss is computed, not the layer's parameters.
    chunked = {"loss_chunk_len": loss_chunk_len} if loss_chunk_len else {}
    lm.softmax_tpl = pax_fiddle.Config(
        ChunkedSharedEmbeddingSoftmax if chunked else embedding_softmax.SharedEmbeddingSoftmax,
        **chunked,
        num_classes=vocab_size,
        input_dims=model_dims,
        scale_sqrt_depth=False,
        soft_cap_logits=None,
        lookup_style=embedding_lookup_style,
        params_init=gaussian(softmax_init_std),
    )
    lm.softmax_tpl.feed_forward_tpl.has_bias = False
    lm.final_ln_tpl.set(epsilon=layernorm_epsilon, reductions_in_fp32=True)

    layer = transformer_layer_template(stack)
    layer.ln_tpl.set(epsilon=layernorm_epsilon, reductions_in_fp32=True)
    ffn = layer.tr_fflayer_tpl
    ffn.ln_tpl.set(epsilon=layernorm_epsilon, reductions_in_fp32=True)
    ffn.activation_tpl = pax_fiddle.Config(activations.GELU, approximate=True)
    ffn.has_bias = True
    layer.tr_atten_tpl.set(
        use_bias=True,
        combine_qkv=True,
        internal_enable_per_dim_scale=False,
        atten_logit_cap=-1.0,  # the reference's ATTEN_LOGIT_CAP: disabled
    )
    return language_model(lm, fprop_dtype=fprop_dtype, init_std=init_std)
