"""A console line before each of the run's big compilations, and its compile time.

XLA compiles the train step on its first call; for a large model that takes minutes,
and a console that says nothing meanwhile looks hung. JAX reports the start and the
duration of every backend compilation through jax.monitoring; this turns those
reports into lines for the programs that matter (and for any that take a second).
"""

import jax

from runner.summaries import log

# The event jax/_src/dispatch.py reports around each backend compilation (jax 0.10, 0.11).
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# The programs the runner compiles (jitted function names): announced before compiling.
ANNOUNCED = {"init": "the initial state", "_train_step": "the train step",
             "evaluate_batch": "an evaluation step"}
_SLOW_S = 1.0
_registered = False
_total_seconds = 0.0  # every backend compilation since register(), for the goodput ledger


def _on_start(event: str, value: float, **kwargs) -> None:
    name = kwargs.get("fun_name", "")
    if event == COMPILE_EVENT and _bare(name) in ANNOUNCED:
        log(f"compiling {ANNOUNCED[_bare(name)]} ({name}) ...")


def _on_duration(event: str, seconds: float, **kwargs) -> None:
    global _total_seconds
    if event != COMPILE_EVENT:
        return
    _total_seconds += seconds
    name = kwargs.get("fun_name", "")
    if _bare(name) in ANNOUNCED or seconds >= _SLOW_S:
        log(f"compiled {name} in {seconds:.1f}s")


def _bare(name: str) -> str:
    """'jit(_train_step)' -> '_train_step'."""
    return name.removeprefix("jit(").removesuffix(")")


def total_seconds() -> float:
    """Seconds spent in XLA compilation by this process since register()."""
    return _total_seconds


def register() -> None:
    """Start logging compilations (once per process)."""
    global _registered
    if not _registered:
        jax.monitoring.register_scalar_listener(_on_start)
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _registered = True
