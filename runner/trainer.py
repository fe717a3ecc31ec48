"""The train loop: one jitted, state-donating step; summaries, evaluations, checkpoints.

Phases: mesh and batch layout -> model, optimizer and sharded state -> input
with prefetch -> loop. The loop never waits for the device except at summary,
evaluation and checkpoint steps, where it must read values anyway.
"""

import math
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from runner import mesh as mesh_lib
from runner import throughput
from runner.prefetch import Prefetcher
from runner.spec import RunSpec
from runner.summaries import SummaryWriter, format_duration, log
from runner.train_state import (
    _context,
    as_model_batch,
    make_init_fn,
    param_partition_specs,
    state_shardings,
)

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
        self.eval_step = jax.jit(
            self._eval_step,
            in_shardings=(self.state_shardings["params"], batch_shardings),
            out_shardings=replicated,
        )

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
        self.checkpointer = None  # set by the caller (runner.checkpoints) when saving
        self._writers: dict[str, SummaryWriter] = {}

    # ----- compiled functions -------------------------------------------------

    def _loss(self, params, batch, key):
        with _context(do_eval=False):
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
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
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

    def _eval_step(self, params, batch):
        """Per-example sums: [B] target log-probability, target tokens, correct target tokens."""
        with _context(do_eval=True):
            predictions = self.model.apply(
                {"params": params},
                as_model_batch(batch, self.model.fprop_dtype),
                method=self.model.compute_predictions,
            )
        weights = batch["weights"]  # [B, T]
        logprob = -predictions.per_example_xent.astype(jnp.float32)  # [B, T]
        correct = (predictions.per_example_argmax == batch["labels"]).astype(jnp.float32)
        return {
            "logprob": jnp.sum(logprob * weights, axis=1),
            "num_targets": jnp.sum(weights, axis=1),
            "num_correct": jnp.sum(correct * weights, axis=1),
        }

    # ----- host side ------------------------------------------------------------

    def init_state(self):
        with self.mesh:
            return self._init(jax.random.key(self.run.loop.random_seed))

    def to_device(self, host_batch: dict) -> dict:
        """This process's rows of the global batch -> global arrays sharded over the mesh."""
        return {
            k: jax.make_array_from_process_local_data(
                self.data_sharding, np.asarray(host_batch[k], BATCH_DTYPES[k]),
                self.batch_shapes[k].shape,
            )
            for k in BATCH_DTYPES
        }

    def writer(self, name: str) -> SummaryWriter:
        if name not in self._writers:
            self._writers[name] = SummaryWriter(f"{self.job_log_dir}/tb/{name}")
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
        log(
            f"training {self.run.name}: {self.num_params:,} parameters, mesh "
            f"{dict(self.mesh.shape)}, global batch {self.global_batch_size} x "
            f"{self.run.model_shape.seq_len} tokens, steps {step} -> {loop.max_steps}"
        )
        pending: list[dict] = []  # device-side metrics since the last summary
        interval_start, interval_step = time.perf_counter(), step
        last_input_state = input_state
        first_step = True
        try:
            while step < loop.max_steps:
                batch, last_input_state = next(prefetcher)
                with self.mesh:
                    state, metrics = self.train_step(state, batch)
                step += 1
                pending.append(metrics)
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
                    self.evaluate(state["params"], step)
                    interval_start = time.perf_counter()
                if self.checkpointer is not None and self.checkpointer.should_save(step):
                    self._check_finite(pending, step)
                    self.checkpointer.save(step, state, last_input_state)
        finally:
            prefetcher.close()
        if self.checkpointer is not None:
            self._check_finite(pending, step)
            self.checkpointer.save(step, state, last_input_state, final=True)
        for writer in self._writers.values():
            writer.flush()
        return state

    def _check_finite(self, pending: list[dict], step: int) -> None:
        if not pending or self.run.loop.skip_nonfinite_steps:
            return
        flags = np.asarray(jax.device_get([m["nonfinite"] for m in pending]))
        if flags.any():
            bad = step - len(pending) + 1 + int(np.argmax(flags))
            raise NonFiniteLossError(
                f"loss or gradient norm is NaN/Inf at step {bad}; stopping without saving "
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
        self.writer("train").scalars(step, scalars)

    def evaluate(self, params, step: int) -> dict[str, dict[str, float]]:
        """Run every evaluation set once; log and write the results; return them."""
        results = {}
        for ev in self.run.evals:
            start = time.perf_counter()
            sums = {"logprob": [], "num_targets": [], "num_correct": []}
            data = ev.make_input(global_batch_size=self.global_batch_size,
                                 process_rows=self.process_rows)
            for host_batch in data:
                with self.mesh:
                    out = jax.device_get(self.eval_step(params, self.to_device(host_batch)))
                for k in sums:
                    sums[k].append(out[k])
            arrays = {k: np.concatenate(v) if v else np.zeros(0) for k, v in sums.items()}
            metrics = summarize_eval(ev.kind, arrays)
            results[ev.name] = metrics
            shown = " | ".join(f"{k} {v:.4f}" for k, v in metrics.items())
            log(f"step {step:>6} | eval {ev.name} | {shown} | {time.perf_counter() - start:.1f}s")
            self.writer("eval").scalars(step, {f"{ev.name}/{k}": v for k, v in metrics.items()})
        return results


def summarize_eval(kind: str, sums: dict[str, np.ndarray]) -> dict[str, float]:
    """Per-example sums -> metrics. Rows without target tokens are padding and are ignored."""
    real = sums["num_targets"] > 0
    logprob, targets, correct = (sums[k][real] for k in ("logprob", "num_targets", "num_correct"))
    total_tokens = float(targets.sum())
    if total_tokens == 0:
        return {}
    loss = -float(logprob.sum()) / total_tokens
    if kind == "lm":
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)),
                "accuracy": float(correct.sum()) / total_tokens}
    return {
        "accuracy": float(np.mean(correct == targets)),
        "target_log_likelihood": float(np.mean(logprob)),
        "perplexity": math.exp(min(loss, 50.0)),
        "examples": float(real.sum()),
    }
