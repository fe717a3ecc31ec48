"""What several datasets build into their graphs: the checked tokenizer, the required data
directory, and Lambada's evaluation (Pax's LAMBADA eval) over DIR/lambada."""

import os

import fiddle as fdl

from paxloom.core import errors
from paxloom.core.data import DataSettings, Tokenizer
from paxloom.core.errors import UserError
from tasks import evaluations, layout
from tasks.lambada import lambada_batches, read_lambada
from tasks.text_formats import is_glob
from tasks.tokenizer import load_tokenizer
from tasks.vocab import check_vocab_size


def vocabulary(*, vocab_path, vocab_size: int,
               weights_vocab: tuple[int, str] | None = None, add_bos: bool | None = None,
               add_eos: bool = True) -> Tokenizer:
    """The tokenizer at `vocab_path` (a SentencePiece .model or a tokenizer.json, chosen by
    the file), checked against the model's VOCAB_SIZE and the starting weights' vocabulary
    (DataSettings.weights_vocab), framing documents as ADD_BOS and ADD_EOS say."""
    tokenizer = load_tokenizer(vocab_path, add_bos, add_eos)
    check_vocab_size(tokenizer, vocab_size, weights_vocab)
    return tokenizer


def tokenizer_node(settings: DataSettings, vocab_path) -> fdl.Config:
    """The graph node of the tokenizer at `vocab_path` (a path or a node giving one) for a
    run with these settings: the one object every input, evaluation, decode and export of
    the run encodes with."""
    return fdl.Config(vocabulary, vocab_path=vocab_path, vocab_size=settings.vocab_size,
                      weights_vocab=settings.weights_vocab, add_bos=settings.add_bos,
                      add_eos=settings.add_eos)


def lambada_evaluation(settings: DataSettings, data_dir, tokenizer, max_examples: int):
    """Lambada's last-word accuracy (Pax's LAMBADA eval) over DIR/lambada, as a graph node."""
    return fdl.Config(
        evaluations.LambadaEval, name="lambada",
        make_input=fdl.Partial(LambadaEvalInput, data_dir=data_dir, vocab=tokenizer,
                               seq_len=settings.seq_len, max_examples=max_examples))


def required_data_dir(data_dir, dataset: str = "pile") -> str:
    """--data_dir, which `dataset` ("pile": The Pile's layout, "text": your own files) reads:
    a one-line error naming the flag when it is unset or names nothing."""
    if dataset == "text":
        what = "your data files (a directory, a file or a glob)"
    else:
        what = ("a directory with pile/ and lambada/ (python scripts_gpu/download_the_pile.py "
                "--data_dir DIR)")
    if not data_dir:
        raise UserError(f"DATASET={dataset!r} needs --data_dir (or --tfds_data_dir) naming "
                        f"{what}; --fdl.DATASET=\"sample\" trains on the built-in corpus")
    data_dir = str(data_dir)
    # Checked here, where the path is known to be the flag's: a file reader further on
    # could only say that some file is missing. A glob is left to the reader to expand.
    if not os.path.exists(os.path.expanduser(data_dir)) and not is_glob(data_dir):
        raise UserError(f"--data_dir={data_dir}: no such directory; point --data_dir at {what}")
    return data_dir


def check_files(find, data_dir, switch: str) -> None:
    """`find(data_dir)` (a tasks/layout.py lookup), its one-line error extended with
    `switch`: the flag that runs without these files."""
    try:
        find(data_dir)
    except UserError as error:
        raise UserError(f"{errors.message(error)}; or {switch}") from None


LAMBADA_OFF = "--fdl.LAMBADA_EVAL=False runs without the Lambada evaluation"


class LambadaEvalInput:
    """Lambada test passages as evaluation batches; `examples` keeps them for predictions."""

    def __init__(self, *, data_dir, vocab, seq_len, max_examples, global_batch_size,
                 process_rows):
        self.examples = [example for path in layout.lambada_files(data_dir)
                         for example in read_lambada(path)]
        if max_examples:
            self.examples = self.examples[:max_examples]
        self.vocab, self.seq_len = vocab, seq_len
        self.global_batch_size, self.process_rows = global_batch_size, process_rows

    @staticmethod
    def check(*, data_dir, **_) -> None:
        """The Lambada files exist (paxloom/core/data.py: checked before the first step)."""
        check_files(layout.lambada_files, data_dir, LAMBADA_OFF)

    def __iter__(self):
        return lambada_batches(self.examples, self.vocab, self.seq_len, self.global_batch_size,
                               self.process_rows)
