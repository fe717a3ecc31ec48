"""Flash attention masked by documents and positions, as Pallas (Triton) kernels for GPUs: the
fused kernel per device under context parallelism (ATTENTION_IMPL "pallas", and "auto" on
a GPU, with a context axis).

The same contract as layers/flash.py's `flash_attention` (its plain-JAX twin): query q
sees key k when their segments (documents) are equal and k's position is not after q's.
Unlike jax's Pallas and cuDNN kernels, whose causal mask compares the tokens' indices, this
one holds for any order of the tokens, so it serves context parallelism's load-balanced
order (paxloom/core/sequence_order.py), where a device's queries are two chunks from far apart in
the row and its gathered keys come chunk by chunk.

Block skipping: a block of queries meets a block of keys only if some query may see some
key. That is decided outside the kernels, from each block's least and greatest segment and
position (never skipping a pair that has a visible entry), and handed to them as a list of
the blocks to visit per block row, as block-sparse kernels do (splash attention): the
future, and documents other than a block's own, cost nothing but the blocks on their
borders. Grouped-query heads are read from their key/value head (no repeat).

Three kernels: the forward pass (output and each row's log-sum-exp), and the backward pass
as flash attention 2 has it: the queries' gradient per block of queries, the keys' and
values' per block of keys (summed over the key/value head's query group). On CPU they run
in Pallas's interpret mode (tests); they compile only for GPUs.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# Queries x keys per block: jax's Pallas attention's defaults for an H100 (jax's
# pallas/ops/gpu/attention.py BlockSizes.get_default), unmeasured for this kernel.
FORWARD_BLOCKS = (128, 128)
BACKWARD_BLOCKS = (32, 32)
# At most this many bytes in a block's tile of queries, keys or values (128 rows of 128
# bfloat16s): XLA:GPU's Triton refuses 128-row blocks of float32 heads of 128 for an
# H100's shared memory (263,168 bytes asked, 232,448 there; jax's Pallas kernel too), so
# wider rows get fewer.
MAX_TILE_BYTES = 128 * 128 * 2
# Scores of masked entries: finite, so a row whose block shows it no key yet stays finite
# (its weights are wiped by the first visible key: exp(MASKED - real) is 0).
MASKED = -0.7 * float(np.finfo(np.float32).max)
# Triton's dot needs at least 16 rows and columns.
MIN_GPU_BLOCK = 16


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def flash_attention(query, key, value, q_segments, k_segments, q_positions, k_positions,
                    interpret: bool = False):
    """Attention within documents, causal by position, as fused GPU kernels.

    query [B, T, N, H] (scaled), key/value [B, S, K, H] with K dividing N; q_segments,
    q_positions [B, T] and k_segments, k_positions [B, S] int: query q sees key k when
    their segments are equal and k's position is not after q's (a query that sees none
    gets a log-sum-exp near MASKED, which the ring strategy's merge weighs 0).
    `interpret`: run in Pallas's interpret mode (off a GPU)."""
    return forward(query, key, value, q_segments, k_segments, q_positions, k_positions,
                   interpret)[0]


def block_rows(x, preferred: int) -> int:
    """Rows per block of a [B, T, heads, H] array x in a Triton kernel: `preferred`, fewer
    where a tile would pass MAX_TILE_BYTES (heads padded to a power of 2)."""
    row_bytes = pl.next_power_of_2(x.shape[-1]) * x.dtype.itemsize
    return min(preferred, max(MAX_TILE_BYTES // row_bytes, 1))


def _block_size(length: int, preferred: int, x, interpret: bool) -> int:
    """block_rows, dividing `length`."""
    size = math.gcd(length, block_rows(x, preferred))
    if size < MIN_GPU_BLOCK and not interpret:
        raise ValueError(f"the Pallas attention kernel needs each device's sequence length "
                         f"to be a multiple of {MIN_GPU_BLOCK} (not {length})")
    return size


def _bounds(segments, positions, block: int):
    """Per block of `block` tokens of [B, L] segments and positions: their least and
    greatest segment and position, [B, L / block] each."""
    b, length = segments.shape
    s, p = (x.reshape(b, length // block, block) for x in (segments, positions))
    return s.min(-1), s.max(-1), p.min(-1), p.max(-1)


def _visible_blocks(q_segments, q_positions, k_segments, k_positions, q_block, k_block):
    """[B, T / q_block, S / k_block] bool: may some query of the block see some key of the
    other? True wherever one does (their segment ranges overlap and the least key position
    is not after the greatest query position); possibly also where none does."""
    qs_lo, qs_hi, _, qp_hi = _bounds(q_segments, q_positions, q_block)
    ks_lo, ks_hi, kp_lo, _ = _bounds(k_segments, k_positions, k_block)
    return ((qs_lo[:, :, None] <= ks_hi[:, None, :]) & (ks_lo[:, None, :] <= qs_hi[:, :, None])
            & (kp_lo[:, None, :] <= qp_hi[:, :, None]))


def _pad_pow2(x, axis: int):
    """x padded with zeros along `axis` to a power-of-2 length (Triton loads power-of-2
    arrays; the padding is never read: counts bound every list)."""
    extra = pl.next_power_of_2(x.shape[axis]) - x.shape[axis]
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def _block_lists(visible):
    """[B, R, C] bool -> (lists [B, R, C'] int32: each row's visible columns first, in
    order; counts [B, R'] int32: how many), C' and R' padded to powers of 2."""
    counts = visible.sum(-1, dtype=jnp.int32)
    lists = jnp.argsort(~visible, axis=-1, stable=True).astype(jnp.int32)
    return _pad_pow2(lists, 2), _pad_pow2(counts, 1)


def _masked_scores(q, k, q_segments, q_positions, k_segments, k_positions):
    """float32 scores [bq, bk] of a block of queries against a block of keys, MASKED
    where the query may not see the key."""
    scores = _dot(q, k, trans_b=True)
    visible = ((q_segments[:, None] == k_segments[None, :])
               & (q_positions[:, None] >= k_positions[None, :]))
    return jnp.where(visible, scores, MASKED), visible


def _dot(a, b, trans_a=False, trans_b=False):
    """pl.dot in b's dtype (bf16 x bf16 on the tensor cores), exact for float32 (no TF32)."""
    precision = jax.lax.Precision.HIGHEST if b.dtype == jnp.float32 else None
    return plgpu.dot(a.astype(b.dtype), b, trans_a=trans_a, trans_b=trans_b, precision=precision)


def _forward_kernel(blocks_ref, counts_ref, q_ref, k_ref, v_ref, q_seg_ref, k_seg_ref,
                    q_pos_ref, k_pos_ref, o_ref, lse_ref, *, k_block: int, head_dim: int):
    """One block of queries of one head: its output and log-sum-exp, over the key blocks
    its list names, with an online softmax."""
    head_mask = (jnp.arange(q_ref.shape[-1]) < head_dim)[None, :]
    q = plgpu.load(q_ref, mask=head_mask, other=0.0)
    q_segments, q_positions = q_seg_ref[...], q_pos_ref[...]

    def one_key_block(t, carry):
        acc, row_max, row_sum = carry
        keys = pl.ds(pl.multiple_of(blocks_ref[t] * k_block, k_block), k_block)
        k = plgpu.load(k_ref.at[keys, :], mask=head_mask, other=0.0)
        scores, _ = _masked_scores(q, k, q_segments, q_positions, k_seg_ref[keys],
                                   k_pos_ref[keys])
        new_max = jnp.maximum(row_max, scores.max(axis=-1))
        correction = jnp.exp(row_max - new_max)
        probs = jnp.exp(scores - new_max[:, None])
        v = plgpu.load(v_ref.at[keys, :], mask=head_mask, other=0.0)
        acc = acc * correction[:, None] + _dot(probs, v)
        return acc, new_max, row_sum * correction + probs.sum(axis=-1)

    rows = q.shape[0]
    init = (jnp.zeros(q.shape, jnp.float32), jnp.full((rows,), -jnp.inf, jnp.float32),
            jnp.zeros((rows,), jnp.float32))
    count = counts_ref[pl.program_id(0)]
    acc, row_max, row_sum = jax.lax.fori_loop(0, count, one_key_block, init)
    # A row whose list was empty (a ring step's keys all in its future) comes out 0 with a
    # log-sum-exp of MASKED: no weight when merged with the steps that saw keys.
    seen = row_sum > 0
    row_sum = jnp.where(seen, row_sum, 1.0)
    plgpu.store(o_ref, (acc / row_sum[:, None]).astype(o_ref.dtype), mask=head_mask)
    lse_ref[...] = jnp.where(seen, row_max + jnp.log(row_sum), MASKED)


def _heads(query, key):
    b, t, n, h = query.shape
    return b, t, n, key.shape[1], key.shape[2], h, pl.next_power_of_2(h)


def _per_query_block_specs(blocks, counts, q_block: int, s: int, hp: int, group: int):
    """The inputs of a kernel run per block of queries (grid: query block i, row j, head
    k): its list of key blocks and their count, its queries, every key and value of its
    key/value head, its segments and positions and every key's."""
    return [
        pl.BlockSpec((None, None, blocks.shape[2]), lambda i, j, k: (j, i, 0)),
        pl.BlockSpec((None, counts.shape[1]), lambda i, j, k: (j, 0)),
        pl.BlockSpec((None, q_block, None, hp), lambda i, j, k: (j, i, k, 0)),
        pl.BlockSpec((None, s, None, hp), lambda i, j, k: (j, 0, k // group, 0)),
        pl.BlockSpec((None, s, None, hp), lambda i, j, k: (j, 0, k // group, 0)),
        pl.BlockSpec((None, q_block), lambda i, j, k: (j, i)),
        pl.BlockSpec((None, s), lambda i, j, k: (j, 0)),
        pl.BlockSpec((None, q_block), lambda i, j, k: (j, i)),
        pl.BlockSpec((None, s), lambda i, j, k: (j, 0)),
    ]


def forward(query, key, value, q_segments, k_segments, q_positions, k_positions, interpret):
    """(output, residuals): the residuals end with the rows' log-sum-exp [B, N, T]."""
    b, t, n, s, kv_heads, h, hp = _heads(query, key)
    group = n // kv_heads
    q_block = _block_size(t, FORWARD_BLOCKS[0], query, interpret)
    k_block = _block_size(s, FORWARD_BLOCKS[1], key, interpret)
    blocks, counts = _block_lists(_visible_blocks(q_segments, q_positions, k_segments,
                                                  k_positions, q_block, k_block))
    out, lse = pl.pallas_call(
        functools.partial(_forward_kernel, k_block=k_block, head_dim=h),
        grid=(t // q_block, b, n),
        in_specs=_per_query_block_specs(blocks, counts, q_block, s, hp, group),
        out_specs=[pl.BlockSpec((None, q_block, None, hp), lambda i, j, k: (j, i, k, 0)),
                   pl.BlockSpec((None, None, q_block), lambda i, j, k: (j, k, i))],
        out_shape=[jax.ShapeDtypeStruct(query.shape, query.dtype),
                   jax.ShapeDtypeStruct((b, n, t), jnp.float32)],
        compiler_params=plgpu.CompilerParams(num_warps=4 if h <= 64 else 8, num_stages=2),
        interpret=interpret, name="paxloom_flash_forward",
    )(blocks, counts, query, key, value, q_segments, k_segments, q_positions, k_positions)
    return out, (query, key, value, q_segments, k_segments, q_positions, k_positions, out, lse)


def _probs_and_score_grads(q, k, v, do, lse, delta, masks):
    """For a block of queries against a block of keys: the probabilities [bq, bk] (from the
    rows' log-sum-exp) and the scores' gradient."""
    scores, visible = _masked_scores(q, k, *masks)
    probs = jnp.where(visible, jnp.exp(scores - lse[:, None]), 0.0)
    d_probs = _dot(do, v, trans_b=True)
    return probs, probs * (d_probs - delta[:, None])


def _dq_kernel(blocks_ref, counts_ref, q_ref, k_ref, v_ref, q_seg_ref, k_seg_ref, q_pos_ref,
               k_pos_ref, do_ref, lse_ref, delta_ref, dq_ref, *, k_block: int, head_dim: int):
    """The gradient of one block of queries of one head, over the key blocks it saw."""
    head_mask = (jnp.arange(q_ref.shape[-1]) < head_dim)[None, :]
    q = plgpu.load(q_ref, mask=head_mask, other=0.0)
    do = plgpu.load(do_ref, mask=head_mask, other=0.0)
    lse, delta = lse_ref[...], delta_ref[...]
    q_segments, q_positions = q_seg_ref[...], q_pos_ref[...]

    def one_key_block(t, dq):
        keys = pl.ds(pl.multiple_of(blocks_ref[t] * k_block, k_block), k_block)
        k = plgpu.load(k_ref.at[keys, :], mask=head_mask, other=0.0)
        v = plgpu.load(v_ref.at[keys, :], mask=head_mask, other=0.0)
        _, d_scores = _probs_and_score_grads(
            q, k, v, do, lse, delta,
            (q_segments, q_positions, k_seg_ref[keys], k_pos_ref[keys]))
        return dq + _dot(d_scores, k)

    count = counts_ref[pl.program_id(0)]
    dq = jax.lax.fori_loop(0, count, one_key_block, jnp.zeros(q.shape, jnp.float32))
    plgpu.store(dq_ref, dq.astype(dq_ref.dtype), mask=head_mask)


def _dkv_kernel(blocks_ref, counts_ref, q_ref, k_ref, v_ref, q_seg_ref, k_seg_ref, q_pos_ref,
                k_pos_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *, q_block: int,
                group: int, head_dim: int):
    """The gradients of one block of keys and values of one key/value head: over each query
    head of its group, over the query blocks that saw it."""
    head_mask = (jnp.arange(k_ref.shape[-1]) < head_dim)[None, :]
    k = plgpu.load(k_ref, mask=head_mask, other=0.0)
    v = plgpu.load(v_ref, mask=head_mask, other=0.0)
    k_segments, k_positions = k_seg_ref[...], k_pos_ref[...]
    count = counts_ref[pl.program_id(0)]

    def one_head(g, carry):
        def one_query_block(t, carry):
            dk, dv = carry
            queries = pl.ds(pl.multiple_of(blocks_ref[t] * q_block, q_block), q_block)
            q = plgpu.load(q_ref.at[queries, g, :], mask=head_mask, other=0.0)
            do = plgpu.load(do_ref.at[queries, g, :], mask=head_mask, other=0.0)
            probs, d_scores = _probs_and_score_grads(
                q, k, v, do, lse_ref[g, queries], delta_ref[g, queries],
                (q_seg_ref[queries], q_pos_ref[queries], k_segments, k_positions))
            return dk + _dot(d_scores, q, trans_a=True), dv + _dot(probs, do, trans_a=True)

        return jax.lax.fori_loop(0, count, one_query_block, carry)

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = jax.lax.fori_loop(0, group, one_head, (zeros, zeros))
    plgpu.store(dk_ref, dk.astype(dk_ref.dtype), mask=head_mask)
    plgpu.store(dv_ref, dv.astype(dv_ref.dtype), mask=head_mask)


def backward(interpret, residuals, d_out, grad_dtype=None):
    """The gradients of query, key and value from forward's residuals (whose output and
    log-sum-exp may be the whole row's, as the ring strategy's), in `grad_dtype` (default:
    the inputs' own)."""
    query, key, value, q_segments, k_segments, q_positions, k_positions, out, lse = residuals
    b, t, n, s, kv_heads, h, hp = _heads(query, key)
    group = n // kv_heads
    q_block = _block_size(t, BACKWARD_BLOCKS[0], query, interpret)
    k_block = _block_size(s, BACKWARD_BLOCKS[1], key, interpret)
    visible = _visible_blocks(q_segments, q_positions, k_segments, k_positions, q_block,
                              k_block)
    # Each row's sum of d_out * out: the softmax's share of the scores' gradient.
    delta = jnp.einsum("btnh,btnh->bnt", d_out.astype(jnp.float32), out.astype(jnp.float32))
    masks = (q_segments, k_segments, q_positions, k_positions)
    params = plgpu.CompilerParams(num_warps=4, num_stages=2)

    blocks, counts = _block_lists(visible)
    d_query = pl.pallas_call(
        functools.partial(_dq_kernel, k_block=k_block, head_dim=h),
        grid=(t // q_block, b, n),
        in_specs=[
            *_per_query_block_specs(blocks, counts, q_block, s, hp, group),
            pl.BlockSpec((None, q_block, None, hp), lambda i, j, k: (j, i, k, 0)),  # d_out
            pl.BlockSpec((None, None, q_block), lambda i, j, k: (j, k, i)),  # lse
            pl.BlockSpec((None, None, q_block), lambda i, j, k: (j, k, i)),  # delta
        ],
        out_specs=pl.BlockSpec((None, q_block, None, hp), lambda i, j, k: (j, i, k, 0)),
        out_shape=jax.ShapeDtypeStruct(query.shape, grad_dtype or query.dtype),
        compiler_params=params, interpret=interpret, name="paxloom_flash_dq",
    )(blocks, counts, query, key, value, *masks, d_out, lse, delta)

    blocks, counts = _block_lists(jnp.swapaxes(visible, 1, 2))
    d_key, d_value = pl.pallas_call(
        functools.partial(_dkv_kernel, q_block=q_block, group=group, head_dim=h),
        grid=(s // k_block, b, kv_heads),
        in_specs=[
            pl.BlockSpec((None, None, blocks.shape[2]), lambda i, j, k: (j, i, 0)),
            pl.BlockSpec((None, counts.shape[1]), lambda i, j, k: (j, 0)),
            pl.BlockSpec((None, t, group, hp), lambda i, j, k: (j, 0, k, 0)),
            pl.BlockSpec((None, k_block, None, hp), lambda i, j, k: (j, i, k, 0)),
            pl.BlockSpec((None, k_block, None, hp), lambda i, j, k: (j, i, k, 0)),
            pl.BlockSpec((None, t), lambda i, j, k: (j, 0)),
            pl.BlockSpec((None, k_block), lambda i, j, k: (j, i)),
            pl.BlockSpec((None, t), lambda i, j, k: (j, 0)),
            pl.BlockSpec((None, k_block), lambda i, j, k: (j, i)),
            pl.BlockSpec((None, t, group, hp), lambda i, j, k: (j, 0, k, 0)),
            pl.BlockSpec((None, group, t), lambda i, j, k: (j, k, 0)),
            pl.BlockSpec((None, group, t), lambda i, j, k: (j, k, 0)),
        ],
        out_specs=[pl.BlockSpec((None, k_block, None, hp), lambda i, j, k: (j, i, k, 0))] * 2,
        out_shape=[jax.ShapeDtypeStruct(key.shape, grad_dtype or key.dtype),
                   jax.ShapeDtypeStruct(value.shape, grad_dtype or value.dtype)],
        compiler_params=params, interpret=interpret, name="paxloom_flash_dkv",
    )(blocks, counts, query, key, value, *masks, d_out, lse, delta)
    return d_query, d_key, d_value


def _vjp_backward(interpret, residuals, d_out):
    return (*backward(interpret, residuals, d_out), None, None, None, None)


flash_attention.defvjp(forward, _vjp_backward)
