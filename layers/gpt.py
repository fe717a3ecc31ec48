"""The GPT-3-style praxis TransformerLm used by every experiment.

GPT-3 choices (as in the Pax GPU configs): learned position embeddings, GELU,
biases everywhere, pre-LayerNorm (epsilon 1e-5, statistics in float32), Gaussian
init, tied input/output embedding, 1/sqrt(head dim) attention scaling.
Parameters are float32; `fprop_dtype` is the compute dtype.
"""

import jax.numpy as jnp
from praxis import base_layer, pax_fiddle
from praxis.layers import (
    activations,
    checkpoint_policy,
    embedding_softmax,
    models,
    transformer_models,
    transformers,
)

MESH_AXIS_NAMES = ("replica", "data", "mdl")  # = DP, FSDP, TP

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def gpt_model_config(
    *,
    num_layers: int,
    model_dims: int,
    hidden_dims: int,
    num_heads: int,
    dims_per_head: int,
    vocab_size: int,
    max_seq_len: int,
    use_repeated_layer: bool = False,
    checkpoint_policy_name: str = "save_nothing",
    fprop_dtype: str = "float32",
    init_std: float = 0.02,
    layernorm_epsilon: float = 1e-5,
    packed_input: bool = True,
    mesh_shape: tuple[int, int, int] = (1, 1, 1),
) -> pax_fiddle.Config:
    """A praxis LanguageModel config, sharded over `mesh_shape` (replica, data, mdl).

    `mesh_shape` is the full device mesh (ICI x DCN per axis); weights are laid
    out on (data, mdl) and replicated over replica; activations are split on the
    batch over (replica, data) and on the model dimensions over mdl.
    """
    lm = pax_fiddle.Config(
        transformer_models.TransformerLm,
        model_dims=model_dims,
        vocab_size=vocab_size,
        packed_input=packed_input,
    )
    lm.position_emb_tpl = pax_fiddle.Config(
        embedding_softmax.TrainablePositionalEmbedding, max_seq_length=max_seq_len
    )
    lm.softmax_tpl = pax_fiddle.Config(
        embedding_softmax.GShardSharedEmbeddingSoftmax,
        num_classes=vocab_size,
        input_dims=model_dims,
        soft_cap_logits=None,
    )
    lm.final_ln_tpl.epsilon = layernorm_epsilon

    block = pax_fiddle.Config(
        transformers.StackedTransformer,
        num_layers=num_layers,
        model_dims=model_dims,
        hidden_dims=hidden_dims,
        num_heads=num_heads,
        dim_per_head=dims_per_head,
        mask_self_attention=True,  # causal
        packed_input=packed_input,
    )
    policy = checkpoint_policy.AutodiffCheckpointType(
        "save_everything" if checkpoint_policy_name == "none" else checkpoint_policy_name
    )
    if use_repeated_layer:
        # One layer's weights stacked NUM_LAYERS times and run under lax.scan:
        # compile time stays flat as the model gets deeper.
        block.num_layers = 1
        lm.stacked_transformer_tpl = pax_fiddle.Config(
            transformers.StackedTransformerRepeated,
            block=block,
            x_times=num_layers,
            checkpoint_policy=policy,
        )
    else:
        block.remat = checkpoint_policy_name != "none"
        block.checkpoint_policy = policy
        lm.stacked_transformer_tpl = block

    layer = transformer_layer_template(lm)
    layer.ln_tpl.epsilon = layernorm_epsilon
    layer.tr_fflayer_tpl.ln_tpl.epsilon = layernorm_epsilon
    layer.tr_fflayer_tpl.activation_tpl = pax_fiddle.Config(activations.GELU)
    layer.tr_fflayer_tpl.has_bias = True
    layer.tr_atten_tpl.use_bias = True
    # Plain 1/sqrt(head dim) query scaling, as GPT, not praxis's learned per-dim scale.
    layer.tr_atten_tpl.internal_enable_per_dim_scale = False

    lm = transformer_models.TransformerLm.set_sharding_params_v1(
        lm,
        replica_axis=MESH_AXIS_NAMES[0],
        data_axis=MESH_AXIS_NAMES[1],
        mdl_axis=MESH_AXIS_NAMES[2],
        ici_mesh_shape=list(mesh_shape),
        dcn_mesh_shape=None,
        mesh_axis_names=list(MESH_AXIS_NAMES),
        training_optimized=True,
    )
    model = pax_fiddle.Config(
        models.LanguageModel,
        name="lm",
        lm_tpl=lm,
        ici_mesh_shape=list(mesh_shape),
        mesh_axis_names=list(MESH_AXIS_NAMES),
        fprop_dtype=_DTYPES[fprop_dtype],
        dtype=jnp.float32,
        params_init=pax_fiddle.Config(base_layer.WeightInit, method="gaussian", scale=init_std),
    )
    return model


def transformer_layer_template(lm: pax_fiddle.Config) -> pax_fiddle.Config:
    """The per-layer Transformer template of a TransformerLm config, repeated or not."""
    stack = lm.stacked_transformer_tpl
    if issubclass(stack.cls, transformers.StackedTransformerRepeated):
        stack = stack.block
    return stack.transformer_layer_params_tpl
