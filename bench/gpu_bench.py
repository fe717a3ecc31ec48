"""Training speed per model and attention implementation, on whatever devices are present.

For each experiment (Synthetic126M, GPT1_3B, and Synthetic5B cut to 8 layers so it fits one
GPU) and each attention implementation (layers/attention.py): compile time, steady step
time, tokens/s, MFU (the README's formula, against runner/throughput.py's peak table) and
peak device memory, as a table on stdout and a JSON file. The data are synthetic rows of
one document each, so "cudnn" (causal only) runs them with PACKED_INPUT=False and computes
the same thing as the others. With --tiny (the default on CPU) every model shrinks to
2 layers x 64, so CI can run the whole path in seconds.

    python bench/gpu_bench.py --json runs/gpu_bench.json                  # on the GPUs present
    python bench/gpu_bench.py --configs Synthetic126M --impls praxis,pallas --steps 20
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/gpu_bench.py --steps 2
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
from praxis import pax_fiddle  # noqa: E402

import experiments  # noqa: E402
from runner import mesh as mesh_lib  # noqa: E402
from runner.trainer import Trainer  # noqa: E402

# Per experiment: its overrides, and whether its weights are split over the devices (FSDP)
# or copied to each (data parallelism).
CONFIGS = {
    "Synthetic126M": ({}, "dp"),
    "GPT1_3B": ({"DATASET": "synthetic", "LAMBADA_EVAL": False}, "fsdp"),
    "Synthetic5B": ({"NUM_LAYERS": 8}, "fsdp"),
}
TINY = dict(NUM_LAYERS=2, MODEL_DIMS=64, HIDDEN_DIMS=256, NUM_HEADS=4, DIMS_PER_HEAD=16,
            MAX_SEQ_LEN=128, VOCAB_SIZE=512, PERCORE_BATCH_SIZE=1)


def build(name: str, impl: str, tiny: bool, percore_batch_size: float | None) -> Trainer:
    overrides, layout = CONFIGS[name]
    n = jax.device_count()
    settings = {
        **overrides,
        "ICI_MESH_SHAPE": [n, 1, 1] if layout == "dp" else [1, n, 1],
        "DCN_MESH_SHAPE": [1, 1, 1],
        "ATTENTION_IMPL": impl,
        "PACKED_INPUT": impl != "cudnn",
        "EVAL_BATCHES": 0,
        **(TINY if tiny else {}),
    }
    if percore_batch_size:
        settings["PERCORE_BATCH_SIZE"] = percore_batch_size
    exp = experiments.resolve(f"experiments.{name}")(**settings)
    run = pax_fiddle.build(exp.run_config())
    mesh = mesh_lib.create_mesh(run.mesh.ici_mesh_shape, run.mesh.dcn_mesh_shape)
    return Trainer(run, mesh, "/tmp/paxloom-bench")


def measure(trainer: Trainer, steps: int) -> dict:
    state = trainer.init_state()
    batch = trainer.to_device(trainer.make_train_input().next_batch())
    start = time.perf_counter()
    with trainer.mesh:
        step = trainer.train_step.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    with trainer.mesh:
        for _ in range(2):  # warm up
            state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        start = time.perf_counter()
        for _ in range(steps):
            state, metrics = step(state, batch)
            if trainer.sync_every_step:  # XLA:CPU, see Trainer.__init__
                jax.block_until_ready(metrics)
        jax.block_until_ready((state, metrics))
    step_s = (time.perf_counter() - start) / steps
    tokens_per_s = trainer.global_batch_size * trainer.run.model_shape.seq_len / step_s
    stats = jax.devices()[0].memory_stats() or {}
    mfu = (tokens_per_s * trainer.flops_per_token / (jax.device_count() * trainer.peak_flops)
           if trainer.peak_flops else None)
    return {"params": trainer.num_params, "global_batch": trainer.global_batch_size,
            "seq_len": trainer.run.model_shape.seq_len, "compile_s": compile_s,
            "step_s": step_s, "tokens_per_s": tokens_per_s, "mfu": mfu,
            "peak_memory_gib": stats.get("peak_bytes_in_use", 0) / 2**30 or None,
            "loss": float(metrics["loss"])}


def main() -> int:
    on_gpu = jax.default_backend() == "gpu"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--impls", default="praxis,xla,cudnn,pallas" if on_gpu
                        else "praxis,xla,pallas")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--percore_batch_size", type=float, default=None,
                        help="override every experiment's PERCORE_BATCH_SIZE")
    parser.add_argument("--tiny", action=argparse.BooleanOptionalAction, default=not on_gpu,
                        help="2 layers x 64 (default on CPU)")
    parser.add_argument("--json", default="runs/gpu_bench.json")
    args = parser.parse_args()

    device = jax.devices()[0]
    print(f"device: {device.device_kind} x {jax.device_count()}, jax {jax.__version__}, "
          f"{'tiny shapes' if args.tiny else 'full shapes'}, {args.steps} timed steps")
    header = (f"{'experiment':<14} {'attention':<8} {'params':>9} {'batch':>9} {'compile':>8} "
              f"{'step':>9} {'tokens/s':>11} {'MFU':>6} {'peak mem':>9}")
    print(header)
    rows = []
    for name in args.configs.split(","):
        for impl in args.impls.split(","):
            row = {"experiment": name, "attention": impl, "device": device.device_kind,
                   "devices": jax.device_count(), "jax": jax.__version__, "tiny": args.tiny}
            try:
                row.update(measure(build(name, impl, args.tiny, args.percore_batch_size),
                                   args.steps))
            except Exception as e:  # a failed config (UserError, OOM, ...) is a row, not the end
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                print(f"{name:<14} {impl:<8} error: {row['error']}")
            else:
                mfu = f"{row['mfu']:.1%}" if row["mfu"] else "-"
                mem = f"{row['peak_memory_gib']:.1f}G" if row["peak_memory_gib"] else "-"
                print(f"{name:<14} {impl:<8} {row['params'] / 1e6:>8.1f}M "
                      f"{row['global_batch']:>4}x{row['seq_len']:<4} {row['compile_s']:>7.1f}s "
                      f"{row['step_s'] * 1e3:>7.1f}ms {row['tokens_per_s']:>11,.0f} {mfu:>6} "
                      f"{mem:>9}")
            rows.append(row)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=2)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
