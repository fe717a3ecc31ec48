"""Pieces every decoder family shares: the layer stack, the TransformerLm around it, an
output layer separate from the input embedding, the LanguageModel wrapper, and one
helper that finds the per-layer template inside a stack, repeated or not.

A family (layers/gpt.py, layers/llama.py) takes the stack from `transformer_stack`,
puts it in `transformer_lm`, configures the layer template it returns (norms,
attention, feed-forward) and wraps the result with `language_model`. Everything here
is unsharded: the runtime adds sharding last (paxloom/runner/state/partitioning.py), whatever
layer classes the template holds.
"""

import jax.numpy as jnp
from praxis import base_layer, pax_fiddle
from praxis.layers import (
    checkpoint_policy,
    embedding_softmax,
    models,
    transformer_models,
    transformers,
)

from layers.softmax import ChunkedFullSoftmax
from paxloom.core.mesh_axes import BATCH_AXES

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def gaussian(std: float) -> pax_fiddle.Config:
    return pax_fiddle.Config(base_layer.WeightInit, method="gaussian", scale=std)


def rematerialise(stack: pax_fiddle.Config, checkpoint_policy_name: str) -> None:
    """Pax's remat on a stack config, in place: a repeated stack always rematerialises each
    scanned block with the policy ("none" = save everything); a plain stack does so only
    when a policy other than "none" is named."""
    policy = checkpoint_policy.AutodiffCheckpointType(
        "save_everything" if checkpoint_policy_name == "none" else checkpoint_policy_name)
    if issubclass(stack.cls, transformers.StackedTransformerRepeated):
        stack.checkpoint_policy = policy
    elif checkpoint_policy_name != "none":  # else praxis's default: no remat
        stack.set(remat=True, checkpoint_policy=policy)


def transformer_stack(
    *,
    num_layers: int,
    model_dims: int,
    hidden_dims: int,
    num_heads: int,
    dims_per_head: int,
    packed_input: bool,
    use_repeated_layer: bool,
    checkpoint_policy_name: str,
    dropout: dict | None = None,
) -> pax_fiddle.Config:
    """A causal StackedTransformer (or one layer scanned NUM_LAYERS times), praxis defaults,
    rematerialised as the Pax configs do (`rematerialise`). `dropout`: StackedTransformer's
    dropout fields (dropout_prob, input_dropout_prob, atten_/residual_/relu_dropout_prob,
    which fall back to dropout_prob where None)."""
    stack = pax_fiddle.Config(
        transformers.StackedTransformer,
        num_layers=num_layers, model_dims=model_dims, hidden_dims=hidden_dims,
        num_heads=num_heads, dim_per_head=dims_per_head,
        mask_self_attention=True,  # causal
        packed_input=packed_input,
        **(dropout or {}),
    )
    if use_repeated_layer:
        # One layer's weights stacked NUM_LAYERS times and run under lax.scan: compile
        # time stays flat as the model gets deeper.
        stack.num_layers = 1
        stack = pax_fiddle.Config(transformers.StackedTransformerRepeated, block=stack,
                                  x_times=num_layers)
    rematerialise(stack, checkpoint_policy_name)
    return stack


def transformer_layer_template(stack: pax_fiddle.Config) -> pax_fiddle.Config:
    """The per-layer Transformer template of a stack config, repeated, pipelined or not."""
    if issubclass(stack.cls, transformers.PipelinedTransformer):
        stack = stack.pipeline_stage
    if issubclass(stack.cls, transformers.StackedTransformerRepeated):
        stack = stack.block
    return stack.transformer_layer_params_tpl


def pipelined(stack: pax_fiddle.Config, *, num_stages: int, circular_repeat: int = 1,
              num_microbatches: int | None = None, microbatch_size: int | None = None,
              stream_io: bool = False) -> pax_fiddle.Config:
    """`stack` split into `num_stages` x `circular_repeat` blocks of consecutive layers,
    run by praxis's PipelinedTransformer (GPipe, or the circular schedule when
    `circular_repeat` > 1), as paxml's TransformerLmSpmdPipelineAdam builds it.

    Each block is the stack itself with fewer layers, so every layer template (attention,
    norms, LoRA) and the remat policy carry over. The caller checks that the blocks
    divide the layers.
    """
    blocks = num_stages * circular_repeat
    stage = stack.clone()
    if issubclass(stack.cls, transformers.StackedTransformerRepeated):
        stage.x_times = stack.x_times // blocks
        block = stage.block
    else:
        stage.num_layers = stack.num_layers // blocks
        if stage.moe_layers:  # experts every Nth layer: a block's own indices (N divides it)
            stage.moe_layers = [i for i in stage.moe_layers if i < stage.num_layers]
        block = stage
    # praxis maps the layers of a stage over the stage axis (vmap): a layer that splits its
    # tokens over the batch axes itself (layers/moe.py, in shard_map) leaves that axis out.
    for template in (transformer_layer_template(stage).tr_fflayer_tpl,
                     getattr(block, "moe_layer_tpl", None)):
        if template is not None and hasattr(template.cls, "batch_axes"):
            template.batch_axes = tuple(a for a in BATCH_AXES if a != "stage")
    return pax_fiddle.Config(
        transformers.PipelinedTransformer,
        pipeline_stage=stage, num_pipeline_stages=num_stages, circular_repeat=circular_repeat,
        num_pipeline_microbatches=num_microbatches, pipeline_microbatch_size=microbatch_size,
        stream_io=stream_io,
        # Each pipeline iteration is rematerialised like one layer of the stack
        # (CHECKPOINT_POLICY; "none" saves everything).
        checkpoint_policy=stack.checkpoint_policy,
    )


def transformer_lm(stack: pax_fiddle.Config, *, model_dims: int, vocab_size: int,
                   packed_input: bool, **fields) -> pax_fiddle.Config:
    """praxis's TransformerLm around `stack`, with the family's own `fields` set."""
    return pax_fiddle.Config(
        transformer_models.TransformerLm,
        model_dims=model_dims,
        vocab_size=vocab_size,
        packed_input=packed_input,
        stacked_transformer_tpl=stack,
        **fields,
    )


def chunked_loss(loss_chunk_len: int) -> dict:
    """The softmax keywords of `loss_chunk_len` (layers/softmax.py): none when it is 0.
    Chunking changes how the training loss is computed, not the layer's parameters."""
    return {"loss_chunk_len": loss_chunk_len} if loss_chunk_len else {}


def separate_softmax(lm: pax_fiddle.Config, *, loss_chunk_len: int, softmax_init_std: float,
                     embedding_lookup_style: str, soft_cap_logits: float | None = None) -> None:
    """`lm`'s input embedding and output softmax as two layers (paxml's SEPARATE_EMBEDDING,
    Llama's): an Embedding without sqrt(depth) scaling and a FullSoftmax without bias,
    its own Gaussian init (`softmax_init_std`), its training loss chunked when
    `loss_chunk_len` > 0."""
    vocab_size, model_dims = lm.vocab_size, lm.model_dims
    chunked = chunked_loss(loss_chunk_len)
    lm.separate_embedding_tpl = pax_fiddle.Config(
        embedding_softmax.Embedding, num_classes=vocab_size, input_dims=model_dims,
        scale_sqrt_depth=False, lookup_style=embedding_lookup_style)
    lm.softmax_tpl = pax_fiddle.Config(
        ChunkedFullSoftmax if chunked else embedding_softmax.FullSoftmax, **chunked,
        num_classes=vocab_size, input_dims=model_dims,
        soft_cap_logits=soft_cap_logits, params_init=gaussian(softmax_init_std))
    lm.softmax_tpl.feed_forward_tpl.has_bias = False


def language_model(lm: pax_fiddle.Config, *, fprop_dtype: str, init_std: float
                   ) -> pax_fiddle.Config:
    """The praxis LanguageModel around a TransformerLm config.

    Parameters are float32 and `fprop_dtype` is the compute dtype. `init_std` is
    the default Gaussian init of every weight that does not name its own (praxis
    passes `params_init` down to child layers).
    """
    return pax_fiddle.Config(
        models.LanguageModel,
        name="lm",
        lm_tpl=lm,
        fprop_dtype=DTYPES[fprop_dtype],
        dtype=jnp.float32,
        params_init=gaussian(init_std),
        # Pax GPU configs: evaluation honours per-example `eval_sample_weights` when given.
        apply_eval_sample_weights=True,
    )
