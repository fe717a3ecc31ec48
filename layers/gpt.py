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
from praxis.layers import activations, embedding_softmax

from layers.softmax import ChunkedSharedEmbeddingSoftmax
from layers.stack import (
    chunked_loss,
    gaussian,
    language_model,
    separate_softmax,
    transformer_layer_template,
    transformer_lm,
)


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
    activation: str | type = "GELU",
    use_gated_activation: bool = False,
    use_bias: bool = True,
    atten_logit_cap: float = -1.0,
    separate_embedding: bool = False,
    trainable_position_emb: bool = True,
    trainable_pe_max_seq_len: int | None = None,
    combine_qkv: bool = True,
    softmax_cap_logits: float | None = None,
) -> pax_fiddle.Config:
    """The unsharded praxis LanguageModel config of a GPT around `stack` (layers.stack).

    The keywords after `loss_chunk_len` are Pax's architecture hyperparameters
    (ACTIVATION_CLS, USE_GATED_ACTIVATION, USE_BIAS, ATTEN_LOGIT_CAP, SEPARATE_EMBEDDING,
    TRAINABLE_POSITION_EMB, TRAINABLE_PE_MAX_SEQ_LEN, COMBINE_QKV, SOFTMAX_CAP_LOGITS), set
    where paxml's TransformerLmSpmdAdafactor/Adam and configure_gpt3_task set them; their
    defaults are the Pax GPU configs' values.
    """
    lm = transformer_lm(stack, model_dims=model_dims, vocab_size=vocab_size,
                        packed_input=packed_input)
    if trainable_position_emb:
        lm.position_emb_tpl = pax_fiddle.Config(
            embedding_softmax.TrainablePositionalEmbedding,
            max_seq_length=trainable_pe_max_seq_len or max_seq_len,
            lookup_style=embedding_lookup_style,
        )
    else:  # Pax leaves praxis TransformerLm's default: sinusoidal positions
        lm.position_emb_tpl = pax_fiddle.Config(embedding_softmax.PositionalEmbedding)
    _set_softmax(lm, separate_embedding=separate_embedding, loss_chunk_len=loss_chunk_len,
                 softmax_cap_logits=softmax_cap_logits, softmax_init_std=softmax_init_std,
                 embedding_lookup_style=embedding_lookup_style)
    lm.final_ln_tpl.set(epsilon=layernorm_epsilon, reductions_in_fp32=True)

    layer = transformer_layer_template(stack)
    layer.ln_tpl.set(epsilon=layernorm_epsilon, reductions_in_fp32=True)
    ffn = layer.tr_fflayer_tpl
    ffn.ln_tpl.set(epsilon=layernorm_epsilon, reductions_in_fp32=True)
    activation_cls = activation_class(activation)
    ffn.activation_tpl = pax_fiddle.Config(activation_cls)
    if issubclass(activation_cls, activations.GELU):  # configure_gpt3_task's tanh GELU
        ffn.activation_tpl.approximate = True
    ffn.use_gated_activation = use_gated_activation
    ffn.has_bias = True
    layer.tr_atten_tpl.set(
        use_bias=use_bias,
        combine_qkv=combine_qkv,
        internal_enable_per_dim_scale=False,
        atten_logit_cap=atten_logit_cap,  # the reference's ATTEN_LOGIT_CAP: -1, disabled
    )
    return language_model(lm, fprop_dtype=fprop_dtype, init_std=init_std)


def _set_softmax(lm: pax_fiddle.Config, *, separate_embedding: bool, loss_chunk_len: int,
                 softmax_cap_logits: float | None, softmax_init_std: float,
                 embedding_lookup_style: str) -> None:
    """The output softmax, tied to the input embedding (Pax's GPT) or separate from it."""
    if separate_embedding:  # paxml: Embedding in, FullSoftmax out, no sqrt(depth) scaling
        separate_softmax(lm, loss_chunk_len=loss_chunk_len, softmax_init_std=softmax_init_std,
                         embedding_lookup_style=embedding_lookup_style,
                         soft_cap_logits=softmax_cap_logits or None)
        return
    chunked = chunked_loss(loss_chunk_len)
    lm.softmax_tpl = pax_fiddle.Config(
        ChunkedSharedEmbeddingSoftmax if chunked else embedding_softmax.SharedEmbeddingSoftmax,
        **chunked,
        num_classes=lm.vocab_size,
        input_dims=lm.model_dims,
        scale_sqrt_depth=False,
        soft_cap_logits=softmax_cap_logits or None,  # Pax: None or 0 is no cap
        lookup_style=embedding_lookup_style,
        params_init=gaussian(softmax_init_std),
    )
    lm.softmax_tpl.feed_forward_tpl.has_bias = False


def activation_class(activation: str | type) -> type:
    """ACTIVATION_CLS as a praxis activation class: a class (as Pax's `layers.GELU`), the
    name of one in praxis.layers.activations (any case: "GELU", "relu", "SiLU") or an
    importable "module.Class". ValueError (one line) otherwise."""
    import importlib

    if isinstance(activation, str):
        known = activation_names()
        if "." in activation:
            module_name, _, name = activation.rpartition(".")
            try:
                activation = getattr(importlib.import_module(module_name), name)
            except (ImportError, AttributeError) as e:
                raise ValueError(f"ACTIVATION_CLS={activation!r} cannot be imported ({e})"
                                 ) from None
        elif activation.lower() in known:
            activation = known[activation.lower()]
        else:
            from paxloom.core.errors import near_matches

            names = sorted(cls.__name__ for cls in known.values())
            raise ValueError(f"ACTIVATION_CLS={activation!r} is not a praxis activation"
                             f"{near_matches(activation, names)} (one of {', '.join(names)})")
    if not (isinstance(activation, type) and issubclass(activation, activations.BaseActivation)):
        raise ValueError(f"ACTIVATION_CLS={activation!r} is not a subclass of praxis's "
                         f"activations.BaseActivation")
    return activation


def activation_names() -> dict[str, type]:
    """praxis.layers.activations' classes by lower-case name."""
    return {cls.__name__.lower(): cls for cls in vars(activations).values()
            if isinstance(cls, type) and issubclass(cls, activations.BaseActivation)
            and cls is not activations.BaseActivation}
