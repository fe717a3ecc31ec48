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

BOS and EOS: `encode` gives a text's own tokens; the tokens around a document are its
`framing` (paxloom/core/framing.py), which ADD_BOS and ADD_EOS decide when the tokenizer is
loaded: Pax's EOS after every document, that EOS starting the next document's segment (it
plays BOS), or a BOS before every document. So HFTokenizer encodes with
`add_special_tokens=False`, and ADD_BOS's default (None) is what the tokenizer.json's own
post-processor does: a BOS when it puts one first (Llama 3's `<|begin_of_text|>`), else
Pax's framing. Its EOS is the `eos_token` of a `tokenizer_config.json` beside the file
when there is one, else the first of EOS_CANDIDATES the vocabulary has; a tokenizer
without any is refused. Its BOS is the token its post-processor puts first, else that
file's `bos_token`. `decode` skips special tokens. Padding is id 0 (PAD_ID) in batches
whatever token 0 is: padded positions have weight 0 and are never trained on.
"""

import hashlib
import json
from pathlib import Path

from paxloom.core import framing as framings
from paxloom.core.errors import UserError
from tasks.vocab import PAD_ID, Vocabulary, load_vocabulary

# Tried in order when no tokenizer_config.json names the EOS token.
EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|eos|>")
_KINDS = "a SentencePiece .model file or a Hugging Face tokenizer.json (file or directory)"
# Encoded with and without the post-processor's special tokens, to see what it adds.
_TEMPLATE_PROBE = "Hello world"


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
    """A Hugging Face `tokenizers` tokenizer.json, framing documents as ADD_BOS (`add_bos`;
    None: as its post-processor does) and ADD_EOS say (`framing`). Picklable (it pickles as
    its bytes, its chosen EOS and BOS tokens and the framing's settings)."""

    def __init__(self, path, data: bytes, eos_token: str | None = None,
                 add_bos: bool | None = None, add_eos: bool = True,
                 bos_token: str | None = None):
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
        # What the post-processor adds around a text: ([ids before], [ids after]), or None
        # when its output does not hold the text's own ids in one piece.
        self.template = _template(self._tok)
        first = self.template[0][0] if self.template and self.template[0] else None
        template_bos = first is not None and first != self._eos
        if bos_token is None:
            bos_token = (self._tok.id_to_token(first) if template_bos
                         else _config_token(self.path, "bos_token"))
        bos = None if bos_token is None else self._tok.token_to_id(bos_token)
        self.bos_token = bos_token if bos is not None else None
        self._bos = None if bos is None else int(bos)
        self._framing_args = (add_bos, add_eos)
        self.framing = framings.resolve(str(self.path), eos_id=self._eos, bos_id=self._bos,
                                        template_bos=template_bos, add_bos=add_bos,
                                        add_eos=add_eos)

    def __reduce__(self):
        # Worker processes rebuild from the bytes, so they see exactly this tokenizer even
        # if the file (or tokenizer_config.json) is replaced meanwhile.
        return (HFTokenizer, (self.path, self._data, self.eos_token, *self._framing_args,
                              self.bos_token))

    @property
    def vocab_size(self) -> int:
        return self._size

    @property
    def eos_id(self) -> int:
        return self._eos

    @property
    def bos_id(self) -> int | None:
        return self._bos

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


def _template(tok) -> tuple[list[int], list[int]] | None:
    """(ids the post-processor puts before a text, ids after it), or None when its output
    does not hold the text's own ids in one piece."""
    plain = tok.encode(_TEMPLATE_PROBE, add_special_tokens=False).ids
    full = tok.encode(_TEMPLATE_PROBE, add_special_tokens=True).ids
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return full[:start], full[start + len(plain):]
    return None


def _config_token(path: Path, key: str) -> str | None:
    """The token `key` (eos_token, bos_token) of the tokenizer_config.json beside `path`."""
    config_path = path.parent / "tokenizer_config.json"
    if not config_path.is_file():
        return None
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{config_path} is not readable JSON ({_one_line(e)}); fix or remove "
                        "it") from None
    token = config.get(key) if isinstance(config, dict) else None
    if isinstance(token, dict):  # older files store an AddedToken: {"content": ...}
        token = token.get("content")
    return token if isinstance(token, str) and token else None


def _eos_token(path: Path, vocab: dict[str, int]) -> str:
    """The EOS token: tokenizer_config.json's eos_token, else the first EOS_CANDIDATES present."""
    token = _config_token(path, "eos_token")
    if token is not None:
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


def load_tokenizer(path, add_bos: bool | None = None, add_eos: bool = True
                   ) -> Vocabulary | HFTokenizer:
    """Load the tokenizer at `path` (see the module docstring), framing documents as
    `add_bos` and `add_eos` say (ADD_BOS, ADD_EOS); UserError when it cannot be."""
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
        return load_vocabulary(path, add_bos, add_eos)
    if kind != "json":
        raise UserError(f"tokenizer {path} is not {_KINDS}; {hint}")
    _tokenizers(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"tokenizer {path} is not readable ({e.strerror}); {hint}") from None
    return HFTokenizer(path, data, add_bos=add_bos, add_eos=add_eos)
