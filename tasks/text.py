"""Your own corpus: `TextFiles`, a dataset of text files named by path or glob.

    class MyGPT(experiments.GPT126M):
        def dataset(self):
            return TextFiles(train="corpus/*.jsonl.gz", validation="corpus/val.parquet",
                             text_field="body", tokenizer_path="tokenizer.json")

Formats (tasks/text_formats.py): .jsonl, .jsonl.gz, .jsonl.zst (the `text_field` key of
each line), .parquet and a Hugging Face `save_to_disk` directory (its `text_field` column,
read with pyarrow), .txt (a document per file, or per blank-line-separated block), and
Pax's TFDS shards. The tokenizer is a SentencePiece .model or a Hugging Face
tokenizer.json, chosen by the file (tasks/tokenizer.py).

Validation comes from separate files, or from `validation_fraction` of the training
documents, held out by a hash of (file name, document index): the same documents every
run, on every process, whatever the file order. Everything else (tokenizing once into a
cache, packing, shuffling, exact resume) is the shared input pipeline's
(tasks/input_pipeline.py).

`--fdl.DATASET="text"` trains on the files under --data_dir with --vocab_path's
tokenizer, with no code; `--fdl.TEXT_FIELD=content` reads the text of training and
validation files alike from another key or column (a `text_field` given in code wins).
"""

import dataclasses
import functools
import hashlib

import fiddle as fdl

from paxloom.core.data import DataSettings
from paxloom.core.errors import UserError
from tasks import evaluations
from tasks.input_pipeline import PileEvalInput, PileTrainInput
from tasks.nodes import lambada_evaluation, required_data_dir, tokenizer_node
from tasks.text_formats import TextFormat, expand_files


@dataclasses.dataclass(frozen=True)
class HeldOutFormat(TextFormat):
    """A TextFormat that keeps only the training or only the held-out documents. Part of the
    token cache's key like any format, so the two splits are cached apart."""

    validation_fraction: float = 0.0
    keep: str = "train"  # or "validation"

    def documents(self, path, stats=None, with_set_name: bool = False):
        name = str(path).rsplit("/", 1)[-1]
        for index, document in enumerate(super().documents(path, stats, with_set_name)):
            if held_out(name, index, self.validation_fraction) == (self.keep == "validation"):
                yield document


def held_out(file_name: str, index: int, fraction: float) -> bool:
    """Whether document `index` of `file_name` is in the held-out `fraction`."""
    digest = hashlib.blake2b(f"{file_name}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") < fraction * 2**64


@dataclasses.dataclass(frozen=True)
class TextFiles:
    """Text files of your own (see the module docstring). Paths are a path, a glob, a
    directory, or a tuple of those; relative ones are relative to the working directory."""

    train: str | tuple[str, ...] = ""  # "": the files under --data_dir
    validation: str | tuple[str, ...] = ""  # separate validation files
    validation_fraction: float = 0.0  # or: this share of the training documents, held out
    tokenizer_path: str = ""  # a .model or tokenizer.json; "": --vocab_path
    text_field: str = ""  # jsonl key, parquet/Arrow column; "": TEXT_FIELD's (default "text")
    txt_documents: str = "file"  # .txt: "file" or "blank_line"
    lambada_dir: str = ""  # LAMBADA_EVAL: a directory with lambada/; "": --data_dir

    def __post_init__(self):
        for name in ("train", "validation"):  # lists as tuples: the dataset stays hashable
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if not 0.0 <= self.validation_fraction < 1.0:
            raise UserError(f"TextFiles(validation_fraction={self.validation_fraction}) must "
                            f"be in [0, 1), e.g. 0.01")
        if self.validation and self.validation_fraction:
            raise UserError("TextFiles: give validation files or a validation_fraction, not "
                            "both")
        TextFormat(self.text_field or "text", self.txt_documents)  # checks both now, in one line

    # VALIDATION_FILES, VALIDATION_FRACTION and TEXT_FIELD (core.data.DataSettings) apply here.
    takes_validation = True
    takes_text_field = True

    def _validation(self, settings: DataSettings) -> tuple[str | tuple[str, ...], float]:
        """(validation files, held-out fraction): this dataset's own, else the settings'."""
        if self.validation or self.validation_fraction:
            return self.validation, self.validation_fraction
        return settings.validation_files or "", settings.validation_fraction

    def _text_field(self, settings: DataSettings) -> str:
        """The key or column of the text: this dataset's own, else TEXT_FIELD."""
        if not self.text_field:
            return settings.text_field
        if settings.text_field not in ("text", self.text_field):
            raise UserError(f"TEXT_FIELD={settings.text_field!r}, but the experiment's "
                            f"TextFiles(text_field={self.text_field!r}) names its own; set one "
                            f"of them")
        return self.text_field

    @functools.cache  # noqa: B019  (frozen, hashable instances: one set of nodes each)
    def _formats(self, settings: DataSettings):
        """(training format, validation format) nodes, both of the one text field: a single
        node read by training and validation alike, unless a held-out fraction splits the
        documents between them."""
        field, fraction = self._text_field(settings), self._validation(settings)[1]
        if not fraction:
            shared = fdl.Config(TextFormat, field, self.txt_documents)
            return shared, shared
        return tuple(fdl.Config(HeldOutFormat, field, self.txt_documents,
                                validation_fraction=fraction, keep=keep)
                     for keep in ("train", "validation"))

    @functools.cache  # noqa: B019  (frozen, hashable instances: one set of nodes each)
    def _nodes(self, settings: DataSettings):
        """(train files, tokenizer) nodes, shared by every input so each is built once."""
        train = self.train or fdl.Config(required_data_dir, settings.data_dir, "text")
        return (fdl.Config(expand_files, train),
                tokenizer_node(settings, self.tokenizer_path or settings.vocab_path))

    def train_input(self, settings: DataSettings):
        files, tokenizer = self._nodes(settings)
        return fdl.Partial(text_train_input, files=files, vocab=tokenizer,
                           seq_len=settings.seq_len, seed=settings.seed, packed=settings.packed,
                           max_segments=settings.max_segments, cache_dir=settings.cache_dir,
                           text_format=self._formats(settings)[0])

    def evaluations(self, settings: DataSettings):
        files, tokenizer = self._nodes(settings)
        validation, fraction = self._validation(settings)
        evals = []
        if settings.eval_batches and (validation or fraction):
            if validation:
                files = fdl.Config(expand_files, validation)
            evals.append(fdl.Config(
                evaluations.TokenLossEval, name="validation",
                make_input=fdl.Partial(text_eval_input, files=files, vocab=tokenizer,
                                       seq_len=settings.seq_len,
                                       num_batches=settings.eval_batches,
                                       max_segments=settings.max_segments,
                                       text_format=self._formats(settings)[1])))
        if settings.lambada_eval:
            data_dir = self.lambada_dir or fdl.Config(required_data_dir, settings.data_dir)
            evals.append(lambada_evaluation(settings, data_dir, tokenizer,
                                            settings.lambada_max_examples))
        return evals

    def tokenizer(self, settings: DataSettings):
        return self._nodes(settings)[1]


def text_train_input(*, files, vocab, seq_len, seed, packed, cache_dir, text_format,
                     global_batch_size, process_rows, max_segments=0):
    return PileTrainInput(files, vocab, seq_len, global_batch_size, process_rows, seed,
                          packed=packed, cache_dir=cache_dir, text_format=text_format,
                          max_segments=max_segments)


def text_eval_input(*, files, vocab, seq_len, num_batches, text_format, global_batch_size,
                    process_rows, max_segments=0):
    return PileEvalInput(files, vocab, seq_len, global_batch_size, num_batches, process_rows,
                         text_format=text_format, max_segments=max_segments)
