"""A small corpus in the real layout, built offline from text every Python install has.

`ensure_sample_data()` returns (data_dir, vocab_path) for a directory laid out
like the real data (tasks/layout.py):

    pile/train/00.jsonl.zst .. 03.jsonl.zst   Python's own documentation, Pile format
    pile/val.jsonl.zst                        held-out documents
    lambada/lambada_test.jsonl                Lambada-style passages from held-out text
    sample_spm.model                          SentencePiece BPE, 1024 pieces, byte fallback

The text is the English reference topics shipped in `pydoc_data.topics` (what
`help("if")` prints, ~0.5 MB) plus docstrings of a fixed list of stdlib modules.
Lambada's passages end in a word that a reader can guess from the passage; ours
end in a word that already occurred earlier in the passage, which keeps that
spirit (a model that learns to copy from context scores well). Everything is
deterministic for a given Python and library version, and the directory appears
atomically (built under a temporary name, then renamed), so concurrent callers
and interrupted builds are safe. Building takes a few seconds.
"""

import hashlib
import inspect
import json
import os
import random
import re
import shutil
import sys
import zlib
from pathlib import Path

import sentencepiece
import zstandard

from paxloom.core.user_cache import user_cache_dir
from tasks.train_vocab import train_sentencepiece

SAMPLE_VERSION = 2
VOCAB_SIZE = 1024
NUM_TRAIN_SHARDS = 4
HELD_OUT_PERCENT = 18
# Lambada passage shape: a window of up to this many words ending in a repeated word.
PASSAGE_WORDS = (20, 60)
MAX_LAMBADA = 500
_DOCSTRING_MODULES = (
    "abc argparse ast asyncio base64 bisect calendar cmd codecs collections configparser contextlib "
    "copy csv dataclasses datetime decimal difflib email enum fileinput fnmatch fractions ftplib "
    "functools getopt gettext glob gzip hashlib heapq hmac html http.client http.server imaplib "
    "inspect io ipaddress itertools json logging mailbox mimetypes numbers operator optparse os "
    "pathlib pickle pkgutil platform plistlib poplib pprint queue quopri random re sched secrets "
    "selectors shelve shlex shutil smtplib socket socketserver sqlite3 statistics string struct "
    "subprocess tarfile tempfile textwrap threading timeit tokenize traceback types typing "
    "unittest urllib.parse urllib.request uuid warnings weakref xml.dom.minidom zipfile"
).split()


def default_cache_dir() -> Path:
    return user_cache_dir("sample_data")


def _documents() -> list[tuple[str, str, str]]:
    """(name, source, text) of every document, in a fixed order."""
    from pydoc_data.topics import topics

    docs = [(f"topic:{name}", "PyDocTopics", topics[name].strip()) for name in sorted(topics)]
    import importlib

    for module_name in _DOCSTRING_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # e.g. sqlite3 on a Python built without it
            continue
        members = [(module_name, module)] + sorted(
            (f"{module_name}.{n}", m)
            for n, m in vars(module).items()
            if not n.startswith("_")
            and (inspect.isclass(m) or inspect.isfunction(m))
            and getattr(m, "__module__", None) == module.__name__
        )
        for name, obj in members:
            doc = inspect.getdoc(obj)
            if doc and len(doc) >= 200:
                docs.append((f"doc:{name}", "PyDocstrings", doc.strip()))
    # The same docstring shows up under several names (aliases, re-exports); a
    # document must not be in train and val at once.
    seen = set()
    unique = []
    for name, source, text in docs:
        if text not in seen:
            seen.add(text)
            unique.append((name, source, text))
    return unique


def _held_out(name: str) -> bool:
    return zlib.crc32(name.encode()) % 100 < HELD_OUT_PERCENT


def _lambada_passages(texts: list[str]) -> list[str]:
    """Passages that end in a word (4+ letters) which occurred earlier in the passage."""
    passages = []
    for text in texts:
        words = text.split()
        last_end = 0
        for p in range(len(words)):
            start = max(last_end, p - PASSAGE_WORDS[1] + 1)
            if p - start + 1 < PASSAGE_WORDS[0]:
                continue
            word = words[p]
            if not re.fullmatch(r"[A-Za-z]{4,}", word) or word not in words[start:p]:
                continue
            passages.append(" ".join(words[start : p + 1]))
            last_end = p + 1
    return passages[:MAX_LAMBADA]


def _write_jsonl_zst(path: Path, records: list[dict]) -> None:
    raw = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
    # Content checksum on, like the Pile's files, so corruption is detected.
    path.write_bytes(zstandard.ZstdCompressor(level=10, write_checksum=True).compress(raw))


def _build(out: Path) -> None:
    docs = _documents()
    train = [(n, s, t) for n, s, t in docs if not _held_out(n)]
    held = [(n, s, t) for n, s, t in docs if _held_out(n)]
    random.Random(SAMPLE_VERSION).shuffle(train)
    (out / "pile" / "train").mkdir(parents=True)
    (out / "lambada").mkdir()
    for shard in range(NUM_TRAIN_SHARDS):
        records = [
            {"text": t, "meta": {"pile_set_name": s}} for _, s, t in train[shard::NUM_TRAIN_SHARDS]
        ]
        _write_jsonl_zst(out / "pile" / "train" / f"{shard:02d}.jsonl.zst", records)
    _write_jsonl_zst(
        out / "pile" / "val.jsonl.zst",
        [{"text": t, "meta": {"pile_set_name": s}} for _, s, t in held],
    )
    passages = _lambada_passages([t for _, _, t in held])
    (out / "lambada" / "lambada_test.jsonl").write_text(
        "".join(json.dumps({"text": p}) + "\n" for p in passages)
    )
    # One thread: SentencePiece's multi-threaded trainer need not give identical models run to run.
    train_sentencepiece(
        (t for _, _, t in train), VOCAB_SIZE, out / "sample_spm.model", num_threads=1
    )


def _key() -> str:
    versions = f"{SAMPLE_VERSION} {sys.version_info[:2]} {sentencepiece.__version__} {zstandard.__version__}"
    return "v" + hashlib.sha256(versions.encode()).hexdigest()[:12]


def ensure_sample_data(cache_dir=None) -> tuple[Path, Path]:
    """(data_dir, vocab_path) of the sample corpus, building it once under cache_dir."""
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    final = root / _key()
    vocab_path = final / "sample_spm.model"
    if not vocab_path.is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f"{final.name}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            _build(tmp)
            os.rename(tmp, final)
        except OSError:
            if not vocab_path.is_file():  # not "another process finished first"
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final, vocab_path


if __name__ == "__main__":
    data_dir, vocab = ensure_sample_data(sys.argv[1] if len(sys.argv) > 1 else None)
    print(f"data_dir={data_dir} vocab_path={vocab}")
