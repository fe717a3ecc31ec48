"""QK-norm: each head's queries and keys normalised after their projections and before
RoPE, with one learned [head dim] scale for all query heads and one for all key heads, as
Qwen3 and Qwen3-MoE do (after Dehghani et al. 2023, "Scaling Vision Transformers to 22
Billion Parameters", who normalise them to keep attention logits from growing).

praxis's attentions have a QK norm of their own (DotProductAttention's `ln_tpl`), but
they apply it after RoPE. That is a different function: RoPE rotates dimension i with
i + H/2, and a scale that differs between the two does not commute with the rotation
(nor does YaRN's attention factor, which the norm would undo). praxis projects, rotates
and attends inline in `__call__`, with no method in between to override, so the classes
here restate `__call__` around praxis's own pieces (projections, rotary embedding,
`_dot_atten`, output projection) when `qk_norm_tpl` is set, and are praxis's classes
unchanged when it is not. layers/attention.py's fused classes derive from these, so a
fused kernel (ATTENTION_IMPL) swaps in with the norm kept.

The norms are children `q_norm` and `k_norm` of the attention (parameters
`self_attention/q_norm/scale`, `.../k_norm/scale`, [head dim], replicated): the
projections stay praxis's classes, which LoRA (layers/lora.py) and FP8 (layers/fp8.py)
adapt. praxis's step-by-step decoding (`extend_step`) is refused with the norm on:
Paxloom decodes with layers/cached_lm.py.
"""

import fiddle as fdl
import jax
from jax.ad_checkpoint import checkpoint_name
from praxis import base_layer
from praxis.layers import attentions, multi_query_attention


class _QkNorm:
    """The norms' children and their place before RoPE, for both attention classes, which
    declare `qk_norm_tpl` (a norm template without `dim`; None: no QK-norm) as their field
    and call `_create_qk_norms` from their `setup` (flax creates children only in a layer
    class's own methods, and takes fields only from the layer class)."""

    def _restates_call(self) -> bool:
        """Whether `__call__` is the restated one (else praxis's own): with QK-norm here; a
        subclass may need it for more (layers/attention.py: context parallelism)."""
        return self.qk_norm_tpl is not None

    def _create_qk_norms(self) -> None:
        # What the restated __call__ leaves out.
        extras = [name for name in ("dconv_qkv", "relative_bias_tpl", "ngrammer_tpl", "ln_tpl")
                  if getattr(self, name, None)]
        if extras and self._restates_call():
            raise NotImplementedError(f"{type(self).__name__}: qk_norm_tpl or a context axis "
                                      f"with {', '.join(extras)}")
        if self.qk_norm_tpl is None:
            return
        norm = self.qk_norm_tpl.clone().set(
            dim=self.dim_per_head or self.hidden_dim // self.num_heads)  # praxis's default
        self.create_child("q_norm", norm)
        self.create_child("k_norm", norm.clone())

    def _normalize_and_rotate(self, query, key, query_segment_pos, key_segment_pos):
        """query [B, T, N, H], key [B, S, K, H] -> both normalised per head (with QK-norm),
        then rotated (with RoPE)."""
        if self.qk_norm_tpl is not None:
            query, key = self.q_norm(query), self.k_norm(key)
        if self.use_rotary_position_emb:
            query = self.rotary_position_emb(query, query_segment_pos)
            key = self.rotary_position_emb(key, key_segment_pos)
        return query, key

    def extend_step(self, *args, **kwargs):
        if self.qk_norm_tpl is not None:
            raise NotImplementedError(f"{type(self).__name__}.extend_step has no QK-norm; "
                                      f"decode with layers/cached_lm.py")
        return super().extend_step(*args, **kwargs)


class QkNormDotProductAttention(_QkNorm, attentions.DotProductAttention):
    """praxis's DotProductAttention (combined or separate q/k/v projections) with QK-norm."""

    qk_norm_tpl: attentions.LayerTpl | None = base_layer.template_field(None)

    def setup(self) -> None:
        super().setup()
        self._create_qk_norms()

    def __call__(self, query_vec, key_vec, value_vec, atten_mask, query_segment_pos=None,
                 key_segment_pos=None):
        if not self._restates_call():
            return super().__call__(query_vec, key_vec, value_vec, atten_mask,
                                    query_segment_pos, key_segment_pos)
        if self.combine_qkv:
            query, key, value = self.combined_qkv(query_vec)
        else:
            query, key, value = self.query(query_vec), self.key(key_vec), self.value(value_vec)
        query, key = self._normalize_and_rotate(query, key, query_segment_pos, key_segment_pos)
        encoded, atten_probs = self._attend(query, key, value, atten_mask, query_segment_pos)
        encoded = self._shard_bld(self.post(encoded))
        return checkpoint_name(encoded, "out_proj"), atten_probs

    def _attend(self, query, key, value, atten_mask, positions):
        """The restated call's attention step: (context, probabilities or None)."""
        del positions  # praxis's step reads the order from the mask
        return self._dot_atten(query, key, value, atten_mask)


class QkNormMultiQueryDotProductAttention(_QkNorm,
                                          multi_query_attention.MultiQueryDotProductAttention):
    """praxis's MultiQueryDotProductAttention (num_kv_heads key/value heads, each shared by
    a group of query heads) with QK-norm."""

    qk_norm_tpl: attentions.LayerTpl | None = base_layer.template_field(None)

    def setup(self) -> None:
        super().setup()
        self._create_qk_norms()

    def _project(self, query_vec, key_vec, value_vec):
        """query [B, T, N, H], key and value [B, S, K, H] (a single key/value head too)."""
        # As praxis: the weight-gradient matmuls compute with the model dim replicated.
        def replicate_last_dim(x):
            return base_layer.maybe_shard(x, [None] * x.ndim, self.mesh_axis_names,
                                          unconstrained_dims=range(x.ndim - 1))

        query = checkpoint_name(self.query(replicate_last_dim(query_vec)), "query_proj")
        key = checkpoint_name(self.key(replicate_last_dim(key_vec)), "key_proj")
        value = checkpoint_name(self.value(replicate_last_dim(value_vec)), "value_proj")
        if self.num_kv_heads == 1:  # one shared head comes as [B, S, H]
            key, value = key[:, :, None, :], value[:, :, None, :]
        return query, key, value

    def __call__(self, query_vec, key_vec, value_vec, atten_mask, query_segment_pos=None,
                 key_segment_pos=None):
        if self.qk_norm_tpl is None:
            return super().__call__(query_vec, key_vec, value_vec, atten_mask,
                                    query_segment_pos, key_segment_pos)
        query, key, value = self._project(query_vec, key_vec, value_vec)
        query, key = self._normalize_and_rotate(query, key, query_segment_pos, key_segment_pos)
        query, key, value = (self._shard_blnh(x) for x in (query, key, value))
        # praxis's grouped attention: its one-head `_dot_atten` mapped over the key/value
        # heads, each with its group of query heads.
        b, t, n, h = query.shape
        groups = key.shape[2]
        with self._context_for_kv_vmap():
            encoded, _ = jax.vmap(self._dot_atten, in_axes=(2, 2, 2, None), out_axes=(2, 1))(
                query.reshape(b, t, groups, n // groups, h), key, value, atten_mask)
        encoded = self._shard_blnh(encoded.reshape(b, t, n, h))
        encoded = self._shard_bld(self.post(encoded))
        return checkpoint_name(encoded, "out_proj"), None  # no probabilities, as fused ones


# praxis's attention class -> the class with QK-norm.
QK_NORM_CLASSES = {attentions.DotProductAttention: QkNormDotProductAttention,
                   multi_query_attention.MultiQueryDotProductAttention:
                       QkNormMultiQueryDotProductAttention}


def use_qk_norm(attention: fdl.Config, norm: fdl.Config) -> None:
    """Give the attention template `attention` (praxis's DotProductAttention or
    MultiQueryDotProductAttention, or a subclass with `qk_norm_tpl`) QK-norm with the norm
    template `norm` (its `dim` is set to the head size)."""
    cls = fdl.get_callable(attention)
    if cls in QK_NORM_CLASSES:
        fdl.update_callable(attention, QK_NORM_CLASSES[cls])
    elif not issubclass(cls, _QkNorm):
        raise ValueError(f"QK-norm is built into praxis's "
                         f"{', '.join(c.__name__ for c in QK_NORM_CLASSES)}; the attention is "
                         f"{cls.__name__}")
    attention.qk_norm_tpl = norm
