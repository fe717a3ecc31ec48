"""Stream documents from Pile-format files: `.jsonl.zst` or `.jsonl`, one JSON object a line.

Each line is `{"text": "...", "meta": {"pile_set_name": "..."}}`; only `text` is
required, so any corpus with a `text` field works. Bad lines in a training corpus
are skipped and counted (a 200 GB crawl always has a few); they are never skipped
silently: the first few are logged with file:line and a summary follows. Damage
that loses data we cannot count (a corrupt or truncated zstd stream) and a file
with no documents at all raise DataError.
"""

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import zstandard
from absl import logging

from tasks import tfds
from tasks.errors import DataError

# How many skipped lines per file are logged individually before only counting.
MAX_LOGGED_BAD_LINES = 5
_CHUNK_BYTES = 1 << 20


@dataclasses.dataclass
class ReadStats:
    """Counts for one file; `skipped` lines never reach the tokenizer."""

    path: str
    lines: int = 0
    docs: int = 0
    bytes_read: int = 0  # of the file on disk, for progress bars
    malformed_json: int = 0
    missing_text: int = 0
    non_string_text: int = 0
    empty_text: int = 0

    @property
    def skipped(self) -> int:
        return self.malformed_json + self.missing_text + self.non_string_text + self.empty_text

    def summary(self) -> str:
        return (
            f"{self.path}: {self.docs} documents from {self.lines} lines, skipped {self.skipped} "
            f"({self.malformed_json} malformed JSON, {self.missing_text} without 'text', "
            f"{self.non_string_text} non-string 'text', {self.empty_text} empty 'text')"
        )


def _zst_chunks(path: Path, stats: ReadStats) -> Iterator[bytes]:
    """Decompressed bytes of every zstd frame in `path`; DataError on corrupt or truncated input."""
    # decompressobj (not stream_reader) because stream_reader returns a short read
    # instead of an error on a truncated file; here `eof` tells us whether the
    # last frame was complete.
    dctx = zstandard.ZstdDecompressor()
    obj = dctx.decompressobj()
    in_frame = False  # has the current object been given bytes of an unfinished frame?
    with open(path, "rb") as f:
        while raw := f.read(_CHUNK_BYTES):
            stats.bytes_read += len(raw)
            try:
                while raw:
                    in_frame = True
                    out = obj.decompress(raw)
                    raw = b""
                    if out:
                        yield out
                    # The Pile's files are one frame, but `zstd` may write several
                    # (and pzstd always does): continue with the bytes after this one.
                    if obj.eof:
                        raw = obj.unused_data
                        obj = dctx.decompressobj()
                        in_frame = False
            except zstandard.ZstdError as e:
                raise DataError(
                    f"{path} is corrupt ({e}) after {stats.docs} documents; "
                    "delete it and download it again"
                ) from None
    if in_frame:
        raise DataError(
            f"{path} is truncated (the zstd stream ends mid-frame) after {stats.docs} documents; "
            "delete it and download it again"
        )


def _lines(path: Path, stats: ReadStats) -> Iterator[bytes]:
    """Raw lines (without the newline) of a .jsonl or .jsonl.zst file."""
    if path.name.endswith(".zst"):
        tail = b""
        for chunk in _zst_chunks(path, stats):
            parts = (tail + chunk).split(b"\n")
            tail = parts.pop()
            yield from parts
        if tail:
            yield tail
    else:
        with open(path, "rb") as f:
            for line in f:
                stats.bytes_read += len(line)
                yield line.rstrip(b"\n")


def _skip(stats: ReadStats, counter: str, lineno: int, why: str) -> None:
    setattr(stats, counter, getattr(stats, counter) + 1)
    if stats.skipped <= MAX_LOGGED_BAD_LINES:
        logging.warning("%s:%d: skipped line: %s", stats.path, lineno, why)


def iter_documents(path, stats: ReadStats | None = None, with_set_name: bool = False) -> Iterator:
    """Yield the `text` of each good line of `path` (or `(text, pile_set_name)` pairs).

    Raises DataError for a missing file, a corrupt/truncated zstd stream, or a
    file with no documents. Pass a ReadStats to see the counts afterwards.
    """
    path = Path(path)
    if stats is None:
        stats = ReadStats(str(path))
    if not path.is_file():
        raise DataError(f"{path} does not exist; check --data_dir")
    if tfds.is_tfrecord(path):
        yield from _tfrecord_documents(path, stats, with_set_name)
        return
    for lineno, line in enumerate(_lines(path, stats), start=1):
        stats.lines = lineno
        if not line.strip():
            continue  # blank lines (e.g. a trailing one) are formatting, not data
        try:
            record = json.loads(line)
        except ValueError as e:  # includes invalid UTF-8
            _skip(stats, "malformed_json", lineno, f"not JSON ({e})")
            continue
        text = record.get("text") if isinstance(record, dict) else None
        if text is None:
            _skip(stats, "missing_text", lineno, "no 'text' field")
            continue
        if not isinstance(text, str):
            _skip(
                stats, "non_string_text", lineno, f"'text' is {type(text).__name__}, not a string"
            )
            continue
        if not text:
            _skip(stats, "empty_text", lineno, "'text' is empty")
            continue
        stats.docs += 1
        if with_set_name:
            meta = record.get("meta")
            set_name = meta.get("pile_set_name") if isinstance(meta, dict) else None
            yield text, set_name
        else:
            yield text
    _check_counts(path, stats)


def _tfrecord_documents(path: Path, stats: ReadStats, with_set_name: bool) -> Iterator:
    """The `text` of each record of a TFDS shard (paxml's the_pile build has no set names)."""
    for record, (text,) in enumerate(tfds.iter_examples(path, ("text",), stats), start=1):
        if not text:
            _skip(stats, "empty_text", record, "'text' is empty")
            continue
        stats.docs += 1
        yield (text, None) if with_set_name else text
    _check_counts(path, stats)


def _check_counts(path: Path, stats: ReadStats) -> None:
    if stats.skipped:
        logging.warning("%s", stats.summary())
    if stats.docs == 0:
        raise DataError(
            f"{path} contains no documents ({stats.summary()}); "
            "each line must be a JSON object with a non-empty 'text' string"
        )
