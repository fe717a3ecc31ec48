"""The decoder's forward pass in plain JAX with a key/value cache, for generation.

It computes what praxis's TransformerLm computes (tests/test_decode.py checks logits and
greedy continuations against praxis's own forward pass), from the canonical weights of
layers/architecture.py. praxis 1.4.0 has incremental decoding too (`extend_step`), but
it keeps its cache in flax variable collections driven step by step from Python, and
DESIGN.md lists its multi-query decoding among what newer jax broke; here prefill and
every step run as one jitted loop (paxloom/runner/inference/generate.py).

A mixture-of-experts layer (layers/moe.py) routes each token as praxis does (moe.route:
softmax over all experts in float32, top k, renormalised if the model does) and runs
every expert on every token, weighting each output by the token's routing weight (zero
for the experts it did not choose): E / k times the routed work, which decoding's few
tokens can afford, and no sorting or grouping to get wrong.

Slots and positions: the cache holds S slots per row. Prompts of one batch are left-padded
to a common length, so row b's tokens start at slot `first_slot[b]`, and a token's position
(its learned-table row or RoPE angle) is its slot minus `first_slot[b]`: every sequence
starts at position 0, as in training. Keys before `first_slot[b]` are never attended to.
"""

import jax
import jax.numpy as jnp

from layers import rope
from layers.architecture import Architecture, Norm
from layers.moe import route

# Added to masked attention logits; finite, so a row that attends to nothing (a padding
# query) gives a uniform softmax instead of NaN. As praxis's py_utils.get_large_negative_number.
_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)

_ACTIVATIONS = {
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "silu": jax.nn.silu,
    "relu": jax.nn.relu,
}


def init_cache(arch: Architecture, batch: int, slots: int, dtype) -> list[dict]:
    """Per layer, keys and values [B, S, kv heads, H], zero."""
    shape = (batch, slots, arch.num_kv_heads, arch.dims_per_head)
    return [{"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
            for _ in range(arch.num_layers)]


def _norm(x, weights: dict, norm: Norm):
    """LayerNorm or RMSNorm over the last axis, reductions in float32 (as the models here
    configure praxis: reductions_in_fp32 / RmsNorm in fp32)."""
    x32 = x.astype(jnp.float32)
    if norm.kind == "layer_norm":
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + norm.epsilon)
    else:
        y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + norm.epsilon)
    y = y.astype(x.dtype) * weights["scale"]
    return y + weights["bias"] if "bias" in weights else y


def _rope(x, positions, arch: Architecture):
    """x [B, T, N, H] rotated by position [B, T] as the model's rotary embedding layer
    rotates it (praxis's, or layers/rope.py's with scaled frequencies)."""
    timescale, attention_factor = rope.timescales(
        arch.dims_per_head, arch.rope_min_timescale, arch.rope_max_timescale,
        arch.rope_scaling)
    return rope.rotate(x, positions, timescale, attention_factor).astype(x.dtype)


def _project(h, weights: dict, name: str):
    """h [B, T, D] x w [D, heads, H] (+ bias [heads, H]) -> [B, T, heads, H]."""
    out = jnp.einsum("btd,dnh->btnh", h, weights[name])
    return out + weights[f"{name}_bias"] if f"{name}_bias" in weights else out


def _dense(h, weights: dict, name: str):
    out = h @ weights[name]
    return out + weights[f"{name}_bias"] if f"{name}_bias" in weights else out


def _attention(x, layer: dict, layer_cache: dict, arch: Architecture, positions, start,
               allowed):
    """Pre-norm self-attention of x [B, T, D] over the cache; returns (x + attention, cache)."""
    batch, length = x.shape[:2]
    h = _norm(x, layer["attention_norm"], arch.attention_norm)
    q, k, v = (_project(h, layer, name) for name in "qkv")  # [B, T, heads, H]
    if arch.qk_norm is not None:  # each head's queries and keys, before RoPE (QK-norm)
        q, k = _norm(q, layer["q_norm"], arch.qk_norm), _norm(k, layer["k_norm"], arch.qk_norm)
    if arch.positions == "rotary":
        q, k = _rope(q, positions, arch), _rope(k, positions, arch)
    q = q * jnp.asarray(arch.query_scale, q.dtype)
    keys = jax.lax.dynamic_update_slice(layer_cache["k"], k.astype(layer_cache["k"].dtype),
                                        (0, start, 0, 0))  # [B, S, K, H]
    values = jax.lax.dynamic_update_slice(layer_cache["v"], v.astype(layer_cache["v"].dtype),
                                          (0, start, 0, 0))
    # Grouped-query attention: query head n uses key/value head n // (N / K), as praxis's
    # MultiQueryDotProductAttention groups them (and Hugging Face's repeat_kv).
    group = arch.num_heads // arch.num_kv_heads
    q = q.reshape(batch, length, arch.num_kv_heads, group, arch.dims_per_head)
    logits = jnp.einsum("btkgh,bskh->bkgts", q, keys).astype(jnp.float32)
    logits = jnp.where(allowed[:, None, None], logits, _MASKED)  # allowed [B, T, S]
    probs = jax.nn.softmax(logits, axis=-1).astype(values.dtype)
    context = jnp.einsum("bkgts,bskh->btkgh", probs, values).reshape(
        batch, length, arch.num_heads, arch.dims_per_head)
    out = jnp.einsum("btnh,dnh->btd", context.astype(x.dtype), layer["o"])
    if "o_bias" in layer:
        out = out + layer["o_bias"]
    return x + out, {"k": keys, "v": values}


def _mlp(x, layer: dict, arch: Architecture):
    h = _norm(x, layer["mlp_norm"], arch.mlp_norm)
    activation = _ACTIVATIONS[arch.activation]
    if arch.gated_mlp:
        hidden = activation(_dense(h, layer, "gate")) * _dense(h, layer, "up")
    else:
        hidden = activation(_dense(h, layer, "up"))
    return x + _dense(hidden, layer, "down")


def _mixture(x, layer: dict, arch: Architecture):
    """x + the mixture of experts of norm(x), x [B, T, D] (see the module docstring)."""
    experts = arch.experts
    h = _norm(x, layer["mlp_norm"], arch.mlp_norm)
    activation = _ACTIVATIONS[arch.activation]
    logits = jnp.einsum("btd,de->bte", h.astype(jnp.float32),
                        layer["router"].astype(jnp.float32))
    gates, chosen, _ = route(logits, experts.per_token, experts.renormalize)  # [B, T, k]
    combine = jnp.sum(jax.nn.one_hot(chosen, experts.num_experts, dtype=jnp.float32)
                      * gates[..., None], axis=-2)  # [B, T, E]

    def expert(total, one):
        gate, up, down, share = one
        out = (activation(h @ gate) * (h @ up)) @ down  # [B, T, D]
        return total + share[..., None] * out.astype(jnp.float32), None

    # One expert at a time (a scan): memory for one expert's hidden layer, not E.
    out, _ = jax.lax.scan(expert, jnp.zeros(x.shape, jnp.float32), (
        layer["expert_gate"], layer["expert_up"], layer["expert_down"],
        jnp.moveaxis(combine, -1, 0)))
    out = out.astype(x.dtype)
    if experts.shared_hidden_dims:
        shared = (activation(h @ layer["shared_gate"]) * (h @ layer["shared_up"])
                  ) @ layer["shared_down"]
        if experts.gate_shared_expert:
            shared = shared * jax.nn.sigmoid(h @ layer["shared_expert_gate"])
        out = out + shared
    return x + out


def forward(arch: Architecture, weights: dict, tokens, positions, cache: list[dict], start,
            first_slot):
    """Run tokens [B, T] that occupy cache slots start .. start+T-1, at positions [B, T].

    `first_slot` [B]: each row's first real slot (left padding before it is masked).
    Returns (hidden states [B, T, D] after the final norm, the updated cache).
    """
    x = weights["embed"][tokens]  # [B, T, D]
    if arch.embedding_scale != 1.0:
        x = x * jnp.asarray(arch.embedding_scale, x.dtype)
    if arch.positions == "learned":
        table = weights["positions"]  # finished rows may run past the table: their output is unused
        x = x + table[jnp.clip(positions, 0, table.shape[0] - 1)]
    slots = cache[0]["k"].shape[1]
    query_slot = start + jnp.arange(tokens.shape[1])  # [T]
    key_slot = jnp.arange(slots)  # [S]
    allowed = ((key_slot[None, None, :] <= query_slot[None, :, None])
               & (key_slot[None, None, :] >= first_slot[:, None, None]))  # [B, T, S]
    new_cache = []
    for i, (layer, layer_cache) in enumerate(zip(weights["layers"], cache, strict=True)):
        x, layer_cache = _attention(x, layer, layer_cache, arch, positions, start, allowed)
        x = _mixture(x, layer, arch) if i in arch.moe_layers else _mlp(x, layer, arch)
        new_cache.append(layer_cache)
    if arch.final_norm is not None:
        x = _norm(x, weights["final_norm"], arch.final_norm)
    return x, new_cache


def logits(weights: dict, hidden):
    """Output logits [..., V] in float32 of hidden states [..., D]."""
    return _dense(hidden, weights, "unembed").astype(jnp.float32)
