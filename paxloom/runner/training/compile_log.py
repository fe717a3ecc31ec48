"""A console line before each of the run's big compilations, and its compile time.

XLA compiles the train step on its first call; for a large model that takes minutes,
and a console that says nothing meanwhile looks hung. JAX reports the start and the
duration of every backend compilation through jax.monitoring; this turns those
reports into lines for the programs that matter (and for any that take a second).

With the persistent compilation cache (paxloom/runner/cluster/compilation_cache.py) a "compilation" may
be a load of the program a previous run compiled; jax reports that with an event inside
the same compilation, so the line says so: "compiled jit(_train_step) in 0.9s (loaded
from the persistent compilation cache DIR)". The seconds, a load's included, are what
the goodput ledger counts as compile time (total_seconds()).
"""

import threading

import jax

from paxloom.core.log import log

# The event jax/_src/dispatch.py reports around each backend compilation (jax 0.10, 0.11).
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# Events jax/_src/compiler.py and compilation_cache.py report inside that compilation: the
# program came from the persistent cache; the compiled program was written to it.
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_WRITE_EVENT = "/jax/compilation_cache/cache_misses"
# The programs the runner compiles (jitted function names): announced before compiling.
ANNOUNCED = {"init": "the initial state", "_train_step": "the train step",
             "evaluate_batch": "an evaluation step"}
_SLOW_S = 1.0
_registered = False
_total_seconds = 0.0  # every backend compilation since register(), for the goodput ledger
# What the persistent cache did in this thread's compilation in progress: None, or the
# event. A thread's own: jax compiles in the thread that calls the program.
_current = threading.local()


def _on_start(event: str, value: float, **kwargs) -> None:
    if event != COMPILE_EVENT:
        return
    _current.cache = None
    name = kwargs.get("fun_name", "")
    if _bare(name) in ANNOUNCED:
        log(f"compiling {ANNOUNCED[_bare(name)]} ({name}) ...")


def _on_event(event: str, **kwargs) -> None:
    if event in (CACHE_HIT_EVENT, CACHE_WRITE_EVENT):
        _current.cache = event


def _on_duration(event: str, seconds: float, **kwargs) -> None:
    global _total_seconds
    if event != COMPILE_EVENT:
        return
    _total_seconds += seconds
    cache, _current.cache = getattr(_current, "cache", None), None
    name = kwargs.get("fun_name", "")
    if _bare(name) in ANNOUNCED or seconds >= _SLOW_S:
        log(f"compiled {name} in {seconds:.1f}s{_cache_note(cache)}")


def _cache_note(cache: str | None) -> str:
    where = f"the persistent compilation cache {jax.config.jax_compilation_cache_dir}"
    if cache == CACHE_HIT_EVENT:
        return f" (loaded from {where})"
    if cache == CACHE_WRITE_EVENT:
        return f" (saved to {where})"
    return ""


def _bare(name: str) -> str:
    """'jit(_train_step)' -> '_train_step'."""
    return name.removeprefix("jit(").removesuffix(")")


def total_seconds() -> float:
    """Seconds spent in XLA compilation by this process since register(), loads from the
    persistent compilation cache included."""
    return _total_seconds


def register() -> None:
    """Start logging compilations (once per process)."""
    global _registered
    if not _registered:
        jax.monitoring.register_scalar_listener(_on_start)
        jax.monitoring.register_event_listener(_on_event)
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _registered = True
