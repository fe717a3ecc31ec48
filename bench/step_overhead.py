"""Steps/s of the runner's train loop against a bare jitted praxis train step.

The bare loop feeds one fixed, already-sharded batch to a jitted
loss -> grad -> AdamW step and does nothing else. The runner's loop also
produces every batch (input pipeline + prefetch thread + host-to-device
copies), keeps metrics on the device and prints a summary every 100 steps.
The ratio paxloom/runner/bare is the price of that machinery (aim: >= 0.95). On CPU
both loops wait for every step (an XLA:CPU deadlock workaround, see
Trainer.__init__), so there the host work cannot hide behind device work.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/step_overhead.py
"""

import argparse
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import optax  # noqa: E402
from praxis import pax_fiddle  # noqa: E402

import experiments  # noqa: E402
from paxloom.runner.cluster import mesh as mesh_lib  # noqa: E402
from paxloom.runner.state.train_state import as_model_batch, praxis_context  # noqa: E402
from paxloom.runner.training.trainer import Trainer  # noqa: E402


def build(args):
    exp = experiments.BaseExperiment(
        NUM_LAYERS=args.layers, MODEL_DIMS=args.dims, HIDDEN_DIMS=4 * args.dims, NUM_HEADS=8,
        DIMS_PER_HEAD=args.dims // 8, MAX_SEQ_LEN=args.seq_len, VOCAB_SIZE=512,
        ICI_MESH_SHAPE=args.mesh, PERCORE_BATCH_SIZE=args.percore_batch, DATASET="synthetic",
        EVAL_BATCHES=0, SUMMARY_INTERVAL_STEPS=100, MAX_STEPS=args.warmup)
    run = pax_fiddle.build(exp.run_config())
    mesh = mesh_lib.create_mesh(run.mesh.ici_mesh_shape, run.mesh.dcn_mesh_shape)
    return Trainer(run, mesh, args.log_dir)


def bare_steps_per_sec(trainer, steps, warmup):
    """A plain jitted praxis step: no input pipeline, no metrics, one fixed batch."""
    model, tx = trainer.model, trainer.tx

    def step(state, batch):
        def loss(params):
            with praxis_context(do_eval=False):
                metrics, _ = model.apply({"params": params},
                                         as_model_batch(batch, model.fprop_dtype),
                                         rngs={"random": jax.random.key(0)})
            return metrics.total_loss[0]

        grads = jax.grad(loss)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        return {"step": state["step"] + 1, "params": optax.apply_updates(state["params"], updates),
                "opt_state": opt_state}

    batch_shardings = {k: trainer.data_sharding for k in trainer.batch_shapes}
    jitted = jax.jit(step, in_shardings=(trainer.state_shardings, batch_shardings),
                     out_shardings=trainer.state_shardings, donate_argnums=0)
    batch = trainer.to_device(trainer.make_train_input().next_batch())
    state = trainer.init_state()
    with jax.set_mesh(trainer.mesh):
        for _ in range(warmup):
            state = jax.block_until_ready(jitted(state, batch))
        start = time.perf_counter()
        for _ in range(steps):
            state = jitted(state, batch)
            if trainer.sync_every_step:  # as the runner does on CPU (see Trainer.__init__)
                jax.block_until_ready(state)
        jax.block_until_ready(state)
    return steps / (time.perf_counter() - start)


def runner_steps_per_sec(trainer, steps):
    """Trainer.train over `steps` steps, after a first call has compiled everything."""
    state = trainer.train()  # warmup steps, compiles
    loop = trainer.run.loop
    trainer.run = dataclasses.replace(
        trainer.run, loop=dataclasses.replace(loop, max_steps=loop.max_steps + steps))
    start = time.perf_counter()
    state = trainer.train(state)
    jax.block_until_ready(state)
    return steps / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dims", type=int, default=64)
    parser.add_argument("--seq_len", type=int, default=64)
    parser.add_argument("--percore_batch", type=float, default=1)
    parser.add_argument("--mesh", type=lambda s: [int(x) for x in s.split(",")], default=[2, 2, 2])
    parser.add_argument("--log_dir", default="/tmp/paxloom_bench_step_overhead")
    args = parser.parse_args()

    trainer = build(args)
    bare = bare_steps_per_sec(trainer, args.steps, args.warmup)
    ours = runner_steps_per_sec(trainer, args.steps)
    print(f"device: {jax.devices()[0].device_kind} x {jax.device_count()}, mesh {args.mesh}, "
          f"model {args.layers}x{args.dims}, batch {trainer.global_batch_size}x{args.seq_len}")
    print(f"bare jitted step: {bare:8.2f} steps/s")
    print(f"runner loop:      {ours:8.2f} steps/s")
    print(f"runner / bare:    {ours / bare:8.3f}")


if __name__ == "__main__":
    main()
