"""The tokenizer a run encodes text with: a SentencePiece model or a Hugging Face tokenizer.

`load_tokenizer(path)` chooses by the file it is given:

- a SentencePiece model (Pax's `.model`, or any name: Pax mounts it as /mnt/vocab) ->
  tasks.vocab.Vocabulary;
- a Hugging Face tokenizer JSON (a file of any name, or a directory holding
  `tokenizer.json`) -> HFTokenizer, through the `tokenizers` library (an optional
  dependency: the [text] extra, `pip install '.[text]'` in a clone).

Both have the core.data.Tokenizer methods and `path`, `sha256`, `vocab_size`,
`eos_id`, `pad_id`, and both pickle as their bytes, so prepare's worker processes see
exactly the loaded tokenizer.

BOS and EOS: the data layer never adds a BOS. It appends `eos_id` after every document,
and that EOS, as the input token, starts the next document's segment: it plays BOS (see
tasks/vocab.py and tasks/packing.py). So HFTokenizer encodes with
`add_special_tokens=False`: a tokenizer.json whose post-processor adds `<s>`/`[CLS]`/
`<|begin_of_text|>` (or an EOS) would otherwise put them inside every document. Its EOS
is the `eos_token` of a `tokenizer_config.json` beside the file when there is one, else
the first of EOS_CANDIDATES the vocabulary has; a tokenizer without any is refused.
`decode` skips special tokens. Padding is id 0 (PAD_ID) in batches whatever token 0 is:
padded positions have weight 0 and are never trained on.
"""

import hashlib
import json
from pathlib import Path

from paxloom.core.errors import UserError
from tasks.vocab import PAD_ID, Vocabulary, load_vocabulary

# Tried in order when no tokenizer_config.json names the EOS token.
EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|eos|>")
_KINDS = "a SentencePiece .model file or a Hugging Face tokenizer.json (file or directory)"


def _tokenizers(path):
    try:
        import tokenizers
    except ImportError:
        raise UserError(f"reading {path} needs the tokenizers package: pip install "
                        "tokenizers (or, in a Paxloom clone, pip install '.[text]')"
                        ) from None
    return tokenizers


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer.json. Picklable (it pickles as its bytes and
    its chosen EOS token)."""

    def __init__(self, path, data: bytes, eos_token: str | None = None):
        self.path = Path(path)
        self._data = data
        self.sha256 = hashlib.sha256(data).hexdigest()
        tokenizers = _tokenizers(self.path)
        try:
            self._tok = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
        except Exception as e:  # the Rust side raises a plain Exception
            raise UserError(f"tokenizer {self.path} is not a readable Hugging Face tokenizer.json "
                            f"({_one_line(e)}); give {_KINDS}") from None
        vocab = self._tok.get_vocab(with_added_tokens=True)
        # Ids are normally 0..n-1; the largest id + 1 keeps check_vocab_size safe otherwise.
        self._size = max(self._tok.get_vocab_size(with_added_tokens=True),
                         max(vocab.values(), default=-1) + 1)
        self.eos_token = eos_token if eos_token is not None else _eos_token(self.path, vocab)
        eos = self._tok.token_to_id(self.eos_token)
        if eos is None:
            raise UserError(f"tokenizer {self.path} has no token {self.eos_token!r} (its EOS); "
                            "add an EOS token to the tokenizer or fix eos_token in "
                            "tokenizer_config.json")
        self._eos = int(eos)

    def __reduce__(self):
        # Worker processes rebuild from the bytes, so they see exactly this tokenizer even
        # if the file (or tokenizer_config.json) is replaced meanwhile.
        return (HFTokenizer, (self.path, self._data, self.eos_token))

    @property
    def vocab_size(self) -> int:
        return self._size

    @property
    def eos_id(self) -> int:
        return self._eos

    @property
    def pad_id(self) -> int:
        return PAD_ID

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str], num_threads: int = 1) -> list[list[int]]:
        """Encode many texts. With num_threads > 1, in `tokenizers`' own thread pool (its size
        is RAYON_NUM_THREADS, default every CPU); with 1, in this thread only, so several
        prepare workers do not each start a pool."""
        if num_threads <= 1:
            return [self._tok.encode(t, add_special_tokens=False).ids for t in texts]
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings]

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def __repr__(self):
        return (f"HFTokenizer({str(self.path)!r}, vocab_size={self.vocab_size}, "
                f"eos={self.eos_token!r})")


def _eos_token(path: Path, vocab: dict[str, int]) -> str:
    """The EOS token: tokenizer_config.json's eos_token, else the first EOS_CANDIDATES present."""
    config_path = path.parent / "tokenizer_config.json"
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UserError(f"{config_path} is not readable JSON ({_one_line(e)}); fix or remove "
                            "it") from None
        token = config.get("eos_token") if isinstance(config, dict) else None
        if isinstance(token, dict):  # older files store an AddedToken: {"content": ...}
            token = token.get("content")
        if isinstance(token, str) and token:
            return token
    for token in EOS_CANDIDATES:
        if token in vocab:
            return token
    raise UserError(f"tokenizer {path} has no EOS token (none of {', '.join(EOS_CANDIDATES)}, "
                    "and no eos_token in a tokenizer_config.json beside it); add an EOS token "
                    "(e.g. </s> as a special token) to the tokenizer")


def _kind_of(path: Path) -> str | None:
    """"sentencepiece", "json" or None, by the file's first bytes, not its name: Pax's
    scripts mount the vocabulary as /mnt/vocab. A SentencePiece model is a ModelProto,
    whose serialized form starts with a length-delimited field (its pieces, then the trainer
    and normalizer specs: tags 0x0a, 0x12, 0x1a); a tokenizer.json is a JSON object."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if head.lstrip().startswith(b"{"):
        return "json"
    if head[:1] in (b"\x0a", b"\x12", b"\x1a"):
        return "sentencepiece"
    return None


def load_tokenizer(path) -> Vocabulary | HFTokenizer:
    """Load the tokenizer at `path` (see the module docstring); UserError when it cannot be."""
    hint = f"set VOCAB_PATH / --vocab_path to {_KINDS}"
    if not path:
        raise UserError(f"no vocabulary given; {hint}")
    path = Path(path)
    if path.is_dir():
        if not (path / "tokenizer.json").is_file():
            raise UserError(f"tokenizer directory {path} holds no tokenizer.json; {hint}")
        path = path / "tokenizer.json"
    if not path.is_file():
        raise UserError(f"tokenizer {path} does not exist; {hint}")
    kind = _kind_of(path)
    if kind == "sentencepiece":
        return load_vocabulary(path)
    if kind != "json":
        raise UserError(f"tokenizer {path} is not {_KINDS}; {hint}")
    _tokenizers(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"tokenizer {path} is not readable ({e.strerror}); {hint}") from None
    return HFTokenizer(path, data)
