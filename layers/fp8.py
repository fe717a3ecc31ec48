"""FP8 matmuls with delayed scaling for the transformer's projections (USE_FP8).

`use_fp8(model)` swaps the einsum of the layers that hold the transformer's large matmuls
(the attention's q/k/v (or combined QKV) and output projections, and the feed-forward
projections) for `Fp8Einsum`: both operands are quantized to float8_e4m3fn, the gradient
flowing back to float8_e5m2, and the dot-generals run on the float8 values (flax's
`fp8_ops.fp8_scaled_dot_general`; on Hopper, XLA lowers them to cuBLASLt FP8 GEMMs).
Everything else stays in the compute dtype: embedding, softmax, norms, the attention
scores and probabilities (the delicate parts, as in Transformer Engine).

Scaling is delayed, as Transformer Engine's default recipe: each quantized tensor (input,
kernel, output gradient) keeps the absolute maxima of its last AMAX_HISTORY_LENGTH steps
and a scale computed from their maximum, so no step waits for its own max-abs reduction.
That state is parameters tagged with praxis's OVERWRITE_WITH_GRADIENT collection: the
backward pass returns each one's next value as its "gradient", and the optimizer writes
it in place of an update (paxloom/runner/state/optimizer.py, overwrite_with_gradient). So it is
checkpointed, restored and resharded with the parameters. Its paths match
SCALING_STATE_RULE. The scales are global (replicated): an amax is the maximum over the
whole tensor, across every shard, so FSDP and tensor parallelism change no number.
"""

import functools

import jax.numpy as jnp
from flax.linen import fp8_ops
from praxis import base_layer, pax_fiddle

from layers.stack import transformer_layer_template
from paxloom.core import target

# Transformer Engine's and praxis's default (praxis injection.fp8_nvidia_gpu).
AMAX_HISTORY_LENGTH = 1024

_SCALING_STATE = ("input_scale", "kernel_scale", "output_grad_scale", "input_amax_history",
                  "kernel_amax_history", "output_grad_amax_history")
# The scaling state's parameter paths (checkpoints.param_path), e.g.
# "lm/transformer/x_layers_0/ff_layer/ffn_layer1/linear/einsum/kernel_scale".
SCALING_STATE_RULE = rf"^.*/einsum/({'|'.join(_SCALING_STATE)})$"

# The templates (of a transformer layer's attention and feed-forward) whose einsum is a
# large matmul: praxis's AttentionProjection, CombinedQKVProjectionLayer,
# OneHeadedAttentionProjection (grouped-query k/v) and Linear.
_ATTENTION_PROJECTIONS = ("proj_tpl", "combined_qkv_proj_tpl", "headless_proj_tpl")


class Fp8Einsum(base_layer.BaseLayer):
    """praxis's EinsumOp(equation, inputs, weight) with both operands in float8_e4m3fn and
    the output gradient in float8_e5m2, each with a delayed scale."""

    amax_history_length: int = AMAX_HISTORY_LENGTH

    def setup(self) -> None:
        owg = base_layer.WeightHParamsCollection.OVERWRITE_WITH_GRADIENT
        for name in _SCALING_STATE:
            history = name.endswith("amax_history")
            self.create_variable(name, base_layer.WeightHParams(
                shape=[self.amax_history_length if history else 1],
                init=base_layer.WeightInit.Constant(0.0 if history else 1.0),
                dtype=jnp.float32, mesh_shape=self.mesh_shape,
                tensor_split_dims_mapping=None, collections=[owg]))

    def __call__(self, equation: str, inputs, weight):
        # The scaling state in float32, as stored: `self.theta` would cast it to the compute
        # dtype, and bfloat16 amaxes and scales would round each step's update.
        state = {name: self.get_variable(base_layer.PARAMS, name) for name in _SCALING_STATE}
        # The weight arrives in the compute dtype (praxis casts it); quantize from there.
        dot_general = functools.partial(
            fp8_ops.fp8_scaled_dot_general,
            lhs_scale=state["input_scale"], rhs_scale=state["kernel_scale"],
            grad_scale=state["output_grad_scale"],
            lhs_amax_history=state["input_amax_history"],
            rhs_amax_history=state["kernel_amax_history"],
            grad_amax_history=state["output_grad_amax_history"],
            quantize_compute_type=weight.dtype)
        return jnp.einsum(equation, inputs.astype(weight.dtype), weight,
                          _dot_general=dot_general)


def has_fp8_tensor_cores(devices) -> bool:
    """Whether every one of these GPU devices has compute capability 8.9 (Ada) or more."""
    return target.of_devices(devices).fp8_tensor_cores


def use_fp8(model: pax_fiddle.Config) -> pax_fiddle.Config:
    """The LanguageModel template `model` (unsharded) with Fp8Einsum in every transformer
    layer's projections and feed-forward matmuls; changed in place and returned."""
    layer = transformer_layer_template(model.lm_tpl.stacked_transformer_tpl)
    fp8_einsum = pax_fiddle.Config(Fp8Einsum)
    for name in _ATTENTION_PROJECTIONS:
        projection = getattr(layer.tr_atten_tpl, name, None)
        if projection is not None:
            projection.einsum_tpl = fp8_einsum.clone()
    layer.tr_fflayer_tpl.fflayer_tpl.linear_tpl.einsum_tpl = fp8_einsum.clone()
    return model
