"""Preemption: on SIGTERM, Ctrl-C (SIGINT) or --preemption_signal, finish the step, save, and
exit with status 0.

SLURM sends SIGTERM when it preempts or cancels a job (and SIGKILL after
KillWait, 30 s by default); `#SBATCH --signal=USR1@120` asks for SIGUSR1 two
minutes before the time limit, hence the extra signal (default SIGUSR1). A
second signal of the same kind is not caught: it ends the process at once.

One process: a Python handler sets a flag; the train loop checks it after each
step.

Several processes (jax.distributed): all must stop at the same step, or the
collective save would hang. jax's preemption service, started by
jax.distributed.initialize (jax_enable_preemption_service, on by default),
catches SIGTERM in C++, tells the coordinator, and from then on
`reached_preemption_sync_point(step)` is True on every process at one agreed
step. It must be called at every step. A Python SIGTERM handler would replace
jax's, so none is installed then; the extra signal is re-sent to this process
as SIGTERM for jax to see.
"""

import os
import signal

import jax
from jax.experimental import multihost_utils

from paxloom.core.callbacks import Callback, Request, StepInfo
from paxloom.core.errors import UserError
from paxloom.core.log import log


def parse_signal(name: str | None) -> signal.Signals | None:
    """'SIGUSR1', 'USR1', '10' -> signal.SIGUSR1; '' or 'none' -> None."""
    if name is None or name.strip().lower() in ("", "none"):
        return None
    text = name.strip().upper()
    try:
        sig = signal.Signals(int(text)) if text.isdigit() else signal.Signals[
            text if text.startswith("SIG") else "SIG" + text]
    except (KeyError, ValueError):
        raise UserError(f"--preemption_signal={name}: not a signal name (e.g. SIGUSR1, SIGUSR2, "
                        f"or none)") from None
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        raise UserError(f"--preemption_signal={name}: {sig.name} cannot be caught")
    return sig


class PreemptionWatcher(Callback):
    """A training-loop callback that requests a save and a stop after the step at which a
    signal arrived (`reached(step)`). Use as a context manager: it restores the previous
    signal handlers on exit."""

    def __init__(self, extra_signal: str | None = "SIGUSR1"):
        extra = parse_signal(extra_signal)
        self.received: str | None = None
        self._previous: dict[signal.Signals, object] = {}
        self.synchronized = bool(jax.distributed.is_initialized()
                                 and jax.config.jax_enable_preemption_service)
        if jax.process_count() > 1 and not self.synchronized:
            log("preemption: jax's preemption service is off, so a signal cannot stop all "
                "processes at one step; SIGTERM will end this job without a checkpoint")
            return
        # Ctrl-C (SIGINT) saves and stops too; a second one ends the process at once.
        if self.synchronized:
            for sig in {extra, signal.SIGINT} - {None, signal.SIGTERM}:
                self._install(sig, self._forward_as_sigterm)
        else:
            for sig in {signal.SIGTERM, signal.SIGINT, extra} - {None}:
                self._install(sig, self._note)

    def _install(self, sig: signal.Signals, handler) -> None:
        self._previous[sig] = signal.signal(sig, handler)

    def _note(self, signum, frame) -> None:
        # Printing here could interrupt a print on the main thread; the loop reports it.
        self.received = signal.Signals(signum).name
        signal.signal(signum, signal.SIG_DFL)  # a second one ends the process

    def _forward_as_sigterm(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def reached(self, step: int) -> bool:
        if self.synchronized:
            if not multihost_utils.reached_preemption_sync_point(step):
                return False
            self.received = self.received or "SIGTERM"
            return True
        return self.received is not None

    def after_step(self, info: StepInfo) -> Request | None:
        if not self.reached(info.step):
            return None
        return Request(stop=True, reason=f"{self.received} received; saving a checkpoint and "
                                         f"stopping (run the same command again to resume)")

    def close(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
