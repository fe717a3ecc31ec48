"""SentencePiece vocabulary: loading, encoding, and the VOCAB_SIZE check (for any tokenizer:
Hugging Face tokenizer.json files are loaded by tasks/tokenizer.py, with the same ids).

Ids used by the data layer:
- `eos_id` is the model's EOS piece. It ends every document in the packed token
  stream and, as an input token, starts the next document's segment (it plays BOS),
  unless ADD_BOS=True puts the model's BOS piece before every document
  (paxloom/core/framing.py; a SentencePiece model adds none by default, as Pax's).
- `pad_id` is always 0 in batches. Padded positions carry weight 0 and segment id
  0, so the value is never trained on; 0 is SentencePiece's (and T5/C4's) usual pad
  id, and models trained with `python -m tasks.train_vocab` reserve it for <pad>.
"""

import hashlib
from pathlib import Path

import sentencepiece as spm

from paxloom.core import framing as framings
from paxloom.core.errors import UserError

PAD_ID = 0
# Embedding tables padded to a multiple of this run faster on GPUs (tensor cores).
VOCAB_SIZE_MULTIPLE = 128


class Vocabulary:
    """A loaded SentencePiece model, framing documents as ADD_BOS (`add_bos`; None: no BOS,
    as Pax) and ADD_EOS say (`framing`). Picklable (it pickles as its bytes)."""

    def __init__(self, path, model_proto: bytes, add_bos: bool | None = None,
                 add_eos: bool = True):
        self.path = Path(path)
        self._proto = model_proto
        self._sp = spm.SentencePieceProcessor()
        self._sp.LoadFromSerializedProto(model_proto)
        self.sha256 = hashlib.sha256(model_proto).hexdigest()
        self._framing_args = (add_bos, add_eos)
        self.framing = None  # without an EOS (load_vocabulary refuses such a model)
        if self._sp.eos_id() >= 0:
            self.framing = framings.resolve(
                str(self.path), eos_id=self.eos_id, bos_id=self.bos_id, template_bos=False,
                add_bos=add_bos, add_eos=add_eos)

    def __reduce__(self):
        # Worker processes reload from the bytes, so they see exactly this model
        # even if the file is replaced meanwhile.
        return (Vocabulary, (self.path, self._proto, *self._framing_args))

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def eos_id(self) -> int:
        return self._sp.eos_id()

    @property
    def bos_id(self) -> int | None:
        """The model's BOS piece (LLaMA's <s>), or None (Pax's models have none)."""
        return self._sp.bos_id() if self._sp.bos_id() >= 0 else None

    @property
    def pad_id(self) -> int:
        return PAD_ID

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: list[str], num_threads: int = 1) -> list[list[int]]:
        """Encode many texts in one call; SentencePiece does the loop in C++."""
        return self._sp.encode(texts, num_threads=num_threads)

    def decode(self, ids) -> str:
        return self._sp.decode([int(i) for i in ids])

    def __repr__(self):
        return f"Vocabulary({str(self.path)!r}, vocab_size={self.vocab_size})"


def load_vocabulary(path, add_bos: bool | None = None, add_eos: bool = True) -> Vocabulary:
    """Load a SentencePiece `.model` file, framing documents as `add_bos` and `add_eos`
    say (ADD_BOS, ADD_EOS); UserError if it is missing or not a model."""
    hint = "set VOCAB_PATH / --vocab_path to a SentencePiece .model file"
    if not path:
        raise UserError(f"no vocabulary given; {hint}")
    path = Path(path)
    if path.is_dir():
        raise UserError(f"vocabulary {path} is a directory; {hint}")
    if not path.is_file():
        raise UserError(f"vocabulary {path} does not exist; {hint}")
    try:
        proto = path.read_bytes()
        vocab = Vocabulary(path, proto, add_bos, add_eos)
    except (OSError, RuntimeError) as e:
        raise UserError(
            f"vocabulary {path} is not a readable SentencePiece model "
            f"({' '.join(str(e).split())}); {hint}"
        ) from None
    if vocab.eos_id < 0:
        raise UserError(
            f"vocabulary {path} has no EOS piece, which packing needs to mark document ends; "
            "use a model trained with an eos_id (e.g. `python -m tasks.train_vocab`)"
        )
    return vocab


def round_vocab_size(n: int) -> int:
    """`n` rounded up to a multiple of VOCAB_SIZE_MULTIPLE."""
    return -(-n // VOCAB_SIZE_MULTIPLE) * VOCAB_SIZE_MULTIPLE


def check_vocab_size(vocab, vocab_size: int, weights_vocab: tuple[int, str] | None = None
                     ) -> None:
    """Raise UserError if the model's VOCAB_SIZE cannot hold every id of `vocab` (a Vocabulary
    or a tasks.tokenizer.HFTokenizer: anything with `path` and `vocab_size`).

    A larger VOCAB_SIZE is fine: the extra embedding rows are never looked up,
    and padding to a multiple of 128 is recommended for GPU speed. `weights_vocab`: (size,
    where it is read) when the starting weights fix the vocabulary (DataSettings): no
    VOCAB_SIZE then fits a tokenizer with more ids (experiments/base.py checks VOCAB_SIZE).
    """
    if weights_vocab is not None and vocab.vocab_size > weights_vocab[0]:
        size, where = weights_vocab
        raise UserError(
            f"{vocab.path} has {vocab.vocab_size} pieces, more than the starting weights' "
            f"vocabulary of {size} ids ({where}); use the tokenizer they were trained with "
            f"(--vocab_path)"
        )
    if vocab_size < vocab.vocab_size:
        raise UserError(
            f"VOCAB_SIZE={vocab_size} but {vocab.path} has {vocab.vocab_size} pieces; "
            f"set --fdl.VOCAB_SIZE={round_vocab_size(vocab.vocab_size)}"
        )
