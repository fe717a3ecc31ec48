"""Profiles of chosen train steps, and JAX's on-demand profiler server.

A trace goes to job_log_dir/tb/plugins/profile/<time>/ (TensorBoard's profile tab
reads it from the tb/ log directory), with a Perfetto trace (*.trace.json.gz) beside
it for ui.perfetto.dev.
"""

import jax

from paxloom.core.callbacks import Callback, StepInfo
from paxloom.core.errors import UserError
from paxloom.core.log import log


def start_server(port: int) -> None:
    """--jax_profiler_port: capture from TensorBoard's profile tab while the job runs."""
    try:
        jax.profiler.start_server(port)
    except Exception as error:  # the port is taken, or out of range
        raise UserError(f"--jax_profiler_port={port}: cannot start the profiler server "
                        f"({' '.join(str(error).split())}); pick a free port") from None
    log(f"JAX profiler server on port {port}: in TensorBoard's profile tab, capture from "
        f"localhost:{port}")


class StepProfiler(Callback):
    """A training-loop callback that traces the train steps after `start_step` (the steps
    numbered start_step + 1 .. start_step + num_steps)."""

    def __init__(self, log_dir: str, start_step: int, num_steps: int):
        if start_step < 0 or num_steps < 1:
            raise UserError(f"--profile_start_step={start_step} --profile_num_steps={num_steps}: "
                            f"need a step >= 0 and at least one step to trace")
        self.log_dir, self.start, self.stop = log_dir, start_step, start_step + num_steps
        self.tracing = False

    def before_step(self, step: int) -> None:
        """`step`: steps done so far (the next one is step + 1)."""
        if step == self.start and not self.tracing:
            jax.profiler.start_trace(self.log_dir, create_perfetto_trace=True)
            self.tracing = True

    def after_step(self, info: StepInfo) -> None:
        if self.tracing and info.step >= self.stop:
            self.finish(info.metrics)

    def on_end(self, info: StepInfo) -> None:
        self.finish(info.metrics)

    def finish(self, outputs=None) -> None:
        """Stop a trace in progress (at its last step, or when training ends first)."""
        if not self.tracing:
            return
        jax.block_until_ready(outputs)  # the traced steps' device work belongs in the trace
        jax.profiler.stop_trace()
        self.tracing = False
        log(f"wrote a profile of steps {self.start + 1}..{self.stop} to "
            f"{self.log_dir}/plugins/profile (TensorBoard's profile tab; Perfetto trace beside)")
