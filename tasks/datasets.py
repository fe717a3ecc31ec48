"""Datasets registered by name: what `DATASET=` names on the command line.

A dataset implements core.data.Dataset: given the run's DataSettings it returns the
Fiddle nodes of its train input, its evaluations and its tokenizer, which the run graph
records. The built-in ones are registered here; a user registers their own the same way,
in their own module, or returns an instance from their experiment's `dataset()` method
without registering it:

    @datasets.register("my_corpus")
    @dataclasses.dataclass(frozen=True)
    class MyCorpus:
        def train_input(self, settings): return fdl.Partial(MyTrainInput, ...)
        def evaluations(self, settings): return []
        def tokenizer(self, settings): return None

Datasets are frozen dataclasses: hashable, so each builds its nodes once per settings and
every consumer shares them (the tokenizer is loaded and checked once), and a
`--fdl.DATASET` name resolves to a fresh instance with the defaults.
"""

import dataclasses
import functools

import fiddle as fdl

from paxloom.core.data import DataSettings
from paxloom.core.errors import UserError, near_matches
from tasks import evaluations, layout, sample_corpus, synthetic
from tasks.boolq import BoolQ
from tasks.input_pipeline import PileEvalInput, PileTrainInput
from tasks.nodes import check_files, lambada_evaluation, required_data_dir, tokenizer_node
from tasks.text import TextFiles
from tasks.text_formats import TextFormat

_REGISTRY: dict[str, type] = {}


def register(name: str):
    """Class decorator: `DATASET="name"` (and --fdl.DATASET) builds this class's defaults."""

    def add(cls):
        _REGISTRY[name] = cls
        return cls

    return add


def registered() -> list[str]:
    return sorted(_REGISTRY)


def lookup(name: str):
    """The registered dataset `name`, with its defaults; a one-line error with the near match."""
    if name not in _REGISTRY:
        raise UserError(f"DATASET={name!r} is not a registered dataset (registered: "
                        f"{', '.join(registered())}){near_matches(name, _REGISTRY)}")
    return _REGISTRY[name]()


# ----- synthetic -------------------------------------------------------------------------


@register("synthetic")
@dataclasses.dataclass(frozen=True)
class Synthetic:
    """Generated token ids with learnable structure (tasks/synthetic.py). Its tokenizer is
    --vocab_path's when one is given (so --mode=decode and export can read and write text
    for a model trained on ids), else none: prompts and outputs are ids."""

    def train_input(self, settings: DataSettings):
        return fdl.Partial(synthetic.SyntheticTrainInput, seq_len=settings.seq_len,
                           vocab_size=settings.vocab_size, seed=settings.seed)

    def evaluations(self, settings: DataSettings):
        if settings.lambada_eval:
            raise UserError("LAMBADA_EVAL=True needs text data: set --fdl.DATASET=\"pile\" "
                            "(with --data_dir) or \"sample\"")
        if not settings.eval_batches:
            return []
        return [fdl.Config(
            evaluations.TokenLossEval, name="synthetic_eval",
            make_input=fdl.Partial(synthetic.SyntheticEvalInput, seq_len=settings.seq_len,
                                   vocab_size=settings.vocab_size,
                                   num_batches=settings.eval_batches,
                                   # A seed of its own: evaluation never sees training rows.
                                   seed=settings.seed + 1_000_003))]

    def tokenizer(self, settings: DataSettings):
        if not settings.vocab_path:
            return None
        return tokenizer_node(settings, settings.vocab_path)


# ----- The Pile layout: pile/ and lambada/ under a directory ------------------------------


@dataclasses.dataclass(frozen=True)
class _PileLayout:
    """Text in The Pile's layout (tasks/layout.py: jsonl.zst or Pax's TFDS shards), with
    Lambada beside it, tokenized by a SentencePiece model."""

    train: bool = True  # False: Lambada only (an evaluation-only experiment)
    # TEXT_FIELD: the key of the jsonl files' text (Pax's TFDS shards have their 'text').
    takes_text_field = True

    def _data_dir(self, settings: DataSettings):
        return fdl.Config(required_data_dir, settings.data_dir)

    def _vocab_path(self, settings: DataSettings):
        return settings.vocab_path

    def train_input(self, settings: DataSettings):
        if not self.train:
            return None
        return fdl.Partial(pile_train_input, data_dir=self._nodes(settings)[0],
                           vocab=self.tokenizer(settings), seq_len=settings.seq_len,
                           seed=settings.seed, packed=settings.packed,
                           max_segments=settings.max_segments, cache_dir=settings.cache_dir,
                           **self._text_format(settings))

    def evaluations(self, settings: DataSettings):
        data_dir, vocab = self._nodes(settings)
        evals = []
        if self.train and settings.eval_batches:
            evals.append(fdl.Config(
                evaluations.TokenLossEval, name="pile_val",
                make_input=fdl.Partial(pile_eval_input, data_dir=data_dir, vocab=vocab,
                                       seq_len=settings.seq_len,
                                       num_batches=settings.eval_batches,
                                       max_segments=settings.max_segments,
                                       **self._text_format(settings))))
        if settings.lambada_eval:
            evals.append(lambada_evaluation(settings, data_dir, vocab,
                                            settings.lambada_max_examples))
        if not self.train and not evals:
            raise UserError("DATASET='none' needs LAMBADA_EVAL=True (an evaluation-only "
                            "experiment)")
        return evals

    def tokenizer(self, settings: DataSettings):
        return self._nodes(settings)[1]

    @functools.cache  # noqa: B019  (frozen, hashable instances: one set of nodes each)
    def _text_format(self, settings: DataSettings) -> dict:
        """{"text_format": node} of a TEXT_FIELD other than 'text', one node for training and
        Pile validation alike; {} for The Pile's own key (its graph as it always was)."""
        if settings.text_field == "text":
            return {}
        return {"text_format": fdl.Config(TextFormat, settings.text_field)}

    @functools.cache  # noqa: B019  (frozen, hashable instances: one set of nodes each)
    def _nodes(self, settings: DataSettings):
        """(data_dir, vocabulary) nodes, shared by every input so each is built once."""
        return self._data_dir(settings), tokenizer_node(settings, self._vocab_path(settings))


@register("pile")
@dataclasses.dataclass(frozen=True)
class Pile(_PileLayout):
    """The Pile under --data_dir (scripts_gpu/download_the_pile.py, or Pax's TFDS build),
    with --vocab_path's SentencePiece model, as the Pax GPU configs train."""


@register("none")
@dataclasses.dataclass(frozen=True)
class LambadaOnly(_PileLayout):
    """No training data: Lambada under --data_dir, for evaluation-only experiments."""

    train: bool = False
    takes_text_field = False


@register("sample")
@dataclasses.dataclass(frozen=True)
class Sample(_PileLayout):
    """The built-in sample corpus: Python's own documentation in The Pile's layout, with a
    SentencePiece model trained on it, built on first use (tasks/sample_corpus.py)."""

    takes_text_field = False  # the corpus is built with The Pile's 'text'

    def _data_dir(self, settings: DataSettings):
        return fdl.Config(sample_data_dir)

    def _vocab_path(self, settings: DataSettings):
        return fdl.Config(sample_vocab_path)


def sample_data_dir() -> str:
    """The built-in sample corpus (Python's own docs in Pile format), built on first use."""
    return str(sample_corpus.ensure_sample_data()[0])


def sample_vocab_path() -> str:
    return str(sample_corpus.ensure_sample_data()[1])


def pile_train_input(*, data_dir, vocab, seq_len, seed, packed, global_batch_size, process_rows,
                     cache_dir=None, max_segments=0, text_format=None):
    return PileTrainInput(layout.pile_train_files(data_dir), vocab, seq_len, global_batch_size,
                          process_rows, seed, packed=packed, cache_dir=cache_dir,
                          max_segments=max_segments, text_format=text_format or TextFormat())


def pile_eval_input(*, data_dir, vocab, seq_len, num_batches, global_batch_size, process_rows,
                    max_segments=0, text_format=None):
    return PileEvalInput(layout.pile_val_files(data_dir), vocab, seq_len, global_batch_size,
                         num_batches, process_rows, max_segments=max_segments,
                         text_format=text_format or TextFormat())


# Checked before the first step (paxloom/core/data.py), not when first read.
pile_train_input.check = lambda *, data_dir, **_: layout.pile_train_files(data_dir)
pile_eval_input.check = lambda *, data_dir, **_: check_files(
    layout.pile_val_files, data_dir, "--fdl.EVAL_BATCHES=0 (or --noeval_on_test when "
    "training) runs without the Pile validation evaluation")


register("text")(TextFiles)  # tasks/text.py: your own files
register("boolq")(BoolQ)  # tasks/boolq.py: BoolQ yes/no questions, as Pax's Llama experiments
