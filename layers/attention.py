"""Fused attention: praxis's DotProductAttention with the scores-softmax-context step done
by one kernel, chosen by ATTENTION_IMPL. Same parameters, so checkpoints move freely
between implementations.

praxis computes attention as separate einsums around a float32 softmax, materialising
[B, heads, T, T] scores (and a dense [B, 1, T, T] mask) per layer. The implementations:

- "praxis": praxis's own DotProductAttention, unchanged.
- "xla":    jax.nn.dot_product_attention's XLA path with praxis's mask as a bias. Exact
            for every mask; materialises the scores like praxis (the portable reference).
- "cudnn":  jax.nn.dot_product_attention's cuDNN kernel, causal only: it cannot take
            segment ids (a boolean mask becomes a bias whose gradient cuDNN refuses for
            batch > 1, jax#23701), so it is exact only without packing (PACKED_INPUT=False).
            GPU, bf16/fp16, head dim <= 256.
- "pallas": jax's Pallas flash-attention kernel (jax.experimental.pallas.ops.gpu.attention),
            causal with segment ids: exact for packed rows. Run per device under shard_map
            (Pallas kernels are not partitioned by XLA). On CPU it runs in interpret mode,
            which is slow and meant for tests.
- "auto":   on a GPU, "pallas" with packing and "cudnn" without; elsewhere "praxis".
"""

import functools

import fiddle as fdl
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P
from praxis import py_utils
from praxis.layers import attentions


class FusedDotProductAttention(attentions.DotProductAttention):
    """DotProductAttention whose `_dot_atten` is one fused call (module docstring).

    Attributes:
      attention_impl: "xla", "cudnn" or "pallas".
      pallas_interpret: run the Pallas kernel in interpret mode (no GPU).
    """

    attention_impl: str = "xla"
    pallas_interpret: bool = False

    def _dot_atten(self, query, key, value, atten_mask, relative_bias=None):
        """query [B, T, N, H], key/value [B, S, N, H], atten_mask [B|1, 1, T|1, S] (additive,
        large negative where masked) -> (encoded [B, T, N, H], None: no probabilities)."""
        if relative_bias is not None or (self.atten_logit_cap or 0) > 0:
            raise NotImplementedError(
                f"ATTENTION_IMPL={self.attention_impl!r} has no relative bias or logit cap")
        query, key, value = (self._shard_blnh(x) for x in (query, key, value))
        query = self._scale_query(query)  # so every kernel below runs with scale 1
        if self.attention_impl == "xla":
            encoded = jax.nn.dot_product_attention(
                query, key, value, bias=atten_mask.astype(query.dtype), scale=1.0,
                implementation="xla")
        elif self.attention_impl == "cudnn":
            encoded = jax.nn.dot_product_attention(
                query, key, value, scale=1.0, is_causal=True, implementation="cudnn")
        elif self.attention_impl == "pallas":
            encoded = self._pallas(query, key, value, segment_ids_from_mask(atten_mask,
                                                                            query.shape[0]))
        else:
            raise ValueError(f"unknown attention_impl {self.attention_impl!r}")
        encoded = checkpoint_name(encoded, "context")  # remat policies name it, as praxis
        return self._shard_blnh(encoded), None

    def _pallas(self, query, key, value, segment_ids):
        from jax.experimental.pallas.ops.gpu import attention as pallas_attention

        # jax's default blocks (128 forward, 32 backward), shrunk for short test sequences.
        block, backward_block = min(128, query.shape[1]), min(32, query.shape[1])
        kernel = functools.partial(
            pallas_attention.mha, sm_scale=1.0, causal=True, interpret=self.pallas_interpret,
            block_sizes=pallas_attention.BlockSizes(
                block_q=block, block_k=block, block_q_dkv=backward_block,
                block_kv_dkv=backward_block, block_q_dq=backward_block,
                block_kv_dq=backward_block))
        blnh = self.activation_split_dims_mapping.blnh
        if not self.mesh_axis_names or blnh is None:
            return kernel(query, key, value, segment_ids)
        # Each device runs the kernel on its own batch rows and heads.
        # Auto axes, like the runner's Mesh (jax 0.11's AbstractMesh defaults to Explicit
        # axes, with which shard_map demands inputs already typed with these specs).
        mesh = jax.sharding.AbstractMesh(
            tuple(self.mesh_shape), tuple(self.mesh_axis_names),
            axis_types=(jax.sharding.AxisType.Auto,) * len(self.mesh_axis_names))
        qkv_spec = P(*blnh)
        return jax.shard_map(
            kernel, mesh=mesh, in_specs=(qkv_spec, qkv_spec, qkv_spec, P(blnh[0], None)),
            out_specs=qkv_spec, check_vma=False,
        )(query, key, value, segment_ids)


def segment_ids_from_mask(atten_mask, batch_size: int):
    """[B, T] segment ids under which causal attention equals `atten_mask` for real tokens.

    Token t may attend to t-1 exactly when they are in the same segment, so a masked
    (t, t-1) entry starts a new segment. Only the mask's sub-diagonal is read; XLA
    computes just that from praxis's mask expression. Padding positions may form
    segments of their own: their outputs carry no weight, and real tokens never attend
    to them.
    """
    mask = jnp.broadcast_to(atten_mask[:, 0], (batch_size, *atten_mask.shape[2:]))  # [B, T, S]
    below = jnp.diagonal(mask, offset=-1, axis1=1, axis2=2)  # [B, T-1]: (t, t-1)
    starts = below < py_utils.get_large_negative_number(jnp.float32) / 2
    first = jnp.ones((batch_size, 1), jnp.int32)
    return jnp.cumsum(jnp.concatenate([first, starts.astype(jnp.int32)], axis=1), axis=1)


def resolve(impl: str, *, packed_input: bool, platform: str, atten_dropout_prob: float) -> str:
    """The implementation to use for ATTENTION_IMPL=`impl` on `platform`; ValueError (one
    line) for a choice that cannot be exact or cannot run there."""
    if impl not in ("praxis", "auto") and atten_dropout_prob > 0:
        raise ValueError(f"ATTENTION_IMPL={impl!r} has no attention dropout; set "
                         f"ATTEN_DROPOUT_PROB=0 or use 'praxis'")
    if impl == "auto":
        if atten_dropout_prob > 0 or platform != "gpu":
            return "praxis"
        return "pallas" if packed_input else "cudnn"
    if impl == "cudnn" and packed_input:
        raise ValueError("ATTENTION_IMPL='cudnn' cannot mask packed rows (segment ids) exactly; "
                         "use 'pallas', or --fdl.PACKED_INPUT=False")
    if impl == "cudnn" and platform != "gpu":
        raise ValueError(f"ATTENTION_IMPL='cudnn' needs a GPU (this is {platform}); use 'xla' "
                         f"or 'praxis'")
    return impl


def use_attention_impl(layer: fdl.Config, impl: str, *, platform: str) -> None:
    """Make the Transformer layer template `layer` use attention implementation `impl`
    (already resolved): its DotProductAttention template becomes FusedDotProductAttention."""
    if impl == "praxis":
        return
    attention = layer.tr_atten_tpl
    if not issubclass(attention.cls, attentions.DotProductAttention):
        raise ValueError(f"ATTENTION_IMPL={impl!r} replaces praxis's DotProductAttention, but "
                         f"this model's attention is {attention.cls.__name__}; use 'praxis'")
    fdl.update_callable(attention, FusedDotProductAttention)
    attention.attention_impl = impl
    attention.pallas_interpret = impl == "pallas" and platform != "gpu"
