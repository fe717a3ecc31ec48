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

Every encoding starts with EOS, as every training document does (it plays BOS,
tasks/packing.py). One difference remains, as in every Hugging Face tokenizer: text that
spells a special piece ("</s>") becomes that piece, where SentencePiece spells it out.

A run trained with a Hugging Face tokenizer.json needs no conversion: `copy` writes that
file itself, with only its post-processor replaced by the same EOS-first template.
"""

import base64
import json
from pathlib import Path

from sentencepiece import sentencepiece_model_pb2

from paxloom.core.errors import UserError

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _BYTE = 1, 2, 3, 4, 6
_BPE = 2  # TrainerSpec.model_type
_WHITESPACE = "\u2581"  # SentencePiece's visible space


def write(model_file: Path, directory: Path, model_max_length: int) -> list[str]:
    """Write tokenizer.model (the SentencePiece file itself), tokenizer.json and
    tokenizer_config.json into `directory`; return their names."""
    proto_bytes = Path(model_file).read_bytes()
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(proto_bytes)
    _check(proto, model_file)
    pieces = [p.piece for p in proto.pieces]
    eos = pieces[proto.trainer_spec.eos_id]
    (directory / "tokenizer.model").write_bytes(proto_bytes)
    (directory / "tokenizer.json").write_text(
        json.dumps(_tokenizer_json(proto, eos), ensure_ascii=False), encoding="utf-8")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": eos,  # training puts EOS before every document
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
         pad_id: int | None = None) -> list[str]:
    """Write the run's own Hugging Face tokenizer.json into `directory` (its post-processor
    replaced: encodings start with EOS, as training documents do) and tokenizer_config.json
    naming its special tokens; return their names."""
    path = Path(tokenizer_file)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        model = data["model"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"tokenizer {path} is not a readable Hugging Face tokenizer.json "
                        f"({type(error).__name__}: {error})") from None
    eos = _token(data, eos_id)
    if eos is None:
        raise UserError(f"tokenizer {path} has no token with the EOS id {eos_id}")
    processor = _eos_first(eos, eos_id)
    original = data.get("post_processor")
    if isinstance(original, dict) and original.get("type") == "ByteLevel":
        # It only adjusts offsets (ids are the model's): keep it, before the template.
        processor = {"type": "Sequence", "processors": [original, processor]}
    data["post_processor"] = processor
    (directory / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False),
                                              encoding="utf-8")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": eos,  # training puts EOS before every document
        "eos_token": eos,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
    }
    unk = model.get("unk_token") if isinstance(model, dict) else None
    if isinstance(unk, str):
        config["unk_token"] = unk
    pad = None if pad_id is None else _token(data, pad_id)
    if pad is not None:
        config["pad_token"] = pad
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return ["tokenizer.json", "tokenizer_config.json"]


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


def _eos_first(eos: str, eos_id: int) -> dict:
    """The post-processor putting EOS first, as in training; a pair is two documents of
    the packed stream."""
    bos = {"SpecialToken": {"id": eos, "type_id": 0}}
    return {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos,
                 {"Sequence": {"id": "B", "type_id": 0}}],
        "special_tokens": {eos: {"id": eos, "ids": [eos_id], "tokens": [eos]}},
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


def _tokenizer_json(proto, eos: str) -> dict:
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
        "post_processor": _eos_first(eos, proto.trainer_spec.eos_id),
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
