"""The built-in training-loop callbacks (paxloom/core/callbacks.py has the protocol) and the
list that dispatches to them.

The console and TensorBoard summaries live here; checkpoints (paxloom/runner/state/checkpoints.py),
preemption, profiling, W&B and the goodput ledger are callbacks in their own modules. The
launcher (paxloom/launch/job.py) decides once which of them a run has.
"""

import time

import jax
import numpy as np

from paxloom.core.callbacks import Callback, Request, RunInfo, StepInfo
from paxloom.core.log import format_duration, log
from paxloom.runner.training.summaries import SummaryWriter


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm became NaN/Inf (and SKIP_NONFINITE_STEPS is off)."""


def check_finite(nonfinite_flags: list, step: int) -> None:
    """Raise NonFiniteLossError if any of the steps ending at `step` went non-finite
    (`nonfinite_flags`: those steps' device flags, oldest first)."""
    if not nonfinite_flags:
        return
    flags = np.asarray(jax.device_get(nonfinite_flags))
    if flags.any():
        bad = step - len(flags) + 1 + int(np.argmax(flags))
        raise NonFiniteLossError(
            f"loss, gradient norm or parameters became NaN/Inf at step {bad}; stopping "
            f"without saving (the last good checkpoint is kept). Lower LEARNING_RATE, or set "
            f"SKIP_NONFINITE_STEPS=True to skip such steps")


class CallbackList:
    """Calls each callback's hooks in order, honouring its every_n_steps, and combines what
    they request."""

    def __init__(self, callbacks):
        self.callbacks = list(callbacks)
        self.max_steps = 0

    def on_start(self, run: RunInfo) -> None:
        self.max_steps = run.loop.max_steps
        for cb in self.callbacks:
            cb.on_start(run)

    def before_step(self, step: int) -> None:
        for cb in self.callbacks:
            cb.before_step(step)

    def after_step(self, info: StepInfo) -> Request:
        save = stop = False
        reasons = []
        for cb in self.callbacks:
            every = max(1, cb.every_n_steps)
            if info.step % every and info.step != self.max_steps:
                continue
            request = cb.after_step(info) or Request()
            save, stop = save or request.save, stop or request.stop
            if request.reason:
                reasons.append(request.reason)
        return Request(save=save, stop=stop, reason="; ".join(reasons))

    def on_save(self, info: StepInfo, final: bool) -> None:
        for cb in self.callbacks:
            cb.on_save(info, final)

    def publish(self, split: str, step: int, scalars: dict) -> None:
        """`scalars` with every callback's extra_scalars, to every callback's on_scalars."""
        scalars = dict(scalars)
        for cb in self.callbacks:
            scalars.update(cb.extra_scalars(split, step))
        for cb in self.callbacks:
            cb.on_scalars(split, step, scalars)

    def on_phase(self, name: str, seconds: float) -> None:
        for cb in self.callbacks:
            cb.on_phase(name, seconds)

    def after_evaluation(self, step: int, results: dict) -> None:
        for cb in self.callbacks:
            cb.after_evaluation(step, results)

    def on_end(self, info: StepInfo) -> None:
        for cb in self.callbacks:
            cb.on_end(info)


class ConsoleSummaries(Callback):
    """Every SUMMARY_INTERVAL_STEPS (and at the last step): the mean loss and gradient norm
    of the steps since the last summary, the learning rate, steps/s, tokens/s, MFU and ETA,
    as a console line and as "train" scalars. The first step (compilation) is timed apart."""

    def on_start(self, run: RunInfo) -> None:
        self.run = run
        self.pending: list[dict] = []  # device-side metrics since the last summary
        self.first = True
        self.interval_start, self.interval_step = time.perf_counter(), run.start_step

    def after_step(self, info: StepInfo) -> None:
        self.pending.append(info.metrics)
        if self.first:
            self.first = False
            jax.block_until_ready(info.metrics)
            log(f"step {info.step}: compiled and ran in "
                f"{time.perf_counter() - self.interval_start:.1f}s")
            self.interval_start, self.interval_step = time.perf_counter(), info.step
        loop = self.run.loop
        if info.step % loop.summary_interval_steps == 0 or info.step == loop.max_steps:
            self._summarize(info.step)

    def after_evaluation(self, step: int, results: dict) -> None:
        self.interval_start = time.perf_counter()  # evaluation time is not training speed

    def _summarize(self, step: int) -> None:
        run, pending = self.run, self.pending
        if not run.loop.skip_nonfinite_steps:
            check_finite([m["nonfinite"] for m in pending], step)
        elapsed, steps = time.perf_counter() - self.interval_start, step - self.interval_step
        host = jax.device_get(pending)
        loss = float(np.mean([m["loss"] for m in host]))
        grad_norm = float(np.mean([m["grad_norm"] for m in host]))
        learning_rate = float(host[-1]["learning_rate"])
        skipped = int(sum(bool(m["nonfinite"]) for m in host))
        scalars = {"loss": loss, "learning_rate": learning_rate, "grad_norm": grad_norm}
        line = (f"step {step:>6} | loss {loss:.4f} | lr {learning_rate:.3e} | "
                f"grad_norm {grad_norm:.3f}")
        for name in sorted(k for k in host[-1] if "/" in k):  # the layers' step metrics
            scalars[name] = float(np.mean([m[name] for m in host]))
            line += f" | {name} {scalars[name]:.4g}"
        if steps > 0 and elapsed > 0:  # no rate right after the (timed-apart) first step
            steps_per_sec = steps / elapsed
            tokens_per_sec = steps_per_sec * run.global_batch_size * run.seq_len
            scalars.update(steps_per_sec=steps_per_sec, tokens_per_sec=tokens_per_sec)
            line += f" | {steps_per_sec:.2f} steps/s | {tokens_per_sec:,.0f} tokens/s"
            if run.peak_flops:
                mfu = tokens_per_sec * run.flops_per_token / run.peak_flops
                scalars["mfu"] = mfu
                line += f" | MFU {mfu:.1%}"
            line += f" | ETA {format_duration((run.loop.max_steps - step) / steps_per_sec)}"
        if skipped:
            scalars["skipped_nonfinite_steps"] = skipped
            line += f" | skipped {skipped} non-finite step(s)"
        log(line)
        run.publish("train", step, scalars)
        self.pending = []
        self.interval_start, self.interval_step = time.perf_counter(), step


class TensorBoard(Callback):
    """Published scalars to job_log_dir/tb/{train,eval} (event files and metrics.jsonl, on
    process 0), and the run's hyperparameters to TensorBoard's HPARAMS tab."""

    def __init__(self, job_log_dir: str, hyperparameters: dict | None = None):
        self.job_log_dir, self.hyperparameters = job_log_dir, hyperparameters
        self._writers: dict[str, SummaryWriter] = {}
        self._resumed_at = 0

    def writer(self, split: str) -> SummaryWriter:
        if split not in self._writers:
            self._writers[split] = SummaryWriter(f"{self.job_log_dir}/tb/{split}")
            if self._resumed_at:  # what earlier runs logged after it is done again
                self._writers[split].restart(self._resumed_at + 1)
        return self._writers[split]

    def on_start(self, run: RunInfo) -> None:
        self._resumed_at = run.start_step
        if self.hyperparameters:
            self.writer("train").hyperparameters(self.hyperparameters)

    def on_scalars(self, split: str, step: int, scalars: dict) -> None:
        self.writer(split).scalars(step, scalars)

    def on_end(self, info: StepInfo) -> None:
        for writer in self._writers.values():
            writer.flush()
