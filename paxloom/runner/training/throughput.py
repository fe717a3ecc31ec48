"""Model FLOPs utilisation (MFU).

FLOPs per token follow PaLM (Chowdhery et al. 2022), appendix B:
    6 * N + 12 * L * H * Q * T
N: parameters taking part in matmuls (all but the position embedding, which is
   a lookup; the tied token embedding counts once, for the output projection),
L: layers, H: heads, Q: head dimension, T: sequence length. The first term is
the dense matmuls forward and backward, the second attention's score and value
matmuls. Rematerialisation is not counted (that would be hardware FLOPs).

In a mixture of experts, N counts the parameters a token uses ("active" parameters, as
MaxText and Megatron report MoE MFU): each expert weight times the share of experts a
token goes to (k / E); the router and shared experts count whole. The all_to_all and
routing are not FLOPs of the model.
"""

import re

import jax

from layers import fp8, moe
from paxloom.runner.state.checkpoints import param_path

# Dense peak FLOP/s per device for the compute dtype, from the vendors' data
# sheets (no sparsity). Keys are matched as substrings of `device.device_kind`.
PEAK_FLOPS_BF16 = {
    "H200": 989e12,
    "H100": 989e12,  # SXM; PCIe parts are lower, override with --peak_tflops
    "A100": 312e12,
    "L40S": 362e12,
    "V100": 125e12,
    "TPU v4": 275e12,
    "TPU v5": 459e12,
}


def flops_per_token(*, num_params: int, num_layers: int, num_heads: int, dims_per_head: int,
                    seq_len: int) -> float:
    return 6.0 * num_params + 12.0 * num_layers * num_heads * dims_per_head * seq_len


def peak_flops_per_device(device: jax.Device | None = None, override_tflops: float = 0.0) -> float:
    """Peak FLOP/s of one device, or 0.0 when unknown (then MFU is not reported)."""
    if override_tflops > 0:
        return override_tflops * 1e12
    kind = (device or jax.devices()[0]).device_kind
    for name, flops in PEAK_FLOPS_BF16.items():
        if name.lower() in kind.lower():
            return flops
    return 0.0


def matmul_param_count(params, expert_share: float = 1.0) -> int:
    """Parameters counted in N above: everything except the position embedding table and
    USE_FP8's scaling state (amax histories and scales, no matmul's operands), the experts'
    weights times `expert_share` (k / E)."""
    scaling_state = re.compile(fp8.SCALING_STATE_RULE)
    total = 0.0
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        name = param_path(path)
        if "position_emb" in name or scaling_state.match(name):
            continue
        expert = "ff_layer" in name and name.rsplit("/", 1)[-1] in moe.EXPERT_WEIGHTS
        total += leaf.size * (expert_share if expert else 1.0)
    return round(total)
