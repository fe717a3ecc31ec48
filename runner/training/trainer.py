"""The train loop: one jitted, state-donating step; summaries, evaluations, checkpoints.

Phases: mesh and batch layout -> model, optimizer and sharded state -> input
with prefetch -> loop. The loop never waits for the device except at summary,
evaluation and checkpoint steps, where it must read values anyway.
"""

import contextlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from runner.cluster import mesh as mesh_lib
from runner.core.errors import UserError
from runner.core.spec import RunSpec
from runner.state.train_state import (
    as_model_batch,
    check_divisible,
    make_init_fn,
    param_partition_specs,
    praxis_context,
    replicated_matrices,
    state_shardings,
)
from runner.training import compile_log, throughput
from runner.training.prefetch import Prefetcher
from runner.training.summaries import SummaryWriter, log
from tasks.progress import format_duration

BATCH_DTYPES = {
    "ids": jnp.int32,
    "labels": jnp.int32,
    "weights": jnp.float32,
    "paddings": jnp.float32,
    "segment_ids": jnp.int32,
    "segment_pos": jnp.int32,
}


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm became NaN/Inf (and SKIP_NONFINITE_STEPS is off)."""


class Trainer:
    """Owns the compiled step functions of one run on one mesh."""

    def __init__(self, run: RunSpec, mesh: Mesh, job_log_dir: str, peak_tflops: float = 0.0):
        self.run, self.mesh, self.job_log_dir = run, mesh, job_log_dir
        compile_log.register()
        self.model, self.tx = run.model, run.optimizer
        self.global_batch_size = mesh_lib.global_batch_size(run.loop.percore_batch_size, mesh)
        self.process_rows = mesh_lib.process_batch_rows(mesh, self.global_batch_size)
        seq_len = run.model_shape.seq_len
        self.batch_shapes = {
            k: jax.ShapeDtypeStruct((self.global_batch_size, seq_len), dtype)
            for k, dtype in BATCH_DTYPES.items()
        }
        self.data_sharding = mesh_lib.batch_sharding(mesh)
        replicated = mesh_lib.replicated(mesh)

        example = {k: np.zeros(s.shape, s.dtype) for k, s in self.batch_shapes.items()}
        with mesh:
            param_specs = param_partition_specs(self.model, example, mesh)
        init_fn = make_init_fn(self.model, self.tx, self.batch_shapes)
        abstract_state = jax.eval_shape(init_fn, jax.random.key(0))
        check_divisible(param_specs, abstract_state["params"], mesh)
        if mesh.shape["data"] * mesh.shape["mdl"] > 1:
            unsharded = replicated_matrices(param_specs, abstract_state["params"])
            if unsharded:
                log(f"warning: {len(unsharded)} weight matrices have no sharding annotation "
                    f"and are copied whole to every device, e.g. {unsharded[0]}")
        self.state_shardings = state_shardings(
            self.tx, param_specs, abstract_state["params"], mesh
        )
        self.abstract_state = jax.tree_util.tree_map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            abstract_state,
            self.state_shardings,
        )
        self._init = jax.jit(init_fn, out_shardings=self.state_shardings)
        batch_shardings = {k: self.data_sharding for k in BATCH_DTYPES}
        self.train_step = jax.jit(
            self._train_step,
            in_shardings=(self.state_shardings, batch_shardings),
            out_shardings=(self.state_shardings, replicated),
            donate_argnums=0,
        )
        self._eval_steps = {}  # evaluation name -> its jitted step (see eval_step)

        self.num_params = sum(a.size for a in jax.tree_util.tree_leaves(abstract_state["params"]))
        shape = run.model_shape
        self.flops_per_token = throughput.flops_per_token(
            num_params=throughput.matmul_param_count(abstract_state["params"]),
            num_layers=shape.num_layers,
            num_heads=shape.num_heads,
            dims_per_head=shape.dims_per_head,
            seq_len=shape.seq_len,
        )
        self.peak_flops = throughput.peak_flops_per_device(jax.devices()[0], peak_tflops)
        # XLA:CPU can deadlock when several executions of a program with collectives
        # are queued on the same simulated devices (rendezvous threads starve each
        # other; seen with 8 devices on 2 cores). CPU runs are for tests and
        # laptops, so there the loop waits for each step; on GPUs it never does.
        self.sync_every_step = jax.devices()[0].platform == "cpu"
        self.checkpointer = None  # set by the caller (runner.state.checkpoints) when saving
        self.preemption = None  # set by the caller (runner.training.preemption) to stop on a signal
        self.profiler = None  # set by the caller (runner.training.profiling) to trace chosen steps
        self.wandb = None  # set by the caller (runner.training.summaries.WandbRun) to log to W&B
        self.ledger = None  # set by the caller (runner.training.goodput.Ledger) to account wall time
        self._writers: dict[str, SummaryWriter] = {}

    # ----- compiled functions -------------------------------------------------

    def _loss(self, params, batch, key):
        with praxis_context(do_eval=False):
            metrics, _ = self.model.apply(
                {"params": params},
                as_model_batch(batch, self.model.fprop_dtype),
                rngs={"random": key, "dropout": key},
            )
        return metrics.total_loss[0]

    def _train_step(self, state, batch):
        step = state["step"]
        key = jax.random.fold_in(jax.random.key(self.run.loop.random_seed), step)
        loss, grads = jax.value_and_grad(self._loss)(state["params"], batch, key)
        grad_norm = optax.global_norm(grads)
        updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
        new_state = {
            "step": step + 1,
            "params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state,
        }
        # The new parameters too: a finite gradient can still make a non-finite update
        # (a learning rate that overflows float32, Adam with epsilon 0 on a zero gradient).
        params_finite = jnp.all(jnp.stack([
            jnp.all(jnp.isfinite(p)) for p in jax.tree_util.tree_leaves(new_state["params"])]))
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & params_finite
        if self.run.loop.skip_nonfinite_steps:
            # Keep the old parameters and moments; only the step counter moves on.
            kept = jax.tree_util.tree_map(
                lambda new, old: jnp.where(finite, new, old), new_state, state
            )
            new_state = {**kept, "step": step + 1}
        metrics = {
            "loss": loss,
            "grad_norm": grad_norm,
            "learning_rate": self.run.learning_rate(step),
            "nonfinite": ~finite,
        }
        return new_state, metrics

    def eval_step(self, evaluation):
        """The jitted step of one evaluation set: (params, batch) -> its batch_outputs."""
        if evaluation.name not in self._eval_steps:

            def evaluate_batch(params, batch):
                with praxis_context(do_eval=True):
                    predictions = self.model.apply(
                        {"params": params},
                        as_model_batch(batch, self.model.fprop_dtype),
                        method=self.model.compute_predictions,
                    )
                return evaluation.batch_outputs(predictions, batch)

            self._eval_steps[evaluation.name] = jax.jit(
                evaluate_batch,
                in_shardings=(self.state_shardings["params"],
                              {k: self.data_sharding for k in BATCH_DTYPES}),
                out_shardings=mesh_lib.replicated(self.mesh),
            )
        return self._eval_steps[evaluation.name]

    # ----- host side ------------------------------------------------------------

    def init_state(self):
        with self.mesh:
            return jax.block_until_ready(self._init(jax.random.key(self.run.loop.random_seed)))

    def to_device(self, host_batch: dict) -> dict:
        """This process's rows of the global batch -> global arrays sharded over the mesh.

        Each device gets its block by a plain device_put: no XLA program runs, so
        this is safe on the prefetch thread while a train step is in flight (a
        resharding program there can deadlock collectives on the CPU backend).
        """
        first_row = self.process_rows[0]
        blocks, devices = {}, {}
        for k, dtype in BATCH_DTYPES.items():
            local = np.asarray(host_batch[k], dtype)  # [rows of this process, T]
            shape = self.batch_shapes[k].shape
            index_map = self.data_sharding.addressable_devices_indices_map(shape)
            blocks[k], devices[k] = [], []
            for device, (rows, cols) in index_map.items():
                start, stop, _ = rows.indices(shape[0])  # global row range of this device
                blocks[k].append(local[start - first_row:stop - first_row, cols])
                devices[k].append(device)
        on_device = jax.device_put(blocks, devices)  # one batched transfer for all keys
        return {
            k: jax.make_array_from_single_device_arrays(
                self.batch_shapes[k].shape, self.data_sharding, on_device[k])
            for k in BATCH_DTYPES
        }

    def writer(self, name: str) -> SummaryWriter:
        if name not in self._writers:
            self._writers[name] = SummaryWriter(f"{self.job_log_dir}/tb/{name}", self.wandb)
        return self._writers[name]

    def make_train_input(self):
        return self.run.make_train_input(
            global_batch_size=self.global_batch_size, process_rows=self.process_rows
        )

    def train(self, state=None, input_state: dict | None = None):
        """Train from `state` (default: freshly initialised) to MAX_STEPS; returns the final state."""
        loop = self.run.loop
        state = self.init_state() if state is None else state
        step = int(state["step"])
        data = self.make_train_input()
        if input_state is not None:
            data.set_state(input_state)
        prefetcher = Prefetcher(data, self.to_device)
        if step > 0:  # resumed: what earlier runs logged after `step` is done again
            for name in ("train", "eval") if self.run.evals else ("train",):
                self.writer(name).restart(step + 1)
        log(
            f"training {self.run.name}: {self.num_params:,} parameters, mesh "
            f"{dict(self.mesh.shape)}, global batch {self.global_batch_size} x "
            f"{self.run.model_shape.seq_len} tokens, steps {step} -> {loop.max_steps}"
        )
        pending: list[dict] = []  # device-side metrics since the last summary
        interval_start, interval_step = time.perf_counter(), step
        last_input_state = input_state
        first_step = True
        if self.ledger is not None:
            self.ledger.begin_loop()
        try:
            while step < loop.max_steps:
                with self._phase("input_wait"):
                    batch, last_input_state = next(prefetcher)
                if self.profiler is not None:
                    self.profiler.before_step(step)
                with self.mesh:
                    state, metrics = self.train_step(state, batch)
                if self.sync_every_step:
                    jax.block_until_ready(metrics)
                step += 1
                if self.profiler is not None:
                    self.profiler.after_step(step, metrics)
                if self.ledger is not None:
                    self.ledger.step(step)
                if self.checkpointer is not None:
                    with self._phase("checkpoint"):
                        self.checkpointer.check()
                pending.append(metrics)
                if self.preemption is not None and self.preemption.reached(step):
                    log(f"step {step}: {self.preemption.received} received; saving a "
                        f"checkpoint and stopping (run the same command again to resume)")
                    break
                if first_step:
                    # Time the first step (compilation) apart from the steady state.
                    first_step = False
                    jax.block_until_ready(metrics)
                    log(f"step {step}: compiled and ran in {time.perf_counter() - interval_start:.1f}s")
                    interval_start, interval_step = time.perf_counter(), step
                if step % loop.summary_interval_steps == 0 or step == loop.max_steps:
                    elapsed = time.perf_counter() - interval_start
                    self._summarize(step, pending, elapsed, step - interval_step)
                    pending = []
                    interval_start, interval_step = time.perf_counter(), step
                if loop.eval_interval_steps and step % loop.eval_interval_steps == 0:
                    with self._phase("evaluation"):
                        self.evaluate(state["params"], step)
                    interval_start = time.perf_counter()
                if self.checkpointer is not None and self.checkpointer.should_save(step):
                    self._check_finite(pending, step)
                    with self._phase("checkpoint"):
                        self.checkpointer.save(step, state, last_input_state)
        finally:
            prefetcher.close()
            if self.profiler is not None:
                self.profiler.finish()
        if self.checkpointer is not None:
            self._check_finite(pending, step)
            with self._phase("checkpoint"):
                self.checkpointer.save(step, state, last_input_state, final=True)
        for writer in self._writers.values():
            writer.flush()
        return state

    def _phase(self, name: str):
        """Account the time inside to `name` in the goodput ledger, if there is one."""
        return self.ledger.phase(name) if self.ledger is not None else contextlib.nullcontext()

    def _check_finite(self, pending: list[dict], step: int) -> None:
        if not pending or self.run.loop.skip_nonfinite_steps:
            return
        flags = np.asarray(jax.device_get([m["nonfinite"] for m in pending]))
        if flags.any():
            bad = step - len(pending) + 1 + int(np.argmax(flags))
            raise NonFiniteLossError(
                f"loss, gradient norm or parameters became NaN/Inf at step {bad}; stopping "
                f"without saving "
                f"(the last good checkpoint is kept). Lower LEARNING_RATE, or set "
                f"SKIP_NONFINITE_STEPS=True to skip such steps"
            )

    def _summarize(self, step: int, pending: list[dict], elapsed: float, steps: int) -> None:
        self._check_finite(pending, step)
        host = jax.device_get(pending)
        loss = float(np.mean([m["loss"] for m in host]))
        grad_norm = float(np.mean([m["grad_norm"] for m in host]))
        learning_rate = float(host[-1]["learning_rate"])
        skipped = int(sum(bool(m["nonfinite"]) for m in host))
        scalars = {"loss": loss, "learning_rate": learning_rate, "grad_norm": grad_norm}
        line = f"step {step:>6} | loss {loss:.4f} | lr {learning_rate:.3e} | grad_norm {grad_norm:.3f}"
        if steps > 0 and elapsed > 0:  # no rate right after the (timed-apart) first step
            steps_per_sec = steps / elapsed
            tokens_per_sec = steps_per_sec * self.global_batch_size * self.run.model_shape.seq_len
            scalars.update(steps_per_sec=steps_per_sec, tokens_per_sec=tokens_per_sec)
            line += f" | {steps_per_sec:.2f} steps/s | {tokens_per_sec:,.0f} tokens/s"
            if self.peak_flops:
                mfu = tokens_per_sec * self.flops_per_token / (
                    self.mesh.devices.size * self.peak_flops)
                scalars["mfu"] = mfu
                line += f" | MFU {mfu:.1%}"
            eta = (self.run.loop.max_steps - step) / steps_per_sec
            line += f" | ETA {format_duration(eta)}"
        if skipped:
            scalars["skipped_nonfinite_steps"] = skipped
            line += f" | skipped {skipped} non-finite step(s)"
        log(line)
        if self.ledger is not None:
            scalars.update(self.ledger.scalars())
        self.writer("train").scalars(step, scalars)

    def evaluate(self, params, step: int, predictions_dir: str | None = None):
        """Run every evaluation set once; log and write the results; return them.

        With `predictions_dir`, each set writes its per-example outputs there, if it has
        any (process 0; Lambada: lambada_predictions.jsonl).
        """
        # Never let two different programs overlap on the devices: on the CPU
        # backend they share one thread pool, and a program parked in a collective
        # can starve the other's participants (deadlock). So wait for the train step
        # that made `params`, and for every shard of each eval output.
        jax.block_until_ready(params)
        results = {}
        for ev in self.run.evals:
            start = time.perf_counter()
            data = ev.make_input(global_batch_size=self.global_batch_size,
                                 process_rows=self.process_rows)
            step_fn = self.eval_step(ev)
            outputs = []
            for host_batch in data:
                with self.mesh:
                    out = jax.block_until_ready(step_fn(params, self.to_device(host_batch)))
                outputs.append(jax.device_get(out))
            if not outputs:
                raise UserError(f"evaluation set {ev.name} produced no batches")
            per_example = {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}
            metrics = ev.metrics(per_example)
            results[ev.name] = metrics
            shown = " | ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                               for k, v in metrics.items())
            log(f"step {step:>6} | eval {ev.name} | {shown} | {time.perf_counter() - start:.1f}s")
            self.writer("eval").scalars(step, {f"{ev.name}/{k}": v for k, v in metrics.items()})
            if predictions_dir and jax.process_index() == 0:
                path = ev.write_outputs(predictions_dir, data, per_example)
                if path:
                    log(f"wrote per-example predictions to {path}")
        return results
