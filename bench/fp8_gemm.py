"""Raw GEMMs, bfloat16 against float8: TFLOP/s of each way USE_FP8's matmul can be written,
and whether XLA lowered it to cuBLASLt's FP8 GEMM, on whatever device is present.

For each shape (8192^3, and each --configs experiment's feed-forward matmul: tokens per
device x MODEL_DIMS x HIDDEN_DIMS), rows of:

    bf16                 x @ w in bfloat16, the baseline
    fp8                  operands already float8_e4m3fn, lax.dot_general(...,
                         preferred_element_type=bfloat16): the bare FP8 GEMM
    fp8 x scale          the same times the product of two shape-[1] float32 scales, as
                         flax's out_dq dequantizes (XLA can fold it into the GEMM's alpha)
    fp8 current scaling  from bfloat16: both amaxes, quantize, GEMM, dequantize, in one call
                         (the amax reductions are on the GEMM's critical path)
    flax delayed         flax's fp8_ops.fp8_scaled_dot_general with shape-[1] scales and
                         1024-entry amax histories: exactly what USE_FP8 runs (layers/fp8.py)
    bf16 fwd+bwd         x @ w and its two gradient GEMMs (6 M K N FLOPs)
    flax delayed fwd+bwd the same through fp8_scaled_dot_general (gradient in e5m2)

The "f8 calls" column counts `__cublas$lt$matmul$f8` custom calls in the compiled HLO
(XLA's gemm_rewriter emits them only on compute capability >= 8.9 with CUDA >= 12, for
dots whose operands are float8, or convert(float8) times a scalar scale, through
reshapes/transposes/slices; any other FP8 dot it turns into an f16 dot: 0 there means the
FP8 rate is not being had). "cublas calls" counts every cuBLAS/cuBLASLt GEMM call.

    python bench/fp8_gemm.py                              # on the GPU present
    python bench/fp8_gemm.py --configs GPT1_3B --percore_batch_size 8
    python bench/fp8_gemm.py --tiny                       # CPU smoke run (the default on CPU)
"""

import argparse
import functools
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

FP8_CALL = "__cublas$lt$matmul$f8"

def model_shapes(configs: list[str], percore_batch_size: float | None, tiny: bool):
    """(label, M, K, N) of each experiment's first feed-forward matmul on one device."""
    import experiments

    shapes = []
    for name in configs:
        exp = experiments.resolve(f"experiments.{name}")()
        batch = percore_batch_size or exp.PERCORE_BATCH_SIZE
        m, k, n = int(batch * exp.MAX_SEQ_LEN), exp.MODEL_DIMS, exp.HIDDEN_DIMS
        if tiny:
            m, k, n = 128, 64, 256
        shapes.append((f"{name} FFN", m, k, n))
    return shapes


def variants():
    """name -> (function of (x, w, state), FLOPs per M K N)."""
    import jax
    import jax.numpy as jnp
    from flax.linen import fp8_ops

    e4m3 = jnp.float8_e4m3fn
    dims = (((1,), (0,)), ((), ()))

    def bf16(x, w, s):
        return jnp.dot(x, w)

    def fp8(x, w, s):
        return jax.lax.dot_general(s["x8"], s["w8"], dims, preferred_element_type=jnp.bfloat16)

    def fp8_scaled(x, w, s):
        out = fp8(x, w, s)
        return out * jnp.broadcast_to((s["sx"] * s["sw"]).astype(jnp.bfloat16), out.shape)

    def quantize(v):
        scale = (jnp.max(jnp.abs(v)).astype(jnp.float32) / 448.0).reshape(1)
        q = jnp.clip(v / scale.astype(v.dtype), -448, 448).astype(e4m3)
        return q, scale

    def current(x, w, s):
        (qx, sx), (qw, sw) = quantize(x), quantize(w)
        out = jax.lax.dot_general(qx, qw, dims, preferred_element_type=jnp.bfloat16)
        return out * jnp.broadcast_to((sx * sw).astype(jnp.bfloat16), out.shape)

    def delayed(x, w, s):
        return fp8_ops.fp8_scaled_dot_general(
            x, w, dims, preferred_element_type=jnp.bfloat16, lhs_scale=s["sx"],
            rhs_scale=s["sw"], grad_scale=s["sg"], lhs_amax_history=s["hx"],
            rhs_amax_history=s["hw"], grad_amax_history=s["hg"],
            quantize_compute_type=jnp.bfloat16)

    def fwd_bwd(fn):
        def step(x, w, s):
            out, vjp = jax.vjp(lambda x, w: fn(x, w, s), x, w)
            return out, vjp(s["g"])
        return step

    return {
        "bf16": (bf16, 2), "fp8": (fp8, 2), "fp8 x scale": (fp8_scaled, 2),
        "fp8 current scaling": (current, 2), "flax delayed": (delayed, 2),
        "bf16 fwd+bwd": (fwd_bwd(bf16), 6), "flax delayed fwd+bwd": (fwd_bwd(delayed), 6),
    }


def operands(m: int, k: int, n: int):
    import jax
    import jax.numpy as jnp

    from layers.fp8 import AMAX_HISTORY_LENGTH

    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
    w = (jax.random.normal(keys[1], (k, n), jnp.float32) * 0.02).astype(jnp.bfloat16)
    one = jnp.ones((1,), jnp.float32)
    # Scales as delayed scaling would hold them after some steps: amax / fp8 max.
    sx = (jnp.max(jnp.abs(x)).astype(jnp.float32) / 448.0).reshape(1)
    sw = (jnp.max(jnp.abs(w)).astype(jnp.float32) / 448.0).reshape(1)
    history = functools.partial(jnp.zeros, (AMAX_HISTORY_LENGTH,), jnp.float32)
    state = {
        "x8": (x / sx.astype(x.dtype)).astype(jnp.float8_e4m3fn),
        "w8": (w / sw.astype(w.dtype)).astype(jnp.float8_e4m3fn),
        "sx": sx, "sw": sw, "sg": one,
        "hx": history().at[0].set(sx[0] * 448.0), "hw": history().at[0].set(sw[0] * 448.0),
        "hg": history(), "g": jax.random.normal(keys[2], (m, n), jnp.bfloat16),
    }
    return x, w, state




def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="Synthetic5B,GPT1_3B",
                        help="experiments whose feed-forward GEMM shape to add")
    parser.add_argument("--percore_batch_size", type=float, default=None,
                        help="tokens per device = this x MAX_SEQ_LEN (default: the experiment's)")
    parser.add_argument("--square", type=int, default=8192, help="the M=K=N shape (0: none)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tiny", action=argparse.BooleanOptionalAction, default=None,
                        help="256^3 and 128x64x256, 2 repeats (default on CPU)")
    args = parser.parse_args()

    import jax

    from bench.attention_kernels import time_call  # median milliseconds

    on_gpu = jax.default_backend() == "gpu"
    if args.tiny is None:
        args.tiny = not on_gpu
    if args.tiny:
        args.square, args.repeats = min(args.square, 256), 2
    shapes = ([("square", args.square, args.square, args.square)]
              if args.square else [])
    shapes += model_shapes([c for c in args.configs.split(",") if c], args.percore_batch_size,
                           args.tiny)
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}, "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}: median of {args.repeats} calls")
    print(f"  {'shape':<34} {'variant':<22} {'ms':>9} {'TFLOP/s':>8} {'vs bf16':>7} "
          f"{'f8 calls':>8} {'cublas calls':>12}")
    for label, m, k, n in shapes:
        x, w, state = operands(m, k, n)
        baseline = {}
        for name, (fn, flops) in variants().items():
            step = jax.jit(fn)
            shape = f"{label} {m}x{k}x{n}"
            try:
                text = step.lower(x, w, state).compile().as_text()
                seconds = time_call(step, (x, w, state), args.repeats) / 1e3
            except Exception as e:  # noqa: BLE001 - a variant this backend lacks is a row
                print(f"  {shape:<34} {name:<22} failed: {str(e).splitlines()[0][:120]}")
                continue
            tflops = flops * m * k * n / seconds / 1e12
            kind = "fwd+bwd" if "fwd+bwd" in name else "fwd"
            baseline.setdefault(kind, tflops)  # the bf16 row of each kind comes first
            f8_calls, cublas = text.count(FP8_CALL), text.count('custom_call_target="__cublas$')
            print(f"  {shape:<34} {name:<22} {seconds * 1e3:>9.3f} {tflops:>8.1f} "
                  f"{tflops / baseline[kind]:>6.2f}x "
                  f"{f8_calls if on_gpu else '-':>8} {cublas if on_gpu else '-':>12}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
