"""What an experiment's Fiddle graph builds into: the pieces of one run.

experiments/run_graph.py writes these as `fdl.Config`s; `pax_fiddle.build`
turns the graph into a RunSpec holding a praxis model, an optax optimizer,
input factories and plain settings. The runner only ever sees a RunSpec.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import optax


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    ici_mesh_shape: list[int]
    dcn_mesh_shape: list[int]


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


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """Sizes the runner needs for FLOPs accounting."""

    num_layers: int
    num_heads: int
    dims_per_head: int
    seq_len: int


@dataclasses.dataclass(frozen=True)
class EvalSpec:
    """One evaluation set.

    `make_input(global_batch_size=, process_rows=)` returns an iterable of batch
    dicts. kind "lm": loss and perplexity over all weighted tokens. kind
    "lambada": weights mark the target word; accuracy = every target token right.
    """

    name: str
    kind: str
    make_input: Callable[..., Any]


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
    evals: list[EvalSpec] = dataclasses.field(default_factory=list)
