"""The Pallas attention kernel masked by documents and positions (layers/flash_pallas.py):
its output and gradients equal an independent dense reference (XLA's attention with the
mask written out) on rows in order and in context parallelism's load-balanced order, packed
and not, with grouped-query heads and a head size that is not a power of 2; its block lists
skip only blocks without a visible entry; and it (with jax's Pallas kernel at
layers/attention.py's blocks) compiles for an H100 through XLA:GPU's Triton without a GPU. Off a GPU it runs in Pallas's interpret mode; on one (bench/gpu_check.sh)
compiled, in bfloat16 too."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layers import flash, flash_pallas
from paxloom.core import sequence_order
from paxloom.runner.planning import gpu_target
from tests.support.processes import run_python, session_env

ON_GPU = jax.default_backend() == "gpu"
B, T = 2, 64
# Small blocks, so that a 64-token row has several of each and the lists skip some.
SMALL_BLOCKS = {"FORWARD_BLOCKS": (16, 16), "BACKWARD_BLOCKS": (16, 16)}


@pytest.fixture
def small_blocks(monkeypatch):
    for name, blocks in SMALL_BLOCKS.items():
        monkeypatch.setattr(flash_pallas, name, blocks)


def rows(packed: bool, shards: int):
    """(segments, positions) [B, T] laid out in the load-balanced order for `shards`
    devices (1: in order): documents of 20, 30 and 14 tokens (packed) or one per row."""
    lengths = [[20, 30, 14], [9, 40, 15]] if packed else [[T], [T]]
    positions = np.array([np.concatenate([np.arange(n) for n in row]) for row in lengths],
                         np.int32)
    order = sequence_order.load_balanced_order(T, shards)
    positions = positions[:, order]
    return np.asarray(flash.segment_ids_from_positions(positions, order)), positions


def qkv(heads: int, kv_heads: int, head_dim: int, dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(0), 3)
    shapes = [(B, T, heads, head_dim), (B, T, kv_heads, head_dim), (B, T, kv_heads, head_dim)]
    return [jax.random.normal(k, s, jnp.float32).astype(dtype) for k, s in zip(keys, shapes,
                                                                              strict=True)]


def dense_reference(query, key, value, segments, positions):
    """XLA's attention with the whole [T, T] mask: float32, each key/value head repeated
    for its query group."""
    group = query.shape[2] // key.shape[2]
    key, value = (jnp.repeat(x.astype(jnp.float32), group, axis=2) for x in (key, value))
    visible = ((segments[:, :, None] == segments[:, None, :])
               & (positions[:, :, None] >= positions[:, None, :]))
    return jax.nn.dot_product_attention(query.astype(jnp.float32), key, value,
                                        mask=visible[:, None], scale=1.0, implementation="xla")


def outputs_and_grads(attend, query, key, value, segments, positions):
    cotangent = jax.random.normal(jax.random.key(3), query.shape, jnp.float32)

    def loss(q, k, v):
        out = attend(q, k, v, segments, positions)
        return jnp.sum(out.astype(jnp.float32) * cotangent), out

    with jax.default_matmul_precision("highest"):
        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(
            query, key, value)
    return [np.asarray(x, np.float32) for x in (out, *grads)]


def pallas(q, k, v, segments, positions):
    return flash_pallas.flash_attention(q, k, v, segments, segments, positions, positions,
                                        not ON_GPU)


def assert_close(found, expected, rtol):
    for name, f, e in zip(("output", "d_query", "d_key", "d_value"), found, expected,
                          strict=True):
        np.testing.assert_allclose(f, e, rtol=rtol, atol=rtol * np.abs(e).max(), err_msg=name)


HEADS = {"mha": (4, 4, 16), "gqa": (4, 2, 16), "mqa-h24": (4, 1, 24)}  # N, K, H
QUICK = {("gqa", 4, True), ("mqa-h24", 2, True), ("mha", 1, False)}  # about 1 s each
KERNEL_CASES = [pytest.param(*HEADS[heads], shards, packed, id=f"{heads}-order{shards}-"
                             f"{'packed' if packed else 'unpacked'}",
                             marks=[] if (heads, shards, packed) in QUICK else [pytest.mark.slow])
                for heads in HEADS for shards in (1, 2, 4) for packed in (True, False)]


@pytest.mark.parametrize("heads,kv_heads,head_dim,shards,packed", KERNEL_CASES)
def test_the_kernel_equals_dense_attention(small_blocks, heads, kv_heads, head_dim, shards,
                                           packed):
    segments, positions = rows(packed, shards)
    query, key, value = qkv(heads, kv_heads, head_dim)
    expected = outputs_and_grads(dense_reference, query, key, value, segments, positions)
    found = outputs_and_grads(pallas, query, key, value, segments, positions)
    assert_close(found, expected, rtol=1e-5)


def test_the_check_fails_when_the_kernel_skips_a_visible_block(small_blocks, monkeypatch):
    segments, positions = rows(True, 2)
    query, key, value = qkv(4, 2, 16)
    expected = outputs_and_grads(dense_reference, query, key, value, segments, positions)
    lists = flash_pallas._block_lists
    monkeypatch.setattr(flash_pallas, "_block_lists",  # the last block of each list dropped
                        lambda visible: (lambda b, c: (b, jnp.maximum(c - 1, 1)))(*lists(visible)))
    found = outputs_and_grads(pallas, query, key, value, segments, positions)
    with pytest.raises(AssertionError):
        assert_close(found, expected, rtol=1e-5)


def exact_block_visibility(segments, positions, q_block, k_block):
    """[B, T/q_block, T/k_block]: does any query of the block see any key of the other?"""
    visible = ((segments[:, :, None] == segments[:, None, :])
               & (positions[:, :, None] >= positions[:, None, :]))
    b, t, _ = visible.shape
    return visible.reshape(b, t // q_block, q_block, t // k_block, k_block).any(axis=(2, 4))


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
@pytest.mark.parametrize("shards", [1, 2, 4], ids=lambda n: f"order{n}")
def test_the_block_lists_keep_every_visible_block_and_skip_the_future(packed, shards):
    segments, positions = rows(packed, shards)
    exact = exact_block_visibility(segments, positions, 8, 8)
    listed = np.asarray(flash_pallas._visible_blocks(segments, positions, segments, positions,
                                                     8, 8))
    assert not np.any(exact & ~listed)  # nothing visible is skipped
    if not packed:  # causal in any order: exactly the 36 of 64 pairs with a visible entry
        np.testing.assert_array_equal(listed, exact)
        assert exact.sum(axis=(1, 2)).tolist() == [36, 36]
    else:  # beyond those, only pairs where a block holds a document's start (31, 33 for 22, 25)
        starts = (positions == 0).reshape(B, -1, 8).any(axis=2)  # [B, blocks]
        row, queries, keys = np.nonzero(listed & ~exact)
        assert (starts[row, queries] | starts[row, keys]).all()
        assert listed.sum(axis=(1, 2)).tolist() == [31, 33]


@pytest.mark.skipif(not ON_GPU, reason="compiled kernels need a GPU")
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
def test_the_compiled_kernel_equals_dense_attention_on_a_gpu(dtype):
    # The kernel's own blocks (64 forward, 32 backward at 64 tokens), compiled by Triton.
    segments, positions = rows(True, 4)
    query, key, value = qkv(8, 2, 128, dtype)
    expected = outputs_and_grads(dense_reference, query, key, value, segments, positions)
    found = outputs_and_grads(pallas, query, key, value, segments, positions)
    # float32: exact matmuls (no TF32); bfloat16: a few ulps (2^-7) of the largest values.
    assert_close(found, expected, rtol=1e-5 if dtype == jnp.float32 else 4 * 2.0**-7)


COMPILE_FOR_H100 = """
import sys
from paxloom.runner.planning import gpu_target
gpu_target.start_jax()
import jax, jax.numpy as jnp
from paxloom.core import sequence_order
from layers import flash, flash_pallas
device = gpu_target.devices("h100", 80 * 2**30, [1], [1])[0]
sharding = jax.sharding.SingleDeviceSharding(device)
dtype = getattr(jnp, sys.argv[1])
b, t, s, n, k, h = 1, 2048, 8192, 8, 2, 128  # a device's queries against gathered keys
order = sequence_order.load_balanced_order(s, 4)
spec = lambda *shape, dtype=dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
def loss(q, key, v, k_positions):
    k_segments = flash.segment_ids_from_positions(k_positions, order)
    out = flash_pallas.flash_attention(q, key, v, k_segments[:, :t], k_segments,
                                       k_positions[:, :t], k_positions)
    return out.astype(jnp.float32).sum()
# Pallas's Triton lowering reads the GPU's kind from the abstract mesh where no GPU is the
# default device (jax 0.11).
with jax.sharding.use_abstract_mesh(jax.sharding.Mesh([device], ("one",)).abstract_mesh):
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(
        spec(b, t, n, h), spec(b, s, k, h), spec(b, s, k, h), spec(b, s, dtype=jnp.int32)
    ).lower(lowering_platforms=("cuda",)).compile().as_text()
    # ATTENTION_IMPL "pallas" without a context axis: jax's kernel with layers/attention.py's
    # blocks.
    from layers import attention
    pallas_attention = attention.jax_pallas_attention()
    def jax_kernel_loss(q, key, v, segments):
        return pallas_attention.mha(q, key, v, segments, causal=True,
                                    block_sizes=attention.pallas_block_sizes(q)).sum()
    text += jax.jit(jax.grad(jax_kernel_loss, argnums=(0, 1, 2))).trace(
        spec(b, t, n, h), spec(b, t, n, h), spec(b, t, n, h), spec(b, t, dtype=jnp.int32)
    ).lower(lowering_platforms=("cuda",)).compile().as_text()
print(*(name for name in ("paxloom_flash_forward", "paxloom_flash_dq", "paxloom_flash_dkv",
                          "mha_forward", "mha_backward") if f'name = "{name}"' in text))
"""


@pytest.mark.process
@pytest.mark.skipif(not gpu_target.installed(),
                    reason="XLA:GPU's plugin is not installed (make install)")
@pytest.mark.skipif(ON_GPU, reason="on a GPU, Triton compiles the kernels for real "
                                   "(test_the_compiled_kernel_equals_dense_attention_on_a_gpu)")
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_kernels_compile_for_an_h100_without_one(dtype):
    # XLA:GPU lowers each kernel's Triton IR and compiles it for sm_90 at compile time, so a
    # kernel Triton cannot build (an array that is not a power of 2, too much shared memory)
    # fails here: float32 heads of 128 in 128-row blocks did (MAX_TILE_BYTES), in this
    # kernel and in jax's (ATTENTION_IMPL "pallas" without a context axis, and what "auto"
    # picks for float32 on a GPU).
    out = run_python("-c", COMPILE_FOR_H100, dtype, env=session_env(XLA_FLAGS=""),
                     timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["paxloom_flash_forward", "paxloom_flash_dq",
                                  "paxloom_flash_dkv", "mha_forward", "mha_backward"]
