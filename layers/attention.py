"""Fused attention: praxis's attention layers with the scores-softmax-context step done by
one kernel, chosen by ATTENTION_IMPL. Same parameters, so checkpoints move freely between
implementations.

praxis computes attention as separate einsums around a float32 softmax, materialising
[B, heads, T, T] scores (and a dense [B, 1, T, T] mask) per layer. Two layer classes take
the fused path: FusedDotProductAttention (multi-head, the GPT and Llama 7B) and
FusedMultiQueryDotProductAttention (grouped-query and multi-query, Llama1B/70B). The
implementations:

- "praxis": praxis's own layers, unchanged.
- "xla":    jax.nn.dot_product_attention's XLA path with praxis's mask as a bias. Exact
            for every mask; materialises the scores like praxis (the portable reference).
- "cudnn":  cuDNN's fused flash attention. On Hopper or newer it reads the documents of
            each row as cuDNN's packed ("ragged") layout: every segment's length and start,
            derived from praxis's mask, so packed, padded and plain causal rows are all
            exact. Older GPUs have no packed layout: there it is plain causal, exact only
            for unpacked rows (PACKED_INPUT=False). bf16/fp16, head dim <= 256 (128 before
            Hopper).
- "pallas": jax's Pallas Triton flash-attention kernel, causal with segment ids: exact for
            packed rows on any GPU. Run per device under shard_map (Pallas kernels are not
            partitioned by XLA). On CPU it runs in interpret mode, which is slow and meant
            for tests.
- "flash":  flash attention's algorithm in plain JAX (layers/flash.py: a block of
            queries at a time, keeping only each row's log-sum-exp for the backward pass).
            Exact for every mask, any platform, no [T, S] scores; slower than a fused
            kernel. The planner traces it for "cudnn" and "pallas" on CPU.
- "auto":   the fastest exact choice (docs/guides/gpus.md, "Attention kernels"): "cudnn" where it can run (a
            GPU, bf16/fp16, packed rows only on Hopper or newer), else "pallas" on a GPU;
            "praxis" on CPU and wherever attention dropout is on. With a context axis,
            "pallas" on a GPU and "flash" elsewhere.

Context parallelism (a `context` mesh axis, paxloom/core/mesh_axes.py): each device holds a part
of every sequence's tokens, laid out in paxloom/core/sequence_order.py's load-balanced order. The
attention gathers the keys, values and positions over the context axis (all-gather: cheap
with grouped-query heads) and attends its own queries to them under shard_map, with a
mask built from positions and documents, not from the order of the tokens: query q sees
key k when both are in one document and k's position is not after q's. The documents are
recovered from the positions (a document starts where its position is 0) in the natural
order. Per shard: "pallas" (layers/flash_pallas.py, a Pallas kernel masked the same way,
skipping the blocks no query sees), "flash" (its plain-JAX reference) or "xla"; cuDNN's and
jax's Pallas kernels mask by index and have no context form.
"""

import functools
import warnings

import fiddle as fdl
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P
from praxis import py_utils
from praxis.layers import attentions, multi_query_attention

from layers import flash, flash_pallas, measured, qk_norm
from layers.stack import transformer_layer_template
from paxloom.core import sequence_order, target
from paxloom.core.mesh_axes import CONTEXT_AXIS

IMPLS = ("praxis", "xla", "cudnn", "pallas", "flash", "auto")
# The implementations that attend across a context axis.
CONTEXT_IMPLS = ("pallas", "flash", "xla")
# cuDNN's packed layout with fewer key/value heads than query heads computed key/value
# offsets with the query head count until jax PR #39521 (2026-07-30), first released in
# jax 0.11.1. On an older jax such layers repeat their key/value heads instead.
PACKED_GQA_FIXED_IN = (0, 11, 1)


class _FusedKernels:
    """The fused scores-softmax-context step shared by both attention classes, which declare
    its settings as their fields (a layer's fields must be declared on the layer class):

      attention_impl: "xla", "cudnn", "pallas" or "flash" (already resolved).
      context_strategy: with a context axis, "all_gather" (keys and values gathered) or
        "ring" (passed around the axis, layers/flash.py ring_attention).
      cudnn_packed: give cuDNN each row's segments (Hopper or newer); else plain causal.
      max_segments: the most segments a row holds (MAX_SEGMENTS_PER_SEQ, padding at a
        row's end counting as one), the width of cuDNN's packed layout; 0: the row's
        length. cuDNN sizes its per-segment buffers by it (cudnn_buffer_bytes).
      pallas_interpret: run the Pallas kernel in interpret mode (tests off a GPU).
    """

    def _context_shards(self) -> int:
        """The size of the mesh's context axis (1: none)."""
        names = self.mesh_axis_names or ()
        return self.mesh_shape[names.index(CONTEXT_AXIS)] if CONTEXT_AXIS in names else 1

    def _fused_context(self, query, key, value, atten_mask, positions=None):
        """query [B, T, N, H] (already scaled), key/value [B, S, K, H] with K dividing N,
        atten_mask [B|1, 1, T|1, S] (additive, large negative where masked), positions
        [B, T] (each token's position in its document; read with a context axis only) ->
        the attention context [B, T, N, H]."""
        query, key, value = (self._shard_blnh(x) for x in (query, key, value))
        impl, batch_size = self.attention_impl, query.shape[0]
        if self._context_shards() > 1:
            encoded = self._context_parallel(query, key, value, positions)
        elif impl == "xla":
            encoded = jax.nn.dot_product_attention(
                query, key, value, bias=atten_mask.astype(query.dtype), scale=1.0,
                implementation="xla")
        elif impl == "flash" or self._fused_kernel_planned():
            encoded = flash.causal_flash_attention(
                query, key, value, segment_ids_from_mask(atten_mask, batch_size))
        elif impl == "cudnn" and self.cudnn_packed:
            if key.shape[2] != query.shape[2] and not packed_gqa_is_correct():
                key, value = (_repeat_heads(x, query.shape[2]) for x in (key, value))
            encoded = cudnn_packed_attention(
                query, key, value, segment_ids_from_mask(atten_mask, batch_size),
                self.max_segments)
        elif impl == "cudnn":
            encoded = jax.nn.dot_product_attention(
                query, key, value, scale=1.0, is_causal=True, implementation="cudnn")
        elif impl == "pallas":
            # The Pallas kernel takes as many key/value heads as query heads.
            key, value = (_repeat_heads(x, query.shape[2]) for x in (key, value))
            encoded = self._pallas(query, key, value,
                                   segment_ids_from_mask(atten_mask, batch_size))
        else:
            raise ValueError(f"unknown attention_impl {impl!r}")
        encoded = checkpoint_name(encoded, "context")  # remat policies name it, as praxis
        return self._shard_blnh(encoded)

    def _fused_kernel_planned(self) -> bool:
        """Whether this is the planner (paxloom/runner/planning/plan.py) tracing a GPU kernel on CPU
        devices: it traces layers/flash.py's plain-JAX kernel instead, which keeps what the
        flash kernels keep (no [T, S] scores), so the plan's memory is theirs."""
        return jax.default_backend() != "gpu" and (
            self.attention_impl == "cudnn"
            or self.attention_impl == "pallas" and not self.pallas_interpret)

    def _pallas(self, query, key, value, segment_ids):
        pallas_attention = jax_pallas_attention()
        kernel = functools.partial(
            pallas_attention.mha, sm_scale=1.0, causal=True, interpret=self.pallas_interpret,
            block_sizes=pallas_block_sizes(query))
        blnh = self.activation_split_dims_mapping.blnh
        if not self.mesh_axis_names or blnh is None:
            return kernel(query, key, value, segment_ids)
        # Each device runs the kernel on its own batch rows and heads.
        qkv_spec = P(*blnh)
        return jax.shard_map(
            kernel, mesh=self._shard_map_mesh(), out_specs=qkv_spec, check_vma=False,
            in_specs=(qkv_spec, qkv_spec, qkv_spec, P(blnh[0], None)),
        )(query, key, value, segment_ids)

    def _shard_map_mesh(self):
        """The mesh the caller set (jax.set_mesh; shard_map insists on that very one), else
        one of the layer's shape with Auto axes, like the runner's Mesh (jax 0.11's
        AbstractMesh defaults to Explicit axes, with which shard_map demands inputs already
        typed)."""
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty:
            mesh = jax.sharding.AbstractMesh(
                tuple(self.mesh_shape), tuple(self.mesh_axis_names),
                axis_types=(jax.sharding.AxisType.Auto,) * len(self.mesh_axis_names))
        return mesh

    def _context_parallel(self, query, key, value, positions):
        """Attention with the sequence split over the context axis (module docstring):
        each device's queries against the keys and values gathered from the whole axis, or
        passed around it (`context_strategy` "ring")."""
        if positions is None:
            raise ValueError("context parallelism needs each token's position: the model "
                             "must take packed input (segment_pos)")
        blnh = self.activation_split_dims_mapping.blnh
        seq_len, shards = query.shape[1], self._context_shards()
        order = sequence_order.load_balanced_order(seq_len, shards)
        impl, strategy = self.attention_impl, self.context_strategy

        def attend_local(q, k, v, q_positions):
            # Every token's position, then its document: [B, T] integers, a small gather.
            all_positions = jax.lax.all_gather(q_positions, CONTEXT_AXIS, axis=1, tiled=True)
            all_segments = flash.segment_ids_from_positions(all_positions, order)
            if strategy == "ring":
                pallas = impl == "pallas" and not self._fused_kernel_planned()
                return flash.ring_attention(q, k, v, all_segments, all_positions, shards,
                                            self.pallas_interpret if pallas else None)
            k, v = (jax.lax.all_gather(x, CONTEXT_AXIS, axis=1, tiled=True) for x in (k, v))
            start = jax.lax.axis_index(CONTEXT_AXIS) * q.shape[1]
            q_segments = jax.lax.dynamic_slice_in_dim(all_segments, start, q.shape[1], axis=1)
            masks = (q_segments, all_segments, q_positions, all_positions)
            if impl == "flash" or self._fused_kernel_planned():
                return flash.flash_attention(q, k, v, *masks)
            if impl == "pallas":
                return flash_pallas.flash_attention(q, k, v, *masks, self.pallas_interpret)
            visible = ((q_segments[:, :, None] == all_segments[:, None, :])
                       & (q_positions[:, :, None] >= all_positions[:, None, :]))
            return jax.nn.dot_product_attention(q, k, v, mask=visible[:, None], scale=1.0,
                                                implementation="xla")

        qkv_spec = P(*blnh)
        return jax.shard_map(
            attend_local, mesh=self._shard_map_mesh(), out_specs=qkv_spec, check_vma=False,
            in_specs=(qkv_spec, qkv_spec, qkv_spec, P(blnh[0], blnh[1])),
        )(query, key, value, positions)


class FusedDotProductAttention(_FusedKernels, qk_norm.QkNormDotProductAttention):
    """praxis's DotProductAttention whose `_dot_atten` is one fused call (module docstring),
    with layers/qk_norm.py's QK-norm when `qk_norm_tpl` is set."""

    attention_impl: str = "xla"
    cudnn_packed: bool = True
    max_segments: int = 0
    pallas_interpret: bool = False
    context_strategy: str = "all_gather"

    def _dot_atten(self, query, key, value, atten_mask, relative_bias=None):
        """query [B, T, N, H], key/value [B, S, N, H] -> (encoded [B, T, N, H], None: no
        probabilities)."""
        if relative_bias is not None or (self.atten_logit_cap or 0) > 0:
            raise NotImplementedError(
                f"ATTENTION_IMPL={self.attention_impl!r} has no relative bias or logit cap")
        return self._fused_context(self._scale_query(query), key, value, atten_mask), None

    def _restates_call(self) -> bool:
        # Context parallelism needs the positions, which praxis's __call__ does not pass on.
        return super()._restates_call() or self._context_shards() > 1

    def _attend(self, query, key, value, atten_mask, positions):
        if (self.atten_logit_cap or 0) > 0:
            raise NotImplementedError(f"ATTENTION_IMPL={self.attention_impl!r} has no logit cap")
        return self._fused_context(self._scale_query(query), key, value, atten_mask,
                                   positions), None


class FusedMultiQueryDotProductAttention(_FusedKernels,
                                         qk_norm.QkNormMultiQueryDotProductAttention):
    """praxis's MultiQueryDotProductAttention (num_kv_heads key/value heads shared by groups
    of query heads) with the fused step, and layers/qk_norm.py's QK-norm when
    `qk_norm_tpl` is set. praxis runs its per-group `_dot_atten` under a vmap over
    key/value heads, which no fused kernel's packed layout survives (cuDNN's batching rule
    flattens the segment lengths), so `__call__` is restated here for the training forward
    pass: projections, (QK-norm,) rotary embeddings, one fused call over all heads, output
    projection. Decoding uses layers/cached_lm.py, not praxis's decode state.
    """

    attention_impl: str = "xla"
    cudnn_packed: bool = True
    max_segments: int = 0
    pallas_interpret: bool = False
    context_strategy: str = "all_gather"

    def __call__(self, query_vec, key_vec, value_vec, atten_mask, query_segment_pos=None,
                 key_segment_pos=None):
        if self.relative_bias_tpl is not None or (self.atten_logit_cap or 0) > 0:
            raise NotImplementedError(
                f"ATTENTION_IMPL={self.attention_impl!r} has no relative bias or logit cap")

        query, key, value = self._project(query_vec, key_vec, value_vec)
        query, key = self._normalize_and_rotate(query, key, query_segment_pos, key_segment_pos)
        encoded = self._fused_context(self._scale_query(query), key, value, atten_mask,
                                      query_segment_pos)
        encoded = self._shard_bld(self.post(encoded))
        return checkpoint_name(encoded, "out_proj"), None


CONTEXT_STRATEGIES = ("all_gather", "ring")


def use_context_parallelism(lm: fdl.Config, strategy: str) -> None:
    """Make the TransformerLm template `lm` one for a mesh with a context axis: the train
    step lays the tokens out of order (paxloom/core/sequence_order.py), so the model reads each
    token's position and document from the batch, as packed input does, and its attention
    (already a fused class, use_attention_impl) masks by them, with keys and values
    exchanged by `strategy` (CONTEXT_STRATEGIES)."""
    lm.packed_input = True
    transformer_layer_template(lm.stacked_transformer_tpl).tr_atten_tpl.context_strategy = (
        strategy)


def jax_pallas_attention():
    """jax's Pallas attention module (ATTENTION_IMPL "pallas"). jax 0.11 deprecates it in
    favour of tokamax's attention; it is still in jax 0.12, and "pallas" stays on it, opt-in,
    until tokamax's kernel has been measured against it on a GPU. The import acknowledges
    that deprecation and only that one, so that any other stays an error in the tests."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"jax\.experimental\.pallas\.ops\.gpu\.attention is "
                                r"deprecated", DeprecationWarning)
        from jax.experimental.pallas.ops.gpu import attention

    return attention


def pallas_block_sizes(query):
    """jax's Pallas kernel's blocks for query [B, T, N, H]: its defaults (128 forward, 32
    backward), fewer for short test sequences and for wide rows (layers/flash_pallas.py
    block_rows: float32 heads of 128 in 128-row blocks do not fit an H100's shared memory)."""
    pallas_attention = jax_pallas_attention()
    block, backward = (min(flash_pallas.block_rows(query, rows), query.shape[1])
                       for rows in (128, 32))
    return pallas_attention.BlockSizes(block_q=block, block_k=block, block_q_dkv=backward,
                                       block_kv_dkv=backward, block_q_dq=backward,
                                       block_kv_dq=backward)


def _repeat_heads(x, num_heads: int):
    """[B, S, K, H] -> [B, S, num_heads, H], each key/value head serving its query group."""
    return x if x.shape[2] == num_heads else jnp.repeat(x, num_heads // x.shape[2], axis=2)


def packed_gqa_is_correct(version: str | None = None) -> bool:
    """Whether this jax computes cuDNN packed attention with fewer key/value heads than
    query heads correctly (PACKED_GQA_FIXED_IN)."""
    release = (version or jax.__version__).split(".dev")[0].split("rc")[0]
    return tuple(int(part) for part in release.split(".")[:3]) >= PACKED_GQA_FIXED_IN


def segment_ids_from_mask(atten_mask, batch_size: int):
    """[B, T] segment ids 1, 2, ... under which causal attention within a segment equals
    `atten_mask` for real tokens.

    Token t may attend to t-1 exactly when both are real tokens of the same document, so a
    masked (t, t-1) entry starts a new segment, except between two padding tokens (a token
    that may not attend to itself, a masked diagonal entry, is padding): a run of padding
    is one segment, so rows with much padding do not break into one segment per token.
    Padding outputs carry no weight, and real tokens never attend to padding. Only the
    mask's diagonal and sub-diagonal are read; XLA computes just those from praxis's mask
    expression.
    """
    mask = jnp.broadcast_to(atten_mask[:, 0], (batch_size, *atten_mask.shape[2:]))  # [B, T, S]
    masked = py_utils.get_large_negative_number(jnp.float32) / 2
    below = jnp.diagonal(mask, offset=-1, axis1=1, axis2=2) < masked  # [B, T-1]: (t, t-1)
    padding = jnp.diagonal(mask, axis1=1, axis2=2) < masked  # [B, T]: (t, t)
    starts = below & ~(padding[:, 1:] & padding[:, :-1])
    first = jnp.ones((batch_size, 1), jnp.int32)
    return jnp.cumsum(jnp.concatenate([first, starts.astype(jnp.int32)], axis=1), axis=1)


def cudnn_segments(segment_ids, max_segments: int = 0):
    """[B, T] segment ids (1, 2, ... along each row) -> (lengths [B, M], starts [B, M + 1]),
    the arguments of jax's packed cuDNN attention: each row's segment lengths and start
    positions in order, -1 past its last segment. M is `max_segments` (0: T, every token
    its own segment at most); a row with more segments than M loses those past M, which
    the input pipeline refuses before they get here (tasks/packing.py
    check_segment_bound). The extra start column is the layout's (jax shifts the -1
    entries out)."""
    batch_size, seq_len = segment_ids.shape
    width = min(max_segments or seq_len, seq_len)
    lengths = jax.vmap(functools.partial(jnp.bincount, length=width))(segment_ids - 1)
    real = jnp.arange(width)[None, :] < segment_ids[:, -1:]  # segment m exists in row b
    starts = jnp.cumsum(lengths, axis=1) - lengths
    pad = jnp.full((batch_size, 1), -1, jnp.int32)
    return (jnp.where(real, lengths, -1).astype(jnp.int32),
            jnp.concatenate([jnp.where(real, starts, -1).astype(jnp.int32), pad], axis=1))


def cudnn_buffer_bytes(batch: int, seq_len: int, heads: int, kv_heads: int, head_dim: int,
                       max_segments: int) -> tuple[int, int]:
    """(kept, workspace): the bytes cuDNN's packed attention holds beyond what the planner's
    stand-in (layers/flash.py, a float32 log-sum-exp [B, N, T] kept per layer) holds, for one
    layer's call on B rows of T tokens, N query heads of H over K key/value heads, at most
    M segments a row. An upper bound, from two sources:

    - jax's fused_attention_stablehlo.py (0.10.2 and 0.11.2) sizes the forward's softmax
      statistics (B * M, N, T) float32, kept for the backward pass: M times the stand-in's.
    - The backward's buffers are decided inside cuDNN when XLA:GPU compiles the call, so
      they are measured: XLA's temporaries of one compiled forward + backward on an H200
      (jax 0.11.2, cuDNN 9.19, 2026-11-27, bench/attention_kernels.py --rows cudnn-packed)
      were M * B * T * N * (4H * G + 8) bytes, G = 2 with fewer key/value heads than query
      heads, else 1: 99.006 GiB at B=8 T=2048 N=12 H=64 M=2048 (1.547 GiB at M=32, 0.048 at
      M=1); 516.002 GiB at B=2 T=4096 N=16 K=4 H=128 M=4096 (4.031 at M=32); 129.0 GiB at
      B=1 T=2048 N=32 K=4 H=128 M=2048 (2.016 at M=32). Every figure is that formula's to
      within 0.1%; the 4H * G bytes are a float32 per-segment query-gradient accumulator
      (two with grouped heads). It is live during one layer's backward at a time.
    """
    segments = min(max_segments or seq_len, seq_len)
    stats = batch * heads * seq_len * 4  # one float32 per row, head and token
    kept = (segments - 1) * stats
    grouped = 2 if kv_heads < heads else 1
    workspace = segments * batch * seq_len * heads * (4 * head_dim * grouped + 8)
    return kept, workspace


def cudnn_packed_attention(query, key, value, segment_ids, max_segments: int = 0):
    """Causal attention within each segment through cuDNN's packed layout (Hopper+).
    query [B, T, N, H] (scaled), key/value [B, T, K, H], segment_ids [B, T], at most
    `max_segments` segments a row (0: T)."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn

    # jax.nn.dot_product_attention takes no segments (a boolean mask becomes a dense bias
    # whose gradient cuDNN refuses for batch > 1, jax#23701), so this calls the function
    # under it, which does.
    lengths, starts = cudnn_segments(segment_ids, max_segments)
    return cudnn.dot_product_attention(
        query, key, value, q_seqlen=lengths, kv_seqlen=lengths, q_offsets=starts,
        kv_offsets=starts, scale=1.0, mask_type=cudnn.MaskType.PADDING_CAUSAL,
        qkv_layout="BTNH")


def resolve(impl: str, *, packed_input: bool, platform: str, atten_dropout_prob: float,
            hopper_or_newer: bool = True, dtype: str = "bfloat16", head_dim: int = 64,
            context_shards: int = 1, grouped_kv: bool = False,
            device_checks: bool = True) -> str:
    """The implementation to use for ATTENTION_IMPL=`impl` on `platform`; ValueError (one
    line) for a choice that cannot be exact or cannot run there. `hopper_or_newer`: the
    GPU has cuDNN's packed layout (compute capability 9.0+); `dtype`: FPROP_DTYPE;
    `context_shards`: the size of the mesh's context axis; `grouped_kv`: fewer key/value
    heads than query heads; `device_checks=False`: a graph only to print, so what just the
    devices decide (a GPU, a Hopper one) is not refused, the settings' own limits still are.
    'auto' on a GPU takes the fastest path a GPU has measured working in this case
    (layers/measured.py); start_note says when it took none."""
    if context_shards > 1:
        return _resolve_for_context(impl, atten_dropout_prob, context_shards, platform,
                                    case_of(packed_input, grouped_kv, dtype, True,
                                            hopper_or_newer))
    if impl not in ("praxis", "auto") and atten_dropout_prob > 0:
        raise ValueError(f"ATTENTION_IMPL={impl!r} has no attention dropout; set "
                         f"ATTEN_DROPOUT_PROB=0 or use 'praxis'")
    # A graph only printed has no device to ask: its head dimension meets the newest GPUs' limit.
    max_head_dim = 256 if hopper_or_newer or not device_checks else 128
    cudnn_problem = (
        f"needs a GPU (this is {platform}); use 'xla' or 'praxis'"
        if platform != "gpu" and device_checks else
        f"needs FPROP_DTYPE bfloat16 or float16 (not {dtype}); use 'pallas'"
        if dtype not in ("bfloat16", "float16") else
        f"needs a head dimension that is a multiple of 8 and at most {max_head_dim} (not "
        f"{head_dim}); use 'pallas'" if head_dim % 8 or head_dim > max_head_dim else
        "masks packed rows only on Hopper or newer GPUs; use 'pallas', or "
        "--fdl.PACKED_INPUT=False"
        if packed_input and not hopper_or_newer and device_checks else None)
    if impl == "auto":
        if atten_dropout_prob > 0 or platform != "gpu":
            return "praxis"
        allowed = [i for i in IMPLS if i != "auto" and not (i == "cudnn" and cudnn_problem)]
        return measured.choose("attention", case_of(packed_input, grouped_kv, dtype, False,
                                                    hopper_or_newer), allowed)
    if impl == "cudnn" and cudnn_problem:
        raise ValueError(f"ATTENTION_IMPL='cudnn' {cudnn_problem}")
    return impl


def case_of(packed_input: bool, grouped_kv: bool, dtype: str, context: bool,
            hopper_or_newer: bool) -> measured.Case:
    """The case of layers/measured.py's table that a run's attention is."""
    return measured.Case(packed=packed_input, grouped_kv=grouped_kv, dtype=dtype,
                         context=context, hopper=hopper_or_newer)


def start_note(named: str, resolved: str, case: measured.Case) -> str | None:
    """On a GPU, the line to show at start when ATTENTION_IMPL=`named` runs `resolved`,
    which no GPU has measured working in `case` (None when one has)."""
    return measured.unmeasured_note("attention", resolved, case, chosen_by_auto=named == "auto")


def _resolve_for_context(impl: str, atten_dropout_prob: float, shards: int,
                         platform: str, case: measured.Case) -> str:
    where = f"with {shards}-way context parallelism (the mesh's context axis)"
    if atten_dropout_prob > 0:
        raise ValueError(f"attention dropout {where} is not built; set ATTEN_DROPOUT_PROB=0 "
                         f"(and DROPOUT_PROB=0, which it defaults to)")
    if impl == "auto":
        if platform != "gpu":
            return "flash"
        return measured.choose("attention", case, CONTEXT_IMPLS)
    if impl not in CONTEXT_IMPLS:
        raise ValueError(f"ATTENTION_IMPL={impl!r} cannot attend {where} (only "
                         f"{' and '.join(map(repr, CONTEXT_IMPLS))} can); use 'auto', or a "
                         f"mesh without a context axis")
    return impl


def use_attention_impl(layer: fdl.Config, impl: str, *, hopper_or_newer: bool = True,
                       pallas_interpret: bool = False, max_segments: int = 0,
                       packed_input: bool = True) -> None:
    """Make the Transformer layer template `layer` use attention implementation `impl`
    (already resolved): its praxis attention template becomes the fused subclass.
    `pallas_interpret`: run Pallas interpreted (tests off a GPU; the planner instead traces
    the flash stand-in)."""
    if impl == "praxis":
        return
    attention = layer.tr_atten_tpl
    # The fused classes derive from the QK-norm ones: a QK-norm template keeps its norm.
    fused = {attentions.DotProductAttention: FusedDotProductAttention,
             qk_norm.QkNormDotProductAttention: FusedDotProductAttention,
             multi_query_attention.MultiQueryDotProductAttention:
                 FusedMultiQueryDotProductAttention,
             qk_norm.QkNormMultiQueryDotProductAttention: FusedMultiQueryDotProductAttention}
    fused_cls = next((f for c, f in fused.items() if attention.cls in (c, f)), None)
    if fused_cls is None:
        raise ValueError(f"ATTENTION_IMPL={impl!r} replaces praxis's DotProductAttention or "
                         f"MultiQueryDotProductAttention, but this model's attention is "
                         f"{attention.cls.__name__}; use 'praxis'")
    fdl.update_callable(attention, fused_cls)
    attention.attention_impl = impl
    # Unpacked rows (one document, padding only at the end) are exact under the plain causal
    # call, which needs no per-segment buffers.
    attention.cudnn_packed = hopper_or_newer and packed_input
    attention.max_segments = max_segments
    attention.pallas_interpret = impl == "pallas" and pallas_interpret


def packed_gqa_note(layer: fdl.Config) -> str | None:
    """A line to show when `layer`'s attention takes cuDNN's packed path with grouped
    key/value heads on a jax that computes that wrongly (PACKED_GQA_FIXED_IN)."""
    attention = layer.tr_atten_tpl
    if (attention.cls is FusedMultiQueryDotProductAttention
            and attention.attention_impl == "cudnn" and attention.cudnn_packed
            and not packed_gqa_is_correct()):
        fixed = ".".join(map(str, PACKED_GQA_FIXED_IN))
        return (f"note: jax {jax.__version__} computes cuDNN packed attention with grouped "
                f"key/value heads wrongly (fixed in {fixed}); each key/value head is repeated "
                f"for its query group instead (correct, more memory)")
    return None


def hopper_or_newer(devices) -> bool:
    """Whether every one of these GPU devices has compute capability 9.0 or more."""
    return target.of_devices(devices).hopper_or_newer
