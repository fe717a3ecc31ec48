"""Attention kernels alone, forward + backward: milliseconds per call of each
implementation of layers/attention.py at one shape, on whatever device is present.

Rows (--rows, default all): praxis's materialised attention (einsums around a float32
softmax, the mask as a bias), XLA's jax.nn.dot_product_attention, jax's Pallas Triton
kernel with segment ids, cuDNN causal (no segments) and cuDNN packed (segments as lengths
and starts), flash attention in plain JAX (layers/flash.py) and Paxloom's Pallas kernel
masked by positions (layers/flash_pallas.py), each with one and with three documents per
row. The packed cuDNN row is the path ATTENTION_IMPL=auto takes on Hopper; the last two
are the kernels per device with a context axis.

    python bench/attention_kernels.py                          # B=8 T=2048 N=12 H=64 bf16
    python bench/attention_kernels.py --kv_heads 4 --heads 32  # grouped-query
    python bench/attention_kernels.py --batch 1 --seq 16384 --heads 32 --kv_heads 8 \
        --head_dim 128 --rows cudnn-packed,pallas-positions,flash   # a long row
    python bench/attention_kernels.py --rows cudnn-packed --max_segments 2048,32,1 \
        --repeats 0                                            # cuDNN's buffers by bound
    python bench/attention_kernels.py --tiny                   # CPU smoke run

Each row also shows XLA's temporary memory of its compiled forward + backward (the
kernel's own buffers: for cuDNN packed, sized by its segment bound, --max_segments);
--repeats 0 compiles only.
"""

import argparse
import functools
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from layers import attention, flash, flash_pallas  # noqa: E402


def reference(query, key, value, segment_ids):
    """Materialised attention, as praxis computes it (float32 softmax over a masked bias)."""
    groups = query.shape[2] // key.shape[2]
    key, value = (jnp.repeat(x, groups, axis=2) for x in (key, value))
    logits = jnp.einsum("btnh,bsnh->bnts", query, key).astype(jnp.float32)
    seq = query.shape[1]
    allowed = (segment_ids[:, :, None] == segment_ids[:, None, :]) & jnp.tril(
        jnp.ones((seq, seq), bool))
    logits = jnp.where(allowed[:, None], logits, -0.7 * jnp.finfo(jnp.float32).max)
    probs = jax.nn.softmax(logits, axis=-1).astype(value.dtype)
    return jnp.einsum("bnts,bsnh->btnh", probs, value)


def pallas(query, key, value, segment_ids):
    pallas_attention = attention.jax_pallas_attention()
    groups = query.shape[2] // key.shape[2]
    key, value = (jnp.repeat(x, groups, axis=2) for x in (key, value))
    return pallas_attention.mha(query, key, value, segment_ids, sm_scale=1.0, causal=True,
                                interpret=jax.default_backend() != "gpu")


def by_positions(kernel):
    """A kernel masked by segments and positions, given a row's segment ids."""
    def call(query, key, value, segment_ids):
        positions = flash.positions_from_segment_ids(segment_ids)
        return kernel(query, key, value, segment_ids, segment_ids, positions, positions)
    return call


# --rows name: (label, needs a GPU, call(query, key, value, segment_ids)).
ROWS = {
    "praxis": ("praxis (materialised)", False, reference),
    "xla": ("xla", False, lambda q, k, v, s: jax.nn.dot_product_attention(
        q, k, v, is_causal=True, implementation="xla")),
    "pallas": ("pallas (segment ids)", False, pallas),
    "cudnn": ("cudnn causal", True, lambda q, k, v, s: jax.nn.dot_product_attention(
        q, k, v, is_causal=True, implementation="cudnn")),
    "cudnn-packed": ("cudnn packed", True, None),  # per --max_segments (main)
    "flash": ("flash (plain JAX)", False, by_positions(flash.flash_attention)),
    "pallas-positions": ("pallas (positions)", False, by_positions(
        lambda *args: flash_pallas.flash_attention(*args, jax.default_backend() != "gpu"))),
}


def temp_gib(compiled) -> float | None:
    """XLA's temporary buffers of a compiled call, GiB (None where the backend has none)."""
    stats = compiled.memory_analysis()
    return None if stats is None else stats.temp_size_in_bytes / 2**30


def time_call(fn, args, repeats: int) -> float | None:
    """Median milliseconds of fn(*args) after one warm-up call; None for no repeats."""
    if not repeats:
        return None
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv_heads", type=int, default=0, help="0 = as many as --heads")
    parser.add_argument("--head_dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20, help="0: compile only")
    parser.add_argument("--max_segments", default="32",
                        help="comma-separated segment bounds of the cudnn-packed row "
                             "(MAX_SEGMENTS_PER_SEQ; 0: the sequence length)")
    parser.add_argument("--rows", default=",".join(ROWS),
                        help=f"comma-separated, of {', '.join(ROWS)}")
    parser.add_argument("--tiny", action="store_true", help="B=2 T=128 N=4 H=16 (CPU)")
    parser.add_argument("--dry_run", action="store_true",
                        help="check the arguments, print the rows and stop")
    args = parser.parse_args()
    rows = args.rows.split(",")
    unknown = [name for name in rows if name not in ROWS]
    if unknown:
        parser.error(f"--rows: unknown {', '.join(unknown)} (one of {', '.join(ROWS)})")
    if args.dry_run:
        print("rows:", ", ".join(ROWS[name][0] for name in rows))
        return
    if args.tiny:
        args.batch, args.seq, args.heads, args.head_dim, args.repeats = 2, 128, 4, 16, 2
    kv_heads = args.kv_heads or args.heads
    on_gpu = jax.default_backend() == "gpu"
    b, t = args.batch, args.seq
    keys = jax.random.split(jax.random.key(0), 4)
    query = jax.random.normal(keys[0], (b, t, args.heads, args.head_dim), jnp.bfloat16)
    key, value = (jax.random.normal(k, (b, t, kv_heads, args.head_dim), jnp.bfloat16)
                  for k in keys[1:3])
    query = query * args.head_dim**-0.5
    cotangent = jax.random.normal(keys[3], query.shape, jnp.bfloat16)
    # Rows of one document, and rows of three documents (the packed Pile's common case).
    one_doc = jnp.ones((b, t), jnp.int32)
    three_docs = 1 + (jnp.arange(t)[None, :] >= t // 3) + (jnp.arange(t)[None, :] >= t // 2)
    three_docs = jnp.broadcast_to(three_docs, (b, t)).astype(jnp.int32)

    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}: B={b} T={t} "
          f"heads={args.heads} kv_heads={kv_heads} head_dim={args.head_dim} bf16, causal, "
          f"forward + backward, median of {args.repeats}")
    variants = []
    for name in rows:
        label, needs_gpu, fn = ROWS[name]
        if needs_gpu and not on_gpu:
            continue
        if name == "cudnn-packed":
            variants += [(f"{label} M={m or t}", name, functools.partial(
                attention.cudnn_packed_attention, max_segments=m))
                for m in map(int, args.max_segments.split(","))]
        else:
            variants.append((label, name, fn))
    for label, name, fn in variants:

        def fwd_bwd(q, k, v, s, fn=fn):
            out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, s), q, k, v)
            return out, vjp(cotangent)

        step = jax.jit(fwd_bwd)
        for docs, segments in (("1 doc/row", one_doc), ("3 docs/row", three_docs)):
            if name in ("xla", "cudnn") and docs != "1 doc/row":
                continue  # no segments: the same call as one document per row
            try:
                call_args = (query, key, value, segments)
                compiled = step.lower(*call_args).compile()
                temp = temp_gib(compiled)
                ms = time_call(compiled, call_args, args.repeats)
                print(f"  {label:28s} {docs:11s} "
                      f"{'-' if ms is None else f'{ms:8.3f} ms':>11s} "
                      f"{'-' if temp is None else f'{temp:9.3f} GiB temp'}", flush=True)
            except Exception as e:  # noqa: BLE001 - a kernel this device lacks is a row
                print(f"  {label:28s} {docs:11s} failed: {str(e).splitlines()[0][:120]}",
                      flush=True)


if __name__ == "__main__":
    main()
