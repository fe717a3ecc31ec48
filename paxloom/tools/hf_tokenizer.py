"""A SentencePiece BPE model as Hugging Face tokenizer files that encode exactly as it does.

transformers' own conversion of a SentencePiece file (e.g. LlamaTokenizer from
tokenizer.model) ignores the model's normalizer: it keeps tabs, newlines and runs of
spaces that SentencePiece's nmt_nfkc normalization and remove_extra_whitespaces turned
into single spaces in training, so the same text would give other ids than the model
was trained on. The `tokenizer.json` written here reproduces the normalizer (the model's
own precompiled character map, then SentencePiece's whitespace handling), splits on
the whitespace marker as SentencePiece BPE never merges across it, and lists merges in
the order SentencePiece applies them (by the merged piece's rank). Written as plain JSON
in the `tokenizers` library's format (version 1.0), so exporting needs no Hugging Face
package; tests/test_export_hf.py checks ids and text against SentencePiece on real text.

Every encoding starts with the token every training document starts with (`start_id`,
paxloom/core/framing.py): EOS, which plays BOS in Pax's framing, or the BOS under ADD_BOS.
One difference remains, as in every Hugging Face tokenizer: text that spells a special
piece ("</s>") becomes that piece, where SentencePiece spells it out.

A run trained with a Hugging Face tokenizer.json needs no conversion: `copy` writes that
file itself, its post-processor kept when it already puts exactly that token first (a
Llama 3 tokenizer trained with its BOS), else replaced by that start-first template; and
the tokenizer_config.json beside it, when there is one, with what the run decided (BOS,
EOS, the tokenizer class that reads the file as it is) set over it.
"""

import base64
import json
from pathlib import Path

from sentencepiece import sentencepiece_model_pb2

from paxloom.core.errors import UserError

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _BYTE = 1, 2, 3, 4, 6
_BPE = 2  # TrainerSpec.model_type
_WHITESPACE = "\u2581"  # SentencePiece's visible space
# tokenizer_config.json keys the run decides, not the file it was trained with: a class
# that reads tokenizer.json as it is (transformers' PreTrainedTokenizerFast), and its BOS
# and EOS; add_bos_token and add_eos_token would make transformers rebuild the template.
_RUN_DECIDES = ("tokenizer_class", "bos_token", "eos_token", "add_bos_token", "add_eos_token")


def write(model_file: Path, directory: Path, model_max_length: int,
          start_id: int | None = None) -> list[str]:
    """Write tokenizer.model (the SentencePiece file itself), tokenizer.json and
    tokenizer_config.json into `directory`; return their names. Encodings start with piece
    `start_id` (the run's Framing.start_id; default the EOS, Pax's framing)."""
    proto_bytes = Path(model_file).read_bytes()
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(proto_bytes)
    _check(proto, model_file)
    pieces = [p.piece for p in proto.pieces]
    eos = pieces[proto.trainer_spec.eos_id]
    start_id = proto.trainer_spec.eos_id if start_id is None else start_id
    (directory / "tokenizer.model").write_bytes(proto_bytes)
    (directory / "tokenizer.json").write_text(
        json.dumps(_tokenizer_json(proto, pieces[start_id], start_id), ensure_ascii=False),
        encoding="utf-8")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": pieces[start_id],  # every training document starts with it
        "eos_token": eos,
        "unk_token": pieces[proto.trainer_spec.unk_id],
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
    }
    if proto.trainer_spec.pad_id >= 0:
        config["pad_token"] = pieces[proto.trainer_spec.pad_id]
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return ["tokenizer.model", "tokenizer.json", "tokenizer_config.json"]


def copy(tokenizer_file: Path, directory: Path, *, eos_id: int, model_max_length: int,
         pad_id: int | None = None, start_id: int | None = None,
         keep_template: bool = False) -> list[str]:
    """Write the run's own Hugging Face tokenizer.json into `directory` and a
    tokenizer_config.json naming its special tokens; return their names. Encodings start
    with `start_id` (the run's Framing.start_id; default the EOS, Pax's framing): the
    file's own post-processor when `keep_template` (it already does exactly that), else a
    template that does. The tokenizer_config.json beside the file, when there is one, is
    written back with the run's BOS, EOS and class over it (its pad token, chat template,
    model_max_length and the rest stay its own); without one, `pad_id`'s token is the pad."""
    path = Path(tokenizer_file)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        model = data["model"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"tokenizer {path} is not a readable Hugging Face tokenizer.json "
                        f"({type(error).__name__}: {error})") from None
    start_id = eos_id if start_id is None else start_id
    eos, start = _token(data, eos_id), _token(data, start_id)
    if eos is None:
        raise UserError(f"tokenizer {path} has no token with the EOS id {eos_id}")
    if start is None:
        raise UserError(f"tokenizer {path} has no token with the BOS id {start_id}")
    if not keep_template:
        processor = _start_first(start, start_id)
        original = data.get("post_processor")
        if isinstance(original, dict) and original.get("type") == "ByteLevel":
            # It only adjusts offsets (ids are the model's): keep it, before the template.
            processor = {"type": "Sequence", "processors": [original, processor]}
        data["post_processor"] = processor
    (directory / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False),
                                              encoding="utf-8")
    own = _own_config(path)
    config = {key: value for key, value in (own or {}).items() if key not in _RUN_DECIDES}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": start,  # every training document starts with it
        "eos_token": eos,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        **config,
    }
    unk = model.get("unk_token") if isinstance(model, dict) else None
    if isinstance(unk, str):
        config.setdefault("unk_token", unk)
    pad = None if pad_id is None or own is not None else _token(data, pad_id)
    if pad is not None:
        config["pad_token"] = pad
    (directory / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return ["tokenizer.json", "tokenizer_config.json"]


def _own_config(tokenizer_file: Path) -> dict | None:
    """The tokenizer_config.json beside `tokenizer_file` (as tasks/tokenizer.py reads its
    EOS from it), or None when there is none."""
    path = tokenizer_file.parent / "tokenizer_config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UserError(f"{path} is not readable JSON ({type(error).__name__}: {error}); fix "
                        f"or remove it") from None
    return config if isinstance(config, dict) else None


def _token(data: dict, token_id: int) -> str | None:
    """The text of token `token_id` in tokenizer.json `data`: an added token's, or the
    model's vocabulary entry (a {token: id} map, or Unigram's [[token, score], ...])."""
    for added in data.get("added_tokens") or []:
        if added.get("id") == token_id:
            return added.get("content")
    vocab = data["model"].get("vocab")
    if isinstance(vocab, dict):
        return next((token for token, i in vocab.items() if i == token_id), None)
    if isinstance(vocab, list) and 0 <= token_id < len(vocab):
        return vocab[token_id][0]
    return None


def _start_first(start: str, start_id: int) -> dict:
    """The post-processor putting `start` (EOS, or the BOS) first, as in training; a pair
    is two documents of the packed stream."""
    bos = {"SpecialToken": {"id": start, "type_id": 0}}
    return {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos,
                 {"Sequence": {"id": "B", "type_id": 0}}],
        "special_tokens": {start: {"id": start, "ids": [start_id], "tokens": [start]}},
    }


def _check(proto, model_file) -> None:
    """UserError for SentencePiece settings this file cannot reproduce."""
    trainer, normalizer = proto.trainer_spec, proto.normalizer_spec
    problems = []
    if trainer.model_type != _BPE:
        problems.append("it is not a BPE model")
    if not trainer.split_by_whitespace or trainer.treat_whitespace_as_suffix:
        problems.append("its pieces may span or end in whitespace")
    if not (normalizer.add_dummy_prefix and normalizer.escape_whitespaces):
        problems.append("it does not mark whitespace as SentencePiece usually does")
    if trainer.eos_id < 0:
        problems.append("it has no EOS")
    if problems:
        raise UserError(f"vocabulary {model_file}: cannot write a Hugging Face tokenizer "
                        f"that encodes exactly like it: {'; '.join(problems)}")


def _merges(proto) -> list[list[str]]:
    """BPE merges, in SentencePiece's order: a pair whose merged piece ranks higher (a
    lower id; ids follow scores) merges first."""
    normal = {p.piece: i for i, p in enumerate(proto.pieces) if p.type == _NORMAL}
    found = []
    for piece, piece_id in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                found.append((piece_id, normal[left], normal[right], left, right))
    return [[left, right] for *_, left, right in sorted(found)]


def _tokenizer_json(proto, start: str, start_id: int) -> dict:
    pieces = list(proto.pieces)
    special = [{"id": i, "content": p.piece, "single_word": False, "lstrip": False,
                "rstrip": False, "normalized": False, "special": p.type != _USER_DEFINED}
               for i, p in enumerate(pieces) if p.type in (_UNKNOWN, _CONTROL, _USER_DEFINED)]
    normalizers = []
    if proto.normalizer_spec.precompiled_charsmap:  # the model's own normalization table
        charsmap = base64.b64encode(proto.normalizer_spec.precompiled_charsmap).decode()
        normalizers.append({"type": "Precompiled", "precompiled_charsmap": charsmap})
    if proto.normalizer_spec.remove_extra_whitespaces:
        normalizers += [{"type": "Strip", "strip_left": True, "strip_right": True},
                        {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": {"type": "Metaspace", "replacement": _WHITESPACE,
                          "prepend_scheme": "always", "split": True},
        "post_processor": _start_first(start, start_id),
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": _WHITESPACE}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},  # the dummy prefix
        ]},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": pieces[proto.trainer_spec.unk_id].piece,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": proto.trainer_spec.byte_fallback,
            "ignore_merges": False,
            "vocab": {p.piece: i for i, p in enumerate(pieces)},
            "merges": _merges(proto),
        },
    }
