"""What an experiment's Fiddle graph builds into: the pieces of one run.

experiments/run_graph.py writes these as `fdl.Config`s; `pax_fiddle.build`
turns the graph into a RunSpec holding a praxis model, an optax optimizer,
input factories and plain settings. The runner only ever sees a RunSpec.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax

from paxloom.core import batch, data, mesh_axes


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    ici_mesh_shape: list[int]
    dcn_mesh_shape: list[int]


def mesh_size(mesh) -> list[int]:
    """The whole mesh along each axis: ICI x DCN (a MeshSpec or its fdl.Config)."""
    return mesh_axes.mesh_size(mesh.ici_mesh_shape, mesh.dcn_mesh_shape)


def batch_layout(run, check: bool = True) -> batch.BatchLayout:
    """The batch layout a run (a RunSpec or its fdl.Config) trains with (paxloom/core/batch.py)."""
    pipeline = run.pipeline
    return batch.layout(run.loop.percore_batch_size, mesh_size(run.mesh),
                        run.loop.gradient_accumulation_steps,
                        num_microbatches=None if pipeline is None else pipeline.num_microbatches,
                        check=check)


@dataclasses.dataclass(frozen=True)
class LoopSpec:
    max_steps: int
    summary_interval_steps: int
    eval_interval_steps: int
    checkpoint_every_n_steps: int
    checkpoint_max_to_keep: int
    skip_nonfinite_steps: bool
    percore_batch_size: float
    random_seed: int
    gradient_accumulation_steps: int = 1  # sub-batches per optimizer update


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    """The pipeline schedule of a model whose layers are split over mesh stages."""

    num_stages: int
    num_microbatches: int  # per sub-batch
    circular_repeat: int = 1

    def bubble_fraction(self) -> float:
        """The share of each stage's time spent idle: (S-1)/(R*M+S-1) for S stages, M
        microbatches and R circular repeats (GPipe when R=1): every stage does R*M units
        of work over the R*M+S-1 iterations the schedule takes."""
        s, m, r = self.num_stages, self.num_microbatches, self.circular_repeat
        return (s - 1) / (r * m + s - 1)


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """Sizes the runtime needs: FLOPs accounting, batch shapes, the tokenizer check."""

    num_layers: int
    num_heads: int
    dims_per_head: int
    seq_len: int  # MAX_SEQ_LEN
    vocab_size: int  # VOCAB_SIZE
    # The share of each expert's weights one token uses (experts per token / experts) in a
    # mixture of experts, for FLOPs per token; 1.0 for a dense model.
    expert_share: float = 1.0
    # A mixture of experts: how many experts each MoE layer has (0: dense), and the mesh axis
    # they are split over ("none": every device holds all of them; None: placed by praxis's
    # GShard layers, as GLaM's are), for the start line.
    num_experts: int = 0
    expert_axis: str | None = None
    # MAX_SEQ_LEN's twin for segments: the most a batch row may hold (MAX_SEGMENTS_PER_SEQ);
    # rows with more are refused before they reach the devices. 0: unchecked.
    max_segments: int = 0


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One evaluation set; subclasses (tasks/evaluations.py) bring their own metrics.

    `make_input(global_batch_size=, process_rows=)` returns an iterable of batch
    dicts. Per batch, `batch_outputs` runs on the devices, inside the jitted eval
    step, and returns arrays with the batch as their first dimension; the runner
    concatenates them over all batches and hands them to `metrics` (and, for
    `--mode=eval`, to `write_outputs`). The runner knows no evaluation by name.
    """

    name: str
    make_input: Callable[..., Any]

    def batch_outputs(self, predictions, batch: dict) -> dict:
        """Per-example [B] sums over the weighted target tokens: log-probability, count
        and argmax-correct. `predictions` is praxis LanguageModel.compute_predictions'."""
        weights = batch["weights"]  # [B, T]
        logprob = -predictions.per_example_xent.astype(jnp.float32)  # [B, T]
        correct = (predictions.per_example_argmax == batch["labels"]).astype(jnp.float32)
        return {
            "logprob": jnp.sum(logprob * weights, axis=1),
            "num_targets": jnp.sum(weights, axis=1),
            "num_correct": jnp.sum(correct * weights, axis=1),
        }

    def check(self) -> None:
        """Raise UserError now, before the run's first step, if this evaluation's data
        cannot be read (default: its input factory's `check`, paxloom/core/data.py)."""
        data.check_input(self.make_input)

    def metrics(self, outputs: dict[str, np.ndarray]) -> dict[str, float]:
        raise NotImplementedError

    def write_outputs(self, directory: str, data, outputs: dict[str, np.ndarray]) -> str | None:
        """Write per-example results under `directory` (process 0 only); return the path."""
        return None


@dataclasses.dataclass(frozen=True)
class InitialWeights:
    """Where a new run's parameters come from instead of their initialisation (Pax's
    init_from_checkpoint_rules): a checkpoint path, and regexes over parameter paths that
    keep their fresh initialisation (paxloom/runner/state/initial_weights.py)."""

    path: str
    ignore_rules: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    name: str
    model: Any  # praxis LanguageModel (unbound flax module)
    optimizer: optax.GradientTransformation
    learning_rate: optax.Schedule
    mesh: MeshSpec
    loop: LoopSpec
    model_shape: ModelShape
    # `make_train_input(global_batch_size=, process_rows=)` -> object with
    # next_batch(), get_state(), set_state(); None for eval-only experiments.
    make_train_input: Callable[..., Any] | None = None
    evals: list[Evaluation] = dataclasses.field(default_factory=list)
    # The text tokenizer (core.data.Tokenizer) the data are encoded with, the same
    # object decode and export use; None when the data are token ids (synthetic).
    tokenizer: Any = None
    initial_weights: InitialWeights | None = None  # None: initialised from RANDOM_SEED
    pipeline: PipelineSpec | None = None  # None: one stage
