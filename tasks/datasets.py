"""Dataset factories that experiments name in their Fiddle graph.

Each is called once the mesh is known, with `global_batch_size` and this
process's `process_rows`, and returns a train input (next_batch / get_state /
set_state) or an iterable of evaluation batches. Where the data lives comes
from flags (`--data_dir`, `--vocab_path`), never from hyperparameters.
"""

from tasks import layout, sample_corpus
from tasks.errors import DataError
from tasks.input_pipeline import PileEvalInput, PileTrainInput
from tasks.lambada import lambada_batches, read_lambada
from tasks.vocab import Vocabulary, check_vocab_size, load_vocabulary


def vocabulary(*, vocab_path, vocab_size: int) -> Vocabulary:
    """The SentencePiece vocabulary, checked against the model's VOCAB_SIZE."""
    vocab = load_vocabulary(vocab_path)
    check_vocab_size(vocab, vocab_size)
    return vocab


def required_data_dir(data_dir) -> str:
    if not data_dir:
        raise DataError("DATASET='pile' needs --data_dir (or --tfds_data_dir) naming a directory "
                        "with pile/ and lambada/ (python scripts_gpu/download_the_pile.py "
                        "--data_dir DIR); --fdl.DATASET=\"sample\" trains on the built-in corpus")
    return str(data_dir)


def sample_data_dir() -> str:
    """The built-in sample corpus (Python's own docs in Pile format), built on first use."""
    return str(sample_corpus.ensure_sample_data()[0])


def sample_vocab_path() -> str:
    return str(sample_corpus.ensure_sample_data()[1])


def pile_train_input(*, data_dir, vocab, seq_len, seed, packed, global_batch_size, process_rows,
                     cache_dir=None):
    return PileTrainInput(layout.pile_train_files(data_dir), vocab, seq_len, global_batch_size,
                          process_rows, seed, packed=packed, cache_dir=cache_dir)


def pile_eval_input(*, data_dir, vocab, seq_len, num_batches, global_batch_size, process_rows):
    return PileEvalInput(layout.pile_val_files(data_dir), vocab, seq_len, global_batch_size,
                         num_batches, process_rows)


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

    def __iter__(self):
        return lambada_batches(self.examples, self.vocab, self.seq_len, self.global_batch_size,
                               self.process_rows)
