"""The batch layout of a run, derived in one place from PERCORE_BATCH_SIZE, the mesh, the
accumulation steps and the pipeline's microbatches. The experiment's checks, the trainer,
the planner and --print_config all read it from here."""

import dataclasses
import math
from collections.abc import Sequence

from paxloom.core.errors import UserError
from paxloom.core.mesh_axes import BATCH_AXES, MESH_AXIS_NAMES, full_shape


class ScheduleError(UserError):
    """The pipeline's microbatches do not fit the batch."""


@dataclasses.dataclass(frozen=True)
class BatchLayout:
    percore_batch_size: float
    num_devices: int
    batch_shards: int  # the ways the rows are split: stage x replica x data
    global_batch: int  # sequences per optimizer update
    accumulation_steps: int  # sub-batches per update (GRADIENT_ACCUMULATION_STEPS)
    num_microbatches: int | None = None  # per sub-batch, when pipelined

    @property
    def sub_batch(self) -> int:
        """Sequences of one pass through the model."""
        return self.global_batch // self.accumulation_steps

    @property
    def microbatch_size(self) -> int | None:
        return None if self.num_microbatches is None else self.sub_batch // self.num_microbatches

    def summary(self) -> str:
        """One line for --print_config: the global batch of an update and its parts."""
        line = (f"global batch = PERCORE_BATCH_SIZE {self.percore_batch_size:g} x "
                f"{self.num_devices} devices = {self.global_batch} sequences per optimizer "
                f"update")
        if self.accumulation_steps > 1:
            line += (f", run as GRADIENT_ACCUMULATION_STEPS = {self.accumulation_steps} "
                     f"sub-batches of {self.global_batch / self.accumulation_steps:g}")
        line += f", its rows split over {self.batch_shards} batch shards"
        if self.num_microbatches is not None:
            line += (f", each in {self.num_microbatches} pipeline microbatches of "
                     f"{self.microbatch_size}")
        return line


def layout(percore_batch_size: float, mesh_shape: Sequence[int], accumulation_steps: int = 1,
           *, num_microbatches: int | None = None, microbatch_size: int | None = None,
           check: bool = True) -> BatchLayout:
    """The layout for a mesh of `mesh_shape` (whole mesh, ICI x DCN, over MESH_AXIS_NAMES, or
    written as the user writes it: mesh_axes.full_shape), or UserError naming the hyperparameter to change.

    GLOBAL_BATCH_SIZE = PERCORE_BATCH_SIZE x devices, whatever the strategy (Pax's rule).
    PERCORE_BATCH_SIZE may be fractional with tensor or pipeline parallelism: with TP=2,
    0.5 gives each model replica one sequence per step. A pipelined mesh's microbatches
    come from one of `num_microbatches` and `microbatch_size` (per sub-batch).
    `check=False` describes a layout that may not split (--print_config shows it anyway)."""
    axes = dict(zip(MESH_AXIS_NAMES, full_shape(mesh_shape), strict=True))
    num_devices = math.prod(axes.values())
    exact = percore_batch_size * num_devices
    batch = round(exact)
    shards = math.prod(axes[a] for a in BATCH_AXES)
    if not check:
        return BatchLayout(percore_batch_size, num_devices, shards, batch, accumulation_steps,
                           num_microbatches)
    if abs(exact - batch) > 1e-6 or batch < 1:
        raise UserError(
            f"PERCORE_BATCH_SIZE={percore_batch_size} x {num_devices} devices = {exact:g} "
            f"is not a whole number of sequences; pick PERCORE_BATCH_SIZE so that the "
            f"product is an integer, e.g. {max(1, round(exact)) / num_devices:g}")
    if batch % shards:
        raise UserError(
            f"GLOBAL_BATCH_SIZE={batch} (PERCORE_BATCH_SIZE={percore_batch_size} x "
            f"{num_devices} devices) does not split over {shards} data-parallel "
            f"shards (stage x replica x data); the smallest PERCORE_BATCH_SIZE for this mesh "
            f"is {shards / num_devices:g}, and it must be a multiple of that")
    steps = accumulation_steps
    if steps < 1:
        raise UserError(f"GRADIENT_ACCUMULATION_STEPS={steps} must be >= 1 (1: no "
                        f"accumulation)")
    if batch % (shards * steps):
        per_shard = batch // shards
        fitting = max(d for d in range(1, steps + 1) if per_shard % d == 0)
        percore = math.ceil(batch / (shards * steps)) * shards * steps / num_devices
        raise UserError(
            f"GRADIENT_ACCUMULATION_STEPS={steps} does not split GLOBAL_BATCH_SIZE="
            f"{batch} (PERCORE_BATCH_SIZE={percore_batch_size:g} x {num_devices} "
            f"devices) into {steps} sub-batches over {shards} data-parallel shards (it must "
            f"be a multiple of {shards} x {steps} = {shards * steps}); use "
            f"--fdl.PERCORE_BATCH_SIZE={percore:g} or --fdl.GRADIENT_ACCUMULATION_STEPS="
            f"{fitting}")
    found = BatchLayout(percore_batch_size, num_devices, shards, batch, steps)
    if axes["stage"] == 1 or num_microbatches is None and microbatch_size is None:
        return found  # one stage, or a pipeline's schedule not asked about
    return dataclasses.replace(found, num_microbatches=_microbatches(
        found, axes, num_microbatches, microbatch_size))


def _microbatches(found: BatchLayout, axes: dict, count: int | None,
                  size: int | None) -> int:
    """Microbatches per sub-batch of a pipelined mesh; each splits over a stage's replica x
    data shards."""
    sub_batch = found.sub_batch
    if count is not None and size is not None:
        raise ScheduleError(f"NUM_MICROBATCHES={count} and MICROBATCH_SIZE={size}: set one of them")
    what = (f"the batch of {sub_batch} sequences (PERCORE_BATCH_SIZE="
            f"{found.percore_batch_size} x {found.num_devices} devices / "
            f"GRADIENT_ACCUMULATION_STEPS={found.accumulation_steps})")
    name, value = ("NUM_MICROBATCHES", count) if size is None else ("MICROBATCH_SIZE", size)
    if value < 1 or sub_batch % value:
        raise ScheduleError(f"{name}={value} does not divide {what}; pick a divisor of {sub_batch}")
    microbatches = value if size is None else sub_batch // value
    shards = axes["replica"] * axes["data"]
    if (sub_batch // microbatches) % shards:
        raise ScheduleError(
            f"{name}={value} makes microbatches of {sub_batch // microbatches} sequences, "
            f"which do not split over the {shards} replica x data shards of each stage; use "
            f"fewer, larger microbatches")
    return microbatches
