"""The hang watchdog: a job that makes no progress for --hang_timeout_s ends, on every
process, with every thread's stack in its log, one line saying what it was waiting for,
and exit status HANG_EXIT_STATUS, instead of holding its GPUs until the allocation ends.

Progress is the training loop reaching one of its hooks (a step dispatched, its summaries
fetched, a checkpoint saved, an evaluation done) or the launcher finishing a phase of the
start (restore, initialisation). A peer process that stalls stops the others inside a
collective: they stop making progress too, so each ends within the timeout. A peer that
dies is noticed by jax.distributed's coordination service, which ends the others itself
when the peer's heartbeat times out (100 s), still with its own C++ stack trace: jaxlib
0.10's client takes no Python callback for that error (it fails to cast one). The first
step's compilation has no hook inside it, so the default timeout is longer than a slow
compile (an hour); 0 turns the watchdog off.

The processes of a stalled job reach the timeout a little apart. The first to end closes
its connections, which fails the collective the others wait in, and a process whose main
thread then went on to jax.distributed's shutdown would abort there with a C++ trace. So a
watchdog that fires waits a grace period before it ends its process (the others' fire
meanwhile), and the launcher's error handler leaves a process whose watchdog has fired to
it (ENDING). Process 0 waits twice as long: it holds jax.distributed's coordination
service, whose end makes every other process's client abort with a C++ trace of its own.
"""

import faulthandler
import os
import sys
import threading
import time

from paxloom.core.callbacks import Callback, StepInfo

HANG_EXIT_STATUS = 4
GRACE_S = 5.0  # at most; a quarter of the timeout when that is shorter
ENDING = threading.Event()  # this process's watchdog has fired


class Watchdog(Callback):
    """Started by the launcher, fed by the loop's hooks; `stop()` (or the context manager's
    exit) ends it. Its thread is a daemon: it never keeps a finished process alive."""

    def __init__(self, timeout_s: float, waiting_for: str):
        self.timeout_s = timeout_s
        self._waiting_for = waiting_for
        self._last = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="paxloom-watchdog",
                                        daemon=True)

    def __enter__(self):
        if self.timeout_s > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stopped.set()

    def progress(self, waiting_for: str) -> None:
        """Something finished; what the job waits for next."""
        self._last, self._waiting_for = time.monotonic(), waiting_for

    # The loop's hooks are its progress.
    def on_start(self, run) -> None:
        self.progress(f"the first train step (step {run.start_step + 1}: compiled, then run)")

    def before_step(self, step: int) -> None:
        self.progress(f"train step {step + 1}")

    def after_step(self, info: StepInfo):
        self.progress(f"what follows train step {info.step} (its summaries, evaluation or "
                      f"checkpoint, or the next batch)")

    def on_save(self, info: StepInfo, final: bool) -> None:
        self.progress(f"the checkpoint of step {info.step}")

    def on_phase(self, name: str, seconds: float) -> None:
        self.progress(f"what follows the {name.replace('_', ' ')}")

    def after_evaluation(self, step: int, results: dict) -> None:
        self.progress(f"what follows the evaluation at step {step}")

    def _watch(self) -> None:
        poll = min(max(self.timeout_s / 20, 0.1), 10.0)
        while not self._stopped.wait(poll):
            idle = time.monotonic() - self._last
            if idle > self.timeout_s:
                self._end(idle)

    def _end(self, idle: float) -> None:
        ENDING.set()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        print(f"error: no progress for {idle:.0f} s on {_this_process()} while waiting for "
              f"{self._waiting_for} (--hang_timeout_s={self.timeout_s:g}); every thread's "
              f"stack is above", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        grace = min(GRACE_S, self.timeout_s / 4)
        time.sleep(2 * grace if _process_index() == 0 else grace)
        os._exit(HANG_EXIT_STATUS)


def _process_index() -> int:
    """This process's index (0 before jax's backends start, as for a single process)."""
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        return 0
    import jax

    return jax.process_index()


def _this_process() -> str:
    """'process I of N' once jax knows it (without starting jax's backends here)."""
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        return "this process"
    import jax

    return f"process {jax.process_index()} of {jax.process_count()}"
