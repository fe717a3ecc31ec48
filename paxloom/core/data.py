"""The data contract: what a dataset hands the runtime, and what the runtime asks of it.

Both sides import this module: datasets in tasks/ (or in a user's own module) implement
these protocols, and the training loop, evaluation and inference consume them, so neither
knows the other by name.

A batch is a dict of numpy arrays, each [rows, seq_len], with the keys and dtypes of
BATCH_DTYPES. `rows` is this process's share of the global batch (`process_rows`); the
runtime assembles the global array. Targets are `labels` weighted by `weights` (0 on
padding); `segment_ids`/`segment_pos` mark the documents packed into a row (segment 0 and
paddings 1 on padding).

An experiment's dataset (the registry in tasks/datasets.py, or a user's own class) is a
`Dataset`: given the run's `DataSettings`, it returns Fiddle nodes, so everything the run
reads is recorded in its graph (fiddle_graph.json) and can be overridden with
--fdl.path=VALUE:

- `train_input(settings)`: an `fdl.Partial` of a factory called as
  `factory(global_batch_size=, process_rows=)` once the mesh is known, returning a
  `TrainInput`; None when the dataset has no training split.
- `evaluations(settings)`: `fdl.Config`s of core.spec.Evaluation subclasses, whose
  `make_input(global_batch_size=, process_rows=)` returns an `EvalInput`.
- `tokenizer(settings)`: an `fdl.Config` building the `Tokenizer` the text is encoded with
  (evaluations on text, --mode=decode and Hugging Face export use this same node), or None
  when the data are token ids.

An input factory (train or evaluation) may carry a `check(**arguments)` attribute: called
with the node's own arguments (all but global_batch_size and process_rows) before the
first step, it raises UserError, in one line naming the missing file and the flag that
turns that input off, instead of the run failing at its first evaluation (`check_input`).
"""

import dataclasses
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

# The batch contract: every key, with the dtype the runtime puts on the devices.
BATCH_DTYPES = {
    "ids": np.int32,
    "labels": np.int32,
    "weights": np.float32,
    "paddings": np.float32,
    "segment_ids": np.int32,
    "segment_pos": np.int32,
}


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """What a dataset is told about the run: the experiment's sizes and seeds, and where the
    command line says data and tokenizers live."""

    seq_len: int  # MAX_SEQ_LEN
    vocab_size: int  # VOCAB_SIZE; a tokenizer with more ids is refused
    seed: int  # TRAIN_INPUT_RANDOM_SEED
    packed: bool  # PACKED_INPUT: documents packed across rows (else one per row)
    eval_batches: int  # EVAL_BATCHES; 0: no held-out evaluation
    # MAX_SEGMENTS_PER_SEQ: the most segments (documents, a row's trailing padding counting
    # as one) a batch row may hold; 0: no bound. Datasets that pack rows keep to it; the
    # runtime refuses a batch with a row over it (tasks/packing.py check_segment_bound).
    max_segments: int = 0
    lambada_eval: bool = False  # LAMBADA_EVAL: add Lambada (text datasets only)
    lambada_max_examples: int = 0  # LAMBADA_MAX_EXAMPLES; 0: all
    # VALIDATION_FILES / VALIDATION_FRACTION: held-out data, for datasets that take it
    # (their `takes_validation`); a dataset's own setting wins.
    validation_files: str | None = None
    validation_fraction: float = 0.0
    # TEXT_FIELD: the jsonl key / parquet column of the text, for datasets that take it
    # (their `takes_text_field`); a dataset's own setting wins.
    text_field: str = "text"
    # ADD_BOS (None: as the tokenizer's post-processor does) and ADD_EOS: the tokens around
    # every document (paxloom/core/framing.py), given to the tokenizer node.
    add_bos: bool | None = None
    add_eos: bool = True
    data_dir: str | None = None  # --data_dir, --tfds_data_dir or $TFDS_DATA_DIR
    vocab_path: str | None = None  # --vocab_path or $VOCAB_PATH
    cache_dir: str | None = None  # --cache_dir: tokenized data
    # (size, where it is read) of the vocabulary that the starting weights
    # (CHECKPOINT_RESTORE_PATH) fix, when they fix one: a tokenizer with more ids is refused
    weights_vocab: tuple[int, str] | None = None


class TrainInput(Protocol):
    """An endless, restartable stream of this process's rows of each global batch. The
    state is JSON and the same on every process; set_state(get_state()) after batch k
    continues with batch k+1 exactly (checkpoints store it)."""

    def next_batch(self) -> dict[str, np.ndarray]: ...

    def get_state(self) -> dict: ...

    def set_state(self, state: dict) -> None: ...


class EvalInput(Protocol):
    """The same batches each time it is iterated (this process's rows of each)."""

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]: ...


class Tokenizer(Protocol):
    """Text <-> ids; `encode` gives a text's own ids. The tokens around a document are the
    tokenizer's `framing` (paxloom/core/framing.py; one without a `framing` is framed as
    Pax's: `eos_id` ends every document and, as an input, starts the next, playing BOS);
    id 0 is padding in batches."""

    vocab_size: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: list[str], num_threads: int = 1) -> list[list[int]]: ...

    def decode(self, ids) -> str: ...


class Dataset(Protocol):
    """What an experiment trains and evaluates on (see the module docstring)."""

    def train_input(self, settings: DataSettings) -> Any: ...

    def evaluations(self, settings: DataSettings) -> list[Any]: ...

    def tokenizer(self, settings: DataSettings) -> Any: ...


def check_input(make_input) -> None:
    """Call the input factory's `check` (see the module docstring), if it has one, with the
    arguments of the built node `make_input` (a functools.partial)."""
    check = getattr(getattr(make_input, "func", make_input), "check", None)
    if check is not None:
        check(**getattr(make_input, "keywords", {}))
