"""Attention kernels in plain JAX, for any platform, with XLA's matmuls:

- `flash_attention`: flash attention's algorithm (Dao et al. 2022): blocks of queries
  against blocks of keys with an online softmax; the backward pass keeps only the inputs,
  the output and each row's log-sum-exp and recomputes each block. The mask is given by
  segments (documents) and positions, not by the order of the tokens, so it serves
  context parallelism's load-balanced order as well as rows in order
  (`causal_flash_attention`). ATTENTION_IMPL "flash"; the planner's stand-in for the fused
  GPU kernels' memory; the kernel per device with a context axis off GPUs (on GPUs,
  layers/flash_pallas.py: the same mask as Pallas kernels).
- `ring_attention`: context parallelism's ring strategy, under shard_map: each device's
  queries against every device's keys and values, passed around the context axis, each
  step by either kernel.
- `segment_ids_from_positions`: the documents of a laid-out row, from its positions, and
  `positions_from_segment_ids` the other way for a row in order.

layers/attention.py puts them in praxis's attention layers.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from praxis import py_utils

from layers import flash_pallas
from paxloom.core.mesh_axes import CONTEXT_AXIS

FLASH_BLOCK = 128  # query rows per block of flash_attention
FLASH_KEY_BLOCK = 512  # key columns per block


@jax.custom_vjp
def flash_attention(query, key, value, q_segments, k_segments, q_positions, k_positions):
    """Attention within documents, causal by position, in plain JAX: flash attention's
    algorithm (Dao et al. 2022) with XLA's matmuls. Blocks of queries against blocks of keys
    with an online softmax; the backward pass keeps only what a flash kernel keeps (the
    inputs, the output and each row's log-sum-exp) and recomputes each block's scores. No
    [T, S] array, and key/value heads are not repeated for their query groups.

    query [B, T, N, H] (scaled), key/value [B, S, K, H] with K dividing N; q_segments,
    q_positions [B, T] and k_segments, k_positions [B, S] int: query q sees key k when their
    segments are equal and k's position is not after q's (every query must see one key,
    e.g. itself). Slower than a fused kernel; the portable exact kernel ("flash", and per
    shard with a context axis), the stand-in that plans a fused kernel's memory on CPU,
    and an independent check of the fused kernels' mask."""
    return _flash_forward(query, key, value, q_segments, k_segments, q_positions,
                          k_positions)[0]


def causal_flash_attention(query, key, value, segment_ids):
    """flash_attention over one sequence order: query and key t at position t, within the
    segments `segment_ids` [B, T]."""
    positions = jnp.broadcast_to(jnp.arange(query.shape[1], dtype=jnp.int32),
                                 segment_ids.shape)
    return flash_attention(query, key, value, segment_ids, segment_ids, positions, positions)


def _flash_blocks(x, block):
    """[B, T, ...] -> [T / block, B, block, ...]."""
    b, t = x.shape[:2]
    return jnp.moveaxis(x.reshape(b, t // block, block, *x.shape[2:]), 1, 0)


def _flash_unblock(x):
    """The inverse of _flash_blocks."""
    return jnp.moveaxis(x, 0, 1).reshape(x.shape[1], -1, *x.shape[3:])


def _grouped(x, kv_heads: int):
    """[B, T, N, H] -> [B, T, K, N / K, H]: each key/value head's query group."""
    b, t, n, h = x.shape
    return x.reshape(b, t, kv_heads, n // kv_heads, h)


def _flash_scores(q, q_segments, q_positions, k, k_segments, k_positions):
    """Masked float32 scores [B, K, G, bq, bk] of a block of grouped queries q [B, bq, K, G,
    H] against a block of keys k [B, bk, K, H], with their segments and positions."""
    scores = jnp.einsum("bqkgh,bskh->bkgqs", q, k, preferred_element_type=jnp.float32)
    visible = ((q_positions[:, :, None] >= k_positions[:, None, :])
               & (q_segments[:, :, None] == k_segments[:, None, :]))  # [B, bq, bk]
    # The mask depends on the batch alone, so under rematerialisation jax computes it in
    # the forward pass and keeps it for the backward one, once per block pair, as the
    # select reads it: broadcast over the heads, 32 times the bytes of `visible` (64 GiB
    # at 131072 tokens over 8 devices). Broadcasting it in a term that reads the scores
    # keeps only `visible`. (No score is below -inf: the term is `visible` itself, NaNs
    # included.)
    visible = visible[:, None, None] & ~(scores < -jnp.inf)
    return jnp.where(visible, scores, py_utils.get_large_negative_number(jnp.float32))


def _flash_block_sizes(query, key) -> tuple[int, int]:
    return math.gcd(query.shape[1], FLASH_BLOCK), math.gcd(key.shape[1], FLASH_KEY_BLOCK)


def _flash_forward(query, key, value, q_segments, k_segments, q_positions, k_positions):
    kv_heads = key.shape[2]
    q_block, k_block = _flash_block_sizes(query, key)
    key_blocks = tuple(_flash_blocks(x, k_block)
                       for x in (key, value, k_segments, k_positions))

    def one_query_block(args):
        q, segments, positions = args
        q = _grouped(q, kv_heads)  # [B, bq, K, G, H]
        b, bq, k, g, h = q.shape

        def one_key_block(carry, keys):
            row_max, row_sum, acc = carry  # [B, K, G, bq] twice, [B, K, G, bq, H]
            k_, v_, k_segments_, k_positions_ = keys
            scores = _flash_scores(q, segments, positions, k_, k_segments_, k_positions_)
            new_max = jnp.maximum(row_max, jnp.max(scores, axis=-1))
            # Rows with nothing visible yet hold the fill value: their sums restart at the
            # first visible key (the correction below is then 0).
            correction = jnp.exp(row_max - new_max)
            probs = jnp.exp(scores - new_max[..., None])
            row_sum = row_sum * correction + jnp.sum(probs, axis=-1)
            acc = acc * correction[..., None] + jnp.einsum(
                "bkgqs,bskh->bkgqh", probs.astype(v_.dtype), v_,
                preferred_element_type=jnp.float32)
            return (new_max, row_sum, acc), None

        fill = py_utils.get_large_negative_number(jnp.float32)
        init = (jnp.full((b, k, g, bq), fill, jnp.float32), jnp.zeros((b, k, g, bq), jnp.float32),
                jnp.zeros((b, k, g, bq, h), jnp.float32))
        (row_max, row_sum, acc), _ = jax.lax.scan(one_key_block, init, key_blocks)
        out = jnp.moveaxis(acc / row_sum[..., None], 3, 1).reshape(b, bq, k * g, h)
        return out.astype(value.dtype), row_max + jnp.log(row_sum)

    out, lse = jax.lax.map(one_query_block, tuple(_flash_blocks(x, q_block)
                                                  for x in (query, q_segments, q_positions)))
    out = _flash_unblock(out)
    return out, (query, key, value, q_segments, k_segments, q_positions, k_positions, out, lse)


def _flash_backward(residuals, d_out):
    """Gradients of query, key and value: blocks of queries against all key blocks for the
    query's, then blocks of keys against all query blocks for the key's and value's, each
    block's probabilities recomputed from the log-sum-exp."""
    query, key, value, q_segments, k_segments, q_positions, k_positions, out, lse = residuals
    kv_heads = key.shape[2]
    q_block, k_block = _flash_block_sizes(query, key)
    key_blocks = tuple(_flash_blocks(x, k_block)
                       for x in (key, value, k_segments, k_positions))
    query_blocks = (*(_flash_blocks(x, q_block)
                      for x in (query, d_out, out, q_segments, q_positions)), lse)

    def block_terms(queries, keys):
        """For a query block and a key block: the probabilities [B, K, G, bq, bk], the
        score gradients, and the grouped float32 query and output gradient."""
        q, do, o, segments, positions, lse_ = queries
        k_, v_, k_segments_, k_positions_ = keys
        q, do, o = (_grouped(x, kv_heads) for x in (q, do, o))
        q32, do32 = q.astype(jnp.float32), do.astype(jnp.float32)
        row_dot = jnp.einsum("bqkgh,bqkgh->bkgq", do32, o.astype(jnp.float32))
        probs = jnp.exp(_flash_scores(q, segments, positions, k_, k_segments_, k_positions_)
                        - lse_[..., None])
        d_probs = jnp.einsum("bqkgh,bskh->bkgqs", do32, v_.astype(jnp.float32))
        return probs, probs * (d_probs - row_dot[..., None]), q32, do32

    def d_query_block(queries):
        def one_key_block(d_q, keys):
            _, d_scores, _, _ = block_terms(queries, keys)
            return d_q + jnp.einsum("bkgqs,bskh->bqkgh", d_scores,
                                    keys[0].astype(jnp.float32)), None

        b, bq, n, h = queries[0].shape
        zeros = jnp.zeros((b, bq, kv_heads, n // kv_heads, h), jnp.float32)
        return jax.lax.scan(one_key_block, zeros, key_blocks)[0].reshape(b, bq, n, h)

    def d_key_value_block(keys):
        def one_query_block(carry, queries):
            d_k, d_v = carry
            probs, d_scores, q32, do32 = block_terms(queries, keys)
            return (d_k + jnp.einsum("bkgqs,bqkgh->bskh", d_scores, q32),
                    d_v + jnp.einsum("bkgqs,bqkgh->bskh", probs, do32)), None

        zeros = jnp.zeros(keys[0].shape, jnp.float32)
        return jax.lax.scan(one_query_block, (zeros, zeros), query_blocks)[0]

    d_query = _flash_unblock(jax.lax.map(d_query_block, query_blocks))
    d_key, d_value = (_flash_unblock(x) for x in jax.lax.map(d_key_value_block, key_blocks))
    return d_query, d_key, d_value


def _flash_vjp_forward(query, key, value, *masks):
    return _flash_forward(query, key, value, *masks)


def _flash_vjp_backward(residuals, d_out):
    d_query, d_key, d_value = _flash_backward(residuals, d_out)
    query, key = residuals[:2]
    return (d_query.astype(query.dtype), d_key.astype(key.dtype), d_value.astype(key.dtype),
            None, None, None, None)


flash_attention.defvjp(_flash_vjp_forward, _flash_vjp_backward)


def ring_attention(query, key, value, all_segments, all_positions, shards: int,
                   pallas_interpret: bool | None = None):
    """Context parallelism's ring strategy, run per device under shard_map: the device's
    queries [B, T/N, N_heads, H] (scaled) attend to its own keys and values [B, T/N, K, H]
    and to each other device's, passed around the context axis one step at a time
    (`ppermute`), the partial results merged by their log-sum-exp. Only one device's keys
    and values are held at a time, in the backward pass too, which passes their gradients
    around with them. all_segments and all_positions [B, T]: every token's document and
    position, in the laid-out order. Each step is flash_attention's blocks, or with
    `pallas_interpret` not None layers/flash_pallas.py's kernels (interpreted if True)."""
    return _ring(query, key, value, all_segments, all_positions, shards, pallas_interpret)


def _ring_masks(all_segments, all_positions, device, length: int):
    """The segments and positions [B, length] of the tokens device `device` holds."""
    return tuple(jax.lax.dynamic_slice_in_dim(x, device * length, length, axis=1)
                 for x in (all_segments, all_positions))


def _ring_next(x, shards: int):
    """x from the previous device along the context axis (each passes its own on)."""
    return jax.lax.ppermute(x, CONTEXT_AXIS, [(i, (i + 1) % shards) for i in range(shards)])


def _step_forward(pallas_interpret, query, key, value, masks):
    """One ring step's attention: (output, log-sum-exp [B, T, N] float32)."""
    if pallas_interpret is None:
        out, residuals = _flash_forward(query, key, value, *masks)
        _, b, k, g, _ = residuals[-1].shape  # [T/block, B, K, G, block]
        return out, jnp.transpose(residuals[-1], (1, 0, 4, 2, 3)).reshape(b, -1, k * g)
    out, residuals = flash_pallas.forward(query, key, value, *masks, pallas_interpret)
    return out, jnp.swapaxes(residuals[-1], 1, 2)  # [B, N, T] -> [B, T, N]


def _step_backward(pallas_interpret, query, key, value, masks, out, lse, d_out):
    """One ring step's float32 gradients of query, key and value, its probabilities from
    the whole row's output and log-sum-exp [B, T, N]."""
    if pallas_interpret is None:
        b, t, n = lse.shape
        block, k = _flash_block_sizes(query, key)[0], key.shape[2]
        lse = jnp.transpose(lse.reshape(b, t // block, block, k, n // k), (1, 0, 3, 4, 2))
        return _flash_backward((query, key, value, *masks, out, lse), d_out)
    return flash_pallas.backward(pallas_interpret, (query, key, value, *masks, out,
                                                    jnp.swapaxes(lse, 1, 2)), d_out,
                                 grad_dtype=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _ring(query, key, value, all_segments, all_positions, shards, pallas_interpret):
    return _ring_forward(query, key, value, all_segments, all_positions, shards,
                         pallas_interpret)[0]


def _ring_forward(query, key, value, all_segments, all_positions, shards, pallas_interpret):
    me = jax.lax.axis_index(CONTEXT_AXIS)
    q_masks = _ring_masks(all_segments, all_positions, me, query.shape[1])

    def one_step(carry, step):
        k, v, out, lse = carry
        k_masks = _ring_masks(all_segments, all_positions, (me - step) % shards, key.shape[1])
        step_out, step_lse = _step_forward(pallas_interpret, query, k, v,
                                           (q_masks[0], k_masks[0], q_masks[1], k_masks[1]))
        # Rows that see none of these keys come out with a log-sum-exp near the fill value:
        # the merge gives them no weight once a visible key has come (their own always does).
        merged = jnp.logaddexp(lse, step_lse)
        out = (out * jnp.exp(lse - merged)[..., None]
               + step_out.astype(jnp.float32) * jnp.exp(step_lse - merged)[..., None])
        return (_ring_next(k, shards), _ring_next(v, shards), out, merged), None

    init = (key, value, jnp.zeros(query.shape, jnp.float32),
            jnp.full(query.shape[:3], py_utils.get_large_negative_number(jnp.float32)))
    (_, _, out, lse), _ = jax.lax.scan(one_step, init, jnp.arange(shards))
    out = out.astype(value.dtype)
    return out, (query, key, value, all_segments, all_positions, out, lse)


def _ring_backward(shards, pallas_interpret, residuals, d_out):
    """Each step: the gradients of this device's queries against the keys it holds, and of
    those keys and values, which travel on with them; after a full turn every key's and
    value's gradient is back with its device. The probabilities come from the merged
    log-sum-exp and output, so each step's share is exactly its part of the whole."""
    query, key, value, all_segments, all_positions, out, lse = residuals
    me = jax.lax.axis_index(CONTEXT_AXIS)
    q_masks = _ring_masks(all_segments, all_positions, me, query.shape[1])

    def one_step(carry, step):
        k, v, d_k, d_v, d_q = carry
        k_masks = _ring_masks(all_segments, all_positions, (me - step) % shards, key.shape[1])
        step_d_q, step_d_k, step_d_v = _step_backward(
            pallas_interpret, query, k, v, (q_masks[0], k_masks[0], q_masks[1], k_masks[1]),
            out, lse, d_out)
        passed = (_ring_next(x, shards) for x in (k, v, d_k + step_d_k, d_v + step_d_v))
        return (*passed, d_q + step_d_q), None

    zeros = jnp.zeros(key.shape, jnp.float32)
    init = (key, value, zeros, zeros, jnp.zeros(query.shape, jnp.float32))
    (_, _, d_key, d_value, d_query), _ = jax.lax.scan(one_step, init, jnp.arange(shards))
    return (d_query.astype(query.dtype), d_key.astype(key.dtype), d_value.astype(value.dtype),
            None, None)


_ring.defvjp(_ring_forward, _ring_backward)


def positions_from_segment_ids(segment_ids):
    """[B, T] segment ids in row order -> each token's position in its document (0 where
    its segment starts), as packed rows carry them in segment_pos."""
    index = jnp.broadcast_to(jnp.arange(segment_ids.shape[1]), segment_ids.shape)
    starts = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool),
                              segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    return index - jax.lax.cummax(jnp.where(starts, index, 0), axis=1)


def segment_ids_from_positions(positions, order):
    """[B, T] positions laid out in `order` (paxloom/core/sequence_order.py) -> the segment ids of
    the same tokens: a document starts where its position is 0, in the natural order.
    (Padding, at position 0, is a segment per token: it attends only to itself, and no
    real token to it.)"""
    natural = jnp.take(positions, jnp.asarray(np.argsort(order)), axis=1)
    segments = jnp.cumsum((natural == 0).astype(jnp.int32), axis=1)
    return jnp.take(segments, jnp.asarray(order), axis=1)
