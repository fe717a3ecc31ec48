"""The training-loop callback protocol: what acts at fixed points of the loop.

Checkpoints, preemption, profiling, console and TensorBoard summaries, W&B and the goodput
ledger are callbacks (paxloom/runner/training/builtin_callbacks.py); an experiment adds its own by
returning them from its `callbacks()` method. The loop (paxloom/runner/training/trainer.py) calls,
in order:

    on_start(run)                        once, before the first step
    before_step(step)                    step: steps done so far
    after_step(info) -> Request | None   after each step whose number is a multiple of the
                                         callback's every_n_steps (and the last one)
    on_save(info, final)                 when any callback requested a save (or a stop),
                                         and once at the end with final=True
    extra_scalars(split, step) -> dict   when scalars are published: this callback's own to
                                         publish with them (the goodput ledger's fractions)
    on_scalars(split, step, scalars)     whenever scalars are published ("train", "eval")
    on_phase(name, seconds)              after time away from training: "input_wait",
                                         "evaluation", "checkpoint" (compilation excluded)
    after_evaluation(step, results)      after each evaluation: {set: {metric: value}}
    on_end(info)                         once, after the final save (also after a stop)

A callback requests a save or a stop by returning a Request from after_step; the loop
saves (every callback's on_save) before it stops. Subclass Callback and override what you
need: each method's default does nothing. Reading `info.metrics` values (device arrays)
waits for that step to finish, so a callback that does it every step slows the loop.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

from paxloom.core.spec import LoopSpec


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """The run as the loop starts it."""

    name: str  # the run's (experiment's) name
    start_step: int  # 0, or the restored step
    loop: LoopSpec  # max_steps, summary/eval/checkpoint intervals, ...
    global_batch_size: int
    seq_len: int
    num_params: int
    flops_per_token: float  # model FLOPs per trained token (paxloom/runner/training/throughput.py)
    peak_flops: float  # of all devices together; 0 where unknown (CPU)
    job_log_dir: str
    # Callbacks publish scalars with this (it reaches every callback's on_scalars).
    publish: Callable[[str, int, dict], None]


@dataclasses.dataclass(frozen=True)
class StepInfo:
    step: int  # steps done, counting this one
    state: Any  # the train state after it: {"step", "params", "opt_state"} on the devices
    metrics: dict  # this step's device scalars: loss, grad_norm, learning_rate, nonfinite
    input_state: dict | None  # the data position after it, as checkpoints store it


@dataclasses.dataclass(frozen=True)
class Request:
    save: bool = False  # save a checkpoint after this step
    stop: bool = False  # save, then end training (a signal, early stopping)
    reason: str = ""  # logged when stopping


class Callback:
    """Base class: every hook does nothing; `every_n_steps` says which steps reach
    after_step (1: all)."""

    every_n_steps: int = 1

    def on_start(self, run: RunInfo) -> None:
        pass

    def before_step(self, step: int) -> None:
        pass

    def after_step(self, info: StepInfo) -> Request | None:
        return None

    def on_save(self, info: StepInfo, final: bool) -> None:
        pass

    def extra_scalars(self, split: str, step: int) -> dict:
        return {}

    def on_scalars(self, split: str, step: int, scalars: dict) -> None:
        pass

    def on_phase(self, name: str, seconds: float) -> None:
        pass

    def after_evaluation(self, step: int, results: dict) -> None:
        pass

    def on_end(self, info: StepInfo) -> None:
        pass
