"""The train loop: one jitted, state-donating step, evaluations, and the callbacks.

Phases: mesh and batch layout -> model, optimizer and sharded state -> input
with prefetch -> loop. What happens around the steps (summaries, checkpoints,
preemption, profiling, goodput, a user's own) are callbacks (paxloom/core/callbacks.py)
that the loop calls at fixed points. The loop itself never waits for the device; the
callbacks that read values (summaries, checkpoints) do, at their own steps.
"""

import contextlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh
from praxis import base_layer

from paxloom.core import sequence_order, spec, step_metrics
from paxloom.core.callbacks import RunInfo, StepInfo
from paxloom.core.data import BATCH_DTYPES
from paxloom.core.errors import UserError
from paxloom.core.log import log
from paxloom.core.mesh_axes import CONTEXT_AXIS
from paxloom.core.spec import RunSpec
from paxloom.runner.cluster import mesh as mesh_lib
from paxloom.runner.state import optimizer
from paxloom.runner.state.train_state import (
    as_model_batch,
    check_divisible,
    make_init_fn,
    param_partition_specs,
    praxis_context,
    replicated_matrices,
    state_shardings,
)
from paxloom.runner.training import accumulation, compile_log, memory_check, throughput
from paxloom.runner.training.builtin_callbacks import CallbackList, check_finite
from paxloom.runner.training.prefetch import Prefetcher
from tasks.packing import check_segment_bound


class Trainer:
    """Owns the compiled step functions of one run on one mesh."""

    def __init__(self, run: RunSpec, mesh: Mesh, job_log_dir: str, peak_tflops: float = 0.0,
                 device_memory_gb: float = 0.0):
        self.run, self.mesh, self.job_log_dir = run, mesh, job_log_dir
        # The memory a device can give, for the check before the first step; 0: ask it.
        self.device_memory_gb = device_memory_gb
        compile_log.register()
        self.model, self.tx = run.model, run.optimizer
        self.batch_layout = spec.batch_layout(run)
        self.global_batch_size = self.batch_layout.global_batch
        # Sub-batches per optimizer update (GRADIENT_ACCUMULATION_STEPS); 1: one pass.
        self.accumulation_steps = self.batch_layout.accumulation_steps
        self.process_rows = mesh_lib.process_batch_rows(mesh, self.global_batch_size)
        seq_len = run.model_shape.seq_len
        self.batch_shapes = {
            k: jax.ShapeDtypeStruct((self.global_batch_size, seq_len), dtype)
            for k, dtype in BATCH_DTYPES.items()
        }
        self.data_sharding = mesh_lib.batch_sharding(mesh)
        # With a context axis, the order the model sees each row's tokens in.
        self.token_order = (sequence_order.load_balanced_order(seq_len, mesh.shape[CONTEXT_AXIS])
                            if mesh.shape[CONTEXT_AXIS] > 1 else None)
        replicated = mesh_lib.replicated(mesh)

        example = {k: np.zeros(s.shape, s.dtype) for k, s in self.batch_shapes.items()}
        # praxis's annotations need the mesh's axis names only; an abstract mesh keeps the
        # eager work of abstract init on the default device, so a plan can build a Trainer
        # over devices it cannot run on (paxloom/runner/planning/gpu_target.py).
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
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
            num_params=throughput.matmul_param_count(abstract_state["params"],
                                                     run.model_shape.expert_share),
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

    # ----- compiled functions -------------------------------------------------

    def _loss(self, params, batch, key):
        total_loss, layer_metrics = self._weighted_loss(params, batch, key)
        return total_loss[0], layer_metrics

    def _weighted_loss(self, params, batch, key):
        """(praxis's total_loss: (mean over the batch's weighted target tokens, their
        weight), the step metrics the layers reported (paxloom/core/step_metrics.py)).

        The loss includes the layers' aux losses (a mixture of experts' router losses),
        which praxis's TransformerLm adds when their collection is mutable."""
        # Parameters the optimizer freezes (USE_LORA: all but the adapters) get no gradient.
        params = optimizer.stop_frozen_gradients(self.tx, params)
        # Summaries carry the step metrics. praxis's pipeline fails to unpack them for some
        # schedules (GPT175BPipelined's): a pipelined run reports none (its mixture-of-experts
        # layers' router losses still enter the loss, as aux losses).
        mutable = [base_layer.AUX_LOSS] + ([base_layer.SUMMARIES] if self.run.pipeline is None
                                           else [])
        with praxis_context(do_eval=False):
            (metrics, _), collections = self.model.apply(
                {"params": params},
                as_model_batch(self._laid_out(batch), self.model.fprop_dtype),
                rngs={"random": key, "dropout": key},
                mutable=mutable,
            )
        return metrics.total_loss, step_metrics.collect(collections.get(base_layer.SUMMARIES, {}))

    def _laid_out(self, batch: dict) -> dict:
        """The [B, T] batch with each row's tokens in context parallelism's load-balanced
        order (paxloom/core/sequence_order.py); as it is without a context axis. Positions and
        documents travel with the tokens, so the loss is the same."""
        if self.token_order is None:
            return batch
        return {k: jnp.take(v, jnp.asarray(self.token_order), axis=1) for k, v in batch.items()}

    def _in_natural_order(self, predictions):
        """The per-token [B, T, ...] predictions of a laid-out batch back in row order."""
        if self.token_order is None:
            return predictions
        inverse, seq_len = jnp.asarray(np.argsort(self.token_order)), len(self.token_order)
        return jax.tree_util.tree_map(
            lambda x: jnp.take(x, inverse, axis=1) if x.ndim >= 2 and x.shape[1] == seq_len
            else x, predictions)

    def _train_step(self, state, batch):
        step = state["step"]
        key = jax.random.fold_in(jax.random.key(self.run.loop.random_seed), step)
        if self.accumulation_steps > 1:  # the same update, one sub-batch at a time
            loss, grads, _, layer_metrics = accumulation.loss_and_grads(
                self._weighted_loss, state["params"], batch, key, self.accumulation_steps,
                self.mesh, self.state_shardings["params"],
                overwritten=optimizer.overwritten_mask(self.tx, state["params"]))
        else:
            (loss, layer_metrics), grads = jax.value_and_grad(self._loss, has_aux=True)(
                state["params"], batch, key)
        grad_norm = optax.tree.norm(optimizer.optimized_gradients(self.tx, grads))
        updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        new_state = {
            "step": step + 1,
            # USE_FP8's scaling state: the backward pass computed its next value.
            "params": optimizer.apply_overwrites(self.tx, params, grads),
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
            **layer_metrics,
        }
        return new_state, metrics

    def eval_step(self, evaluation):
        """The jitted step of one evaluation set: (params, batch) -> its batch_outputs."""
        if evaluation.name not in self._eval_steps:

            def evaluate_batch(params, batch):
                with praxis_context(do_eval=True):
                    predictions = self.model.apply(
                        {"params": params},
                        as_model_batch(self._laid_out(batch), self.model.fprop_dtype),
                        method=self.model.compute_predictions,
                    )
                return evaluation.batch_outputs(self._in_natural_order(predictions), batch)

            self._eval_steps[evaluation.name] = jax.jit(
                evaluate_batch,
                in_shardings=(self.state_shardings["params"],
                              {k: self.data_sharding for k in BATCH_DTYPES}),
                out_shardings=mesh_lib.replicated(self.mesh),
            )
        return self._eval_steps[evaluation.name]

    # ----- host side ------------------------------------------------------------

    def init_state(self):
        with jax.set_mesh(self.mesh):
            return jax.block_until_ready(self._init(jax.random.key(self.run.loop.random_seed)))

    def to_device(self, host_batch: dict, source: str = "the training input") -> dict:
        """This process's rows of the global batch -> global arrays sharded over the mesh.
        UserError, naming `source`, for rows over MAX_SEGMENTS_PER_SEQ segments (data that
        arrive packed; tasks/packing.py check_segment_bound).

        Each device gets its block by a plain device_put: no XLA program runs, so
        this is safe on the prefetch thread while a train step is in flight (a
        resharding program there can deadlock collectives on the CPU backend).
        """
        check_segment_bound(host_batch, self.run.model_shape.max_segments, source)
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

    def make_train_input(self):
        return self.run.make_train_input(
            global_batch_size=self.global_batch_size, process_rows=self.process_rows
        )

    def experts_placed(self) -> str:
        """The start line's note of where a mixture's experts are: ", 8 experts over mesh
        axis 'data' (1 per device)"; empty for a dense model."""
        experts, axis = self.run.model_shape.num_experts, self.run.model_shape.expert_axis
        if not experts:
            return ""
        if axis is None:
            return f", {experts} experts placed by praxis's GShard layers"
        if axis == "none":
            return f", {experts} experts on every device (EXPERT_AXIS='none')"
        ways = self.mesh.shape[axis]
        return f", {experts} experts over mesh axis '{axis}' ({experts // ways} per device)"

    def train(self, state=None, input_state: dict | None = None, callbacks=()):
        """Train from `state` (default: freshly initialised) to MAX_STEPS, calling
        `callbacks` at each point of the loop (paxloom/core/callbacks.py); returns the final
        state. Nothing here waits for the device: callbacks that read values do."""
        loop = self.run.loop
        callbacks = CallbackList(callbacks)
        state = self.init_state() if state is None else state
        step = int(state["step"])
        data = self.make_train_input()
        if input_state is not None:
            data.set_state(input_state)
        prefetcher = Prefetcher(data, self.to_device)
        k = self.accumulation_steps
        sub_batches = f" ({k} sub-batches of {self.global_batch_size // k})" if k > 1 else ""
        log(
            f"training {self.run.name}: {self.num_params:,} parameters, mesh "
            f"{dict(self.mesh.shape)}, global batch {self.global_batch_size} x "
            f"{self.run.model_shape.seq_len} tokens{sub_batches}{self.experts_placed()}, "
            f"steps {step} -> {loop.max_steps}"
        )
        if self.run.pipeline is not None:
            pipe = self.run.pipeline
            log(f"pipeline: {pipe.num_stages} stages, "
                + (f"circular x {pipe.circular_repeat}" if pipe.circular_repeat > 1 else "GPipe")
                + f", {pipe.num_microbatches} microbatches per pass; bubble "
                f"{pipe.bubble_fraction():.1%} of each stage's time idle")
        callbacks.on_start(RunInfo(
            name=self.run.name, start_step=step, loop=loop,
            global_batch_size=self.global_batch_size, seq_len=self.run.model_shape.seq_len,
            num_params=self.num_params, flops_per_token=self.flops_per_token,
            peak_flops=self.peak_flops * self.mesh.devices.size, job_log_dir=self.job_log_dir,
            publish=callbacks.publish))
        info = StepInfo(step=step, state=state, metrics={}, input_state=input_state)
        unchecked = []  # non-finite flags of the steps since the last save
        try:
            while step < loop.max_steps:
                with self._phase("input_wait", callbacks):
                    batch, input_state = next(prefetcher)
                callbacks.before_step(step)
                with jax.set_mesh(self.mesh):
                    state, metrics = self.train_step(state, batch)
                if self.sync_every_step:
                    jax.block_until_ready(metrics)
                step += 1
                info = StepInfo(step=step, state=state, metrics=metrics, input_state=input_state)
                unchecked.append(metrics["nonfinite"])
                request = callbacks.after_step(info)
                if request.stop:
                    log(f"step {step}: {request.reason}")
                    break
                if loop.eval_interval_steps and step % loop.eval_interval_steps == 0:
                    with self._phase("evaluation", callbacks):
                        self.evaluate(state["params"], step, callbacks=callbacks)
                if request.save:
                    unchecked = self._save(info, unchecked, callbacks, final=False)
        finally:
            prefetcher.close()
        self._save(info, unchecked, callbacks, final=True)
        callbacks.on_end(info)
        return state

    def check_step_fits(self, state) -> None:
        """Compile the train step for `state` and a batch of this run's shapes (its first
        call reuses the executable) and stop, in one line, if it cannot fit the devices
        (paxloom/runner/training/memory_check.py)."""
        batch = {k: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=self.data_sharding)
                 for k, s in self.batch_shapes.items()}
        with jax.set_mesh(self.mesh):
            compiled = self.train_step.lower(state, batch).compile()
        memory_check.check_fits(compiled, self.mesh.local_devices, self.device_memory_gb)

    def _save(self, info: StepInfo, unchecked: list, callbacks: CallbackList,
              final: bool) -> list:
        """Have the callbacks save `info` (a checkpoint), after checking that no step since
        the last save went non-finite; returns the (now empty) list of unchecked flags."""
        if not self.run.loop.skip_nonfinite_steps:
            check_finite(unchecked, info.step)
        with self._phase("checkpoint", callbacks):
            callbacks.on_save(info, final)
        return []

    @contextlib.contextmanager
    def _phase(self, name: str, callbacks: CallbackList):
        """Tell the callbacks how long the loop spent in `name` (compilation excluded: the
        goodput ledger counts that apart)."""
        start, compiled = time.perf_counter(), compile_log.total_seconds()
        try:
            yield
        finally:
            callbacks.on_phase(name, (time.perf_counter() - start) - (
                compile_log.total_seconds() - compiled))

    def evaluate(self, params, step: int, predictions_dir: str | None = None,
                 callbacks: CallbackList | None = None):
        """Run every evaluation set once; log and write the results; return them.

        With `predictions_dir`, each set writes its per-example outputs there, if it has
        any (process 0; Lambada: lambada_predictions.jsonl).
        """
        # Never let two different programs overlap on the devices: on the CPU
        # backend they share one thread pool, and a program parked in a collective
        # can starve the other's participants (deadlock). So wait for the train step
        # that made `params`, and for every shard of each eval output.
        jax.block_until_ready(params)
        callbacks = callbacks or CallbackList([])
        results = {}
        for ev in self.run.evals:
            start = time.perf_counter()
            data = ev.make_input(global_batch_size=self.global_batch_size,
                                 process_rows=self.process_rows)
            step_fn = self.eval_step(ev)
            outputs = []
            for host_batch in data:
                with jax.set_mesh(self.mesh):
                    out = jax.block_until_ready(step_fn(
                        params, self.to_device(host_batch, f"evaluation set {ev.name}")))
                outputs.append(jax.device_get(out))
            if not outputs:
                raise UserError(f"evaluation set {ev.name} produced no batches")
            per_example = {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}
            metrics = ev.metrics(per_example)
            results[ev.name] = metrics
            shown = " | ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                               for k, v in metrics.items())
            log(f"step {step:>6} | eval {ev.name} | {shown} | {time.perf_counter() - start:.1f}s")
            callbacks.publish("eval", step, {f"{ev.name}/{k}": v for k, v in metrics.items()})
            if predictions_dir and jax.process_index() == 0:
                path = ev.write_outputs(predictions_dir, data, per_example)
                if path:
                    log(f"wrote per-example predictions to {path}")
        callbacks.after_evaluation(step, results)
        return results
