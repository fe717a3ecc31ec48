"""A user's own corpus: which files, in which format, and which field holds the text.

Readers, chosen by the file's name:

    *.jsonl, *.jsonl.gz, *.jsonl.zst   one JSON object a line; the text is TextFormat.text_field
    *.parquet                          the text_field column (read a record batch at a time)
    *.arrow                            an Arrow IPC stream (Hugging Face `save_to_disk`) or file;
                                       the text_field column
    *.txt                              TextFormat.txt_documents: the whole file is one document
                                       ("file"), or each blank-line-separated block is
                                       ("blank_line")
    *.tfrecord*                        a TFDS shard of paxml's the_pile build (tasks/tfds.py)

Parquet and Arrow need pyarrow, imported on those paths only (the [text] extra);
Hugging Face `datasets` is never imported: its `save_to_disk` directories are read as the
Arrow files they are (`expand_files`).

Bad records of a training corpus (malformed JSON, a missing, null, non-string or empty text)
are skipped and counted, never silently: the first few are logged with file:line (or row)
and a summary follows. Damage that loses data we cannot count (a corrupt or truncated
compressed stream) and a file with no documents at all raise UserError.
"""

import dataclasses
import glob
import gzip
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import zstandard
from absl import logging

from paxloom.core.errors import UserError
from tasks import tfds

# How many skipped records per file are logged individually before only counting.
MAX_LOGGED_BAD_LINES = 5
_CHUNK_BYTES = 1 << 20
_ARROW_BATCH_ROWS = 1024

TXT_DOCUMENTS = ("file", "blank_line")
# Name endings of the readable files, for the messages and for expanding directories.
SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet", ".arrow", ".txt")
_SUPPORTED = ", ".join(SUFFIXES) + " or TFDS *.tfrecord* shards"


@dataclasses.dataclass(frozen=True)
class TextFormat:
    """How the documents are stored in the files. Frozen (hashable, picklable: prepare's
    worker processes get it) and part of the token cache's key.

    text_field: the JSON key of a .jsonl line, or the column of a .parquet/.arrow file,
      that holds each document's text.
    txt_documents: for .txt files, "file" (the whole file is one document, as it is) or
      "blank_line" (each block of lines between blank lines is a document).
    """

    text_field: str = "text"
    txt_documents: str = "file"

    def __post_init__(self):
        if not isinstance(self.text_field, str) or not self.text_field:
            raise UserError(f"text_field={self.text_field!r} must be a non-empty string naming "
                            "the JSON key or column that holds the text (e.g. 'text')")
        if self.txt_documents not in TXT_DOCUMENTS:
            raise UserError(f"txt_documents={self.txt_documents!r} is not one of "
                            f"{', '.join(map(repr, TXT_DOCUMENTS))}; set it to 'file' (one "
                            "document per .txt file) or 'blank_line' (blank-line-separated blocks)")

    def documents(self, path, stats=None, with_set_name: bool = False) -> Iterator:
        """The documents of one file (see `iter_documents`)."""
        return iter_documents(path, stats, self, with_set_name)


@dataclasses.dataclass
class ReadStats:
    """Counts for one file; `skipped` records never reach the tokenizer. `lines` counts the
    file's lines (jsonl, txt) or records (rows of parquet/arrow, TFRecords)."""

    path: str
    lines: int = 0
    docs: int = 0
    bytes_read: int = 0  # of the file on disk (estimated for parquet), for progress bars
    malformed_json: int = 0
    missing_text: int = 0
    non_string_text: int = 0
    empty_text: int = 0
    field: str = "text"  # the text field's name, for the messages
    # The keys of the JSON objects that lack the field (the first few, in order) and the
    # first of them that holds a string: what a wrong TEXT_FIELD's message names.
    other_keys: list = dataclasses.field(default_factory=list)
    string_key: str | None = None

    @property
    def skipped(self) -> int:
        return self.malformed_json + self.missing_text + self.non_string_text + self.empty_text

    def summary(self) -> str:
        f = self.field
        return (
            f"{self.path}: {self.docs} documents from {self.lines} lines, skipped {self.skipped} "
            f"({self.malformed_json} malformed JSON, {self.missing_text} without '{f}', "
            f"{self.non_string_text} non-string '{f}', {self.empty_text} empty '{f}')"
        )


def suffix_of(path) -> str | None:
    """The reader's name for `path` (one of SUFFIXES, or "tfrecord"), or None."""
    name = Path(path).name
    if tfds.is_tfrecord(name):
        return "tfrecord"
    # Longest first: ".jsonl.gz" before a bare suffix check could mistake it.
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return suffix
    return None


def iter_documents(
    path, stats: ReadStats | None = None, text_format: TextFormat | None = None,
    with_set_name: bool = False,
) -> Iterator:
    """Yield the text of each good document of `path` (or `(text, pile_set_name)` pairs;
    the set name is None except in Pile jsonl lines that carry one).

    Raises UserError for a missing file, an unsupported name, a corrupt/truncated
    compressed stream, a missing column, or a file with no documents. Pass a ReadStats
    to see the counts afterwards.
    """
    text_format = TextFormat() if text_format is None else text_format
    path = Path(path)
    if stats is None:
        stats = ReadStats(str(path))
    stats.field = text_format.text_field
    if not path.is_file():
        raise UserError(f"{path} does not exist; check --data_dir")
    suffix = suffix_of(path)
    if suffix is None:
        raise UserError(f"{path} is not a supported data file; the names that can be read end "
                        f"in {_SUPPORTED}")
    if suffix == "tfrecord":
        texts = _tfrecord_texts(path, stats)
    elif suffix in (".parquet", ".arrow"):
        texts = _arrow_texts(path, stats, text_format.text_field, suffix)
    elif suffix == ".txt":
        texts = _txt_texts(path, stats, text_format.txt_documents)
    else:
        texts = _jsonl_texts(path, stats, text_format.text_field, with_set_name)
    for item in texts:
        stats.docs += 1
        if with_set_name:
            yield item if isinstance(item, tuple) else (item, None)
        else:
            yield item[0] if isinstance(item, tuple) else item
    _check_counts(path, stats, suffix)


def _skip(stats: ReadStats, counter: str, lineno: int, why: str, unit: str = "line") -> None:
    setattr(stats, counter, getattr(stats, counter) + 1)
    if stats.skipped <= MAX_LOGGED_BAD_LINES:
        if unit == "line":
            logging.warning("%s:%d: skipped line: %s", stats.path, lineno, why)
        else:
            logging.warning("%s: %s %d: skipped: %s", stats.path, unit, lineno, why)


def _text_or_skip(stats: ReadStats, text, lineno: int, unit: str = "line") -> bool:
    """Whether `text` (a record's field value, None when absent) is a document; counts it if not."""
    field = stats.field
    if text is None:
        _skip(stats, "missing_text", lineno, f"no '{field}' field", unit)
    elif not isinstance(text, str):
        _skip(stats, "non_string_text", lineno,
              f"'{field}' is {type(text).__name__}, not a string", unit)
    elif not text:
        _skip(stats, "empty_text", lineno, f"'{field}' is empty", unit)
    else:
        return True
    return False


def _check_counts(path: Path, stats: ReadStats, suffix: str) -> None:
    if stats.skipped:
        logging.warning("%s", stats.summary())
    if stats.docs == 0:
        field = stats.field
        if (suffix not in (".txt", "tfrecord") and stats.other_keys
                and stats.missing_text == stats.skipped - stats.malformed_json):
            raise UserError(f"{path} has no {field!r} key in any line (its keys: "
                            f"{_names(stats.other_keys)}); {_set_text_field(stats.string_key)}")
        if suffix == ".txt":
            need = "a .txt file must hold some text"
        elif suffix in (".parquet", ".arrow"):
            need = f"the '{field}' column must hold non-empty strings"
        elif suffix == "tfrecord":
            need = "each record must have a non-empty 'text' feature"
        else:
            need = (f"each line must be a JSON object with a non-empty '{field}' string "
                    f"(TEXT_FIELD names the key)")
        raise UserError(f"{path} contains no documents ({stats.summary()}); {need}")


def _names(names) -> str:
    return ", ".join(repr(n) for n in names) or "none"


def _set_text_field(example: str | None) -> str:
    """The fix of a wrong text field: TEXT_FIELD (TextFiles' text_field in code)."""
    return ("set TEXT_FIELD to the key or column that holds the text"
            + (f", e.g. --fdl.TEXT_FIELD={example}" if example else ""))


# --- jsonl, jsonl.gz, jsonl.zst ---------------------------------------------------------


def _zst_chunks(path: Path, stats: ReadStats) -> Iterator[bytes]:
    """Decompressed bytes of every zstd frame in `path`; UserError on corrupt or truncated input."""
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
                raise UserError(
                    f"{path} is corrupt ({e}) after {stats.docs} documents; "
                    "delete it and download it again"
                ) from None
    if in_frame:
        raise UserError(
            f"{path} is truncated (the zstd stream ends mid-frame) after {stats.docs} documents; "
            "delete it and download it again"
        )


def _gz_lines(path: Path, stats: ReadStats) -> Iterator[bytes]:
    with open(path, "rb") as raw, gzip.GzipFile(fileobj=raw) as f:
        try:
            for line in f:
                stats.bytes_read = raw.tell()
                yield line.rstrip(b"\n")
        except EOFError:
            raise UserError(
                f"{path} is truncated (the gzip stream ends early) after {stats.docs} documents; "
                "delete it and download it again"
            ) from None
        except (gzip.BadGzipFile, zlib.error) as e:
            raise UserError(
                f"{path} is corrupt ({' '.join(str(e).split())}) after {stats.docs} documents; "
                "delete it and download it again"
            ) from None


def _lines(path: Path, stats: ReadStats) -> Iterator[bytes]:
    """Raw lines (without the newline) of a .jsonl, .jsonl.gz or .jsonl.zst file."""
    if path.name.endswith(".zst"):
        tail = b""
        for chunk in _zst_chunks(path, stats):
            parts = (tail + chunk).split(b"\n")
            tail = parts.pop()
            yield from parts
        if tail:
            yield tail
    elif path.name.endswith(".gz"):
        yield from _gz_lines(path, stats)
    else:
        with open(path, "rb") as f:
            for line in f:
                stats.bytes_read += len(line)
                yield line.rstrip(b"\n")


def _jsonl_texts(path: Path, stats: ReadStats, field: str, with_set_name: bool) -> Iterator:
    for lineno, line in enumerate(_lines(path, stats), start=1):
        stats.lines = lineno
        if not line.strip():
            continue  # blank lines (e.g. a trailing one) are formatting, not data
        try:
            record = json.loads(line)
        except ValueError as e:  # includes invalid UTF-8
            _skip(stats, "malformed_json", lineno, f"not JSON ({e})")
            continue
        text = record.get(field) if isinstance(record, dict) else None
        if text is None and isinstance(record, dict) and len(stats.other_keys) < 20:
            stats.other_keys += [k for k in record
                                 if k not in stats.other_keys][:20 - len(stats.other_keys)]
            if stats.string_key is None:
                stats.string_key = next((k for k, v in record.items() if isinstance(v, str)),
                                        None)
        if not _text_or_skip(stats, text, lineno):
            continue
        if with_set_name:
            meta = record.get("meta")
            yield text, (meta.get("pile_set_name") if isinstance(meta, dict) else None)
        else:
            yield text


# --- parquet, arrow ----------------------------------------------------------------------


def jsonl_records(path: Path, fix: str) -> Iterator[tuple[str, int, object]]:
    """(file:line, line number, parsed value) of every non-blank line of a jsonl file that
    must be whole (an evaluation set): a line that is not JSON is a UserError naming
    file:line and `fix`, never skipped. Training corpora skip bad lines instead."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                yield where, lineno, json.loads(raw)
            except ValueError as e:
                raise UserError(f"{where} is not valid JSON ({e}); {fix}") from None


def _pyarrow(path):
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise UserError(f"reading {path} needs pyarrow: pip install pyarrow (or, in "
                        f"a Paxloom clone, pip install '.[text]')") from None
    return pyarrow


def _is_text_type(pa, type_) -> bool:
    if pa.types.is_dictionary(type_):
        type_ = type_.value_type
    return (pa.types.is_string(type_) or pa.types.is_large_string(type_)
            or pa.types.is_string_view(type_))


def _check_column(pa, path: Path, schema, field: str) -> None:
    names = list(schema.names)
    strings = [n for n in names if n != field and _is_text_type(pa, schema.field(n).type)]
    fix = _set_text_field(strings[0] if strings else None)
    if field not in names:
        raise UserError(f"{path} has no column {field!r} (its columns: {_names(names)}); {fix}")
    type_ = schema.field(field).type
    if not _is_text_type(pa, type_):
        raise UserError(f"column {field!r} of {path} holds {type_}, not strings; {fix}")


def _arrow_texts(path: Path, stats: ReadStats, field: str, suffix: str) -> Iterator[str]:
    pa = _pyarrow(path)
    if suffix == ".parquet":
        batches = _parquet_batches(pa, path, stats, field)
    else:
        batches = _ipc_batches(pa, path, stats, field)
    row = 0
    for column in batches:
        for text in column.to_pylist():
            row += 1
            stats.lines = row
            if _text_or_skip(stats, text, row, unit="row"):
                yield text


def _parquet_batches(pa, path: Path, stats: ReadStats, field: str) -> Iterator:
    try:
        f = pa.parquet.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"{path} is not a readable Parquet file ({' '.join(str(e).split())}); "
                        "rewrite it or remove it from the data files") from None
    with f:
        _check_column(pa, path, f.schema_arrow, field)
        size, rows, done = path.stat().st_size, max(1, f.metadata.num_rows), 0
        try:
            for batch in f.iter_batches(batch_size=_ARROW_BATCH_ROWS, columns=[field]):
                done += batch.num_rows
                stats.bytes_read = size * done // rows  # an estimate: columns are compressed
                yield batch.column(0)
        except (pa.ArrowException, OSError) as e:
            raise UserError(f"{path} is corrupt ({' '.join(str(e).split())}) after "
                            f"{stats.docs} documents; rewrite it") from None


def _ipc_batches(pa, path: Path, stats: ReadStats, field: str) -> Iterator:
    with open(path, "rb") as f:
        # `save_to_disk` writes the IPC stream format; the IPC file format (pyarrow.ipc.new_file,
        # Feather v2) starts with the magic ARROW1 and is read as a file.
        is_file_format = f.read(6) == b"ARROW1"
        f.seek(0)
        try:
            if is_file_format:
                reader = pa.ipc.open_file(f)
                schema = reader.schema
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            else:
                reader = pa.ipc.open_stream(f)
                schema = reader.schema
                batches = iter(reader)
            _check_column(pa, path, schema, field)
            index = schema.get_field_index(field)
            for batch in batches:
                stats.bytes_read = f.tell()
                yield batch.column(index)
        except (pa.ArrowException, OSError) as e:
            raise UserError(f"{path} is not a readable Arrow file ({' '.join(str(e).split())}) "
                            f"after {stats.docs} documents; rewrite it or remove it from the "
                            "data files") from None


# --- txt, tfrecord -------------------------------------------------------------------------


def _txt_lines(path: Path, stats: ReadStats) -> Iterator[str]:
    with open(path, "rb") as raw:
        lineno = 0
        for line in raw:
            lineno += 1
            stats.bytes_read += len(line)
            stats.lines = lineno
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(f"{path}:{lineno} is not UTF-8 ({e.reason} at byte {e.start} of "
                                "the line); convert the file to UTF-8") from None
            # Universal newlines, as text mode would give: \r\n and \r become \n.
            yield text.replace("\r\n", "\n").replace("\r", "\n")


def _txt_texts(path: Path, stats: ReadStats, txt_documents: str) -> Iterator[str]:
    if txt_documents == "file":
        text = "".join(_txt_lines(path, stats))
        if not text.strip():
            _skip(stats, "empty_text", 1, "the file holds no text (txt_documents='file')")
        else:
            yield text
        return
    block: list[str] = []
    for line in _txt_lines(path, stats):
        if line.strip():
            block.append(line)
        elif block:
            yield "".join(block).rstrip("\n")
            block = []
    if block:
        yield "".join(block).rstrip("\n")


def _tfrecord_texts(path: Path, stats: ReadStats) -> Iterator[str]:
    """The `text` of each record of a TFDS shard (paxml's the_pile build has no set names)."""
    for record, (text,) in enumerate(tfds.iter_examples(path, ("text",), stats), start=1):
        if not text:
            _skip(stats, "empty_text", record, "'text' is empty")
            continue
        yield text


# --- which files ------------------------------------------------------------------------------


def is_glob(spec: str) -> bool:
    """Whether a data path holds glob characters (expand_files expands it)."""
    return any(c in spec for c in "*?[")


def _hf_dataset_files(directory: Path) -> list[Path] | None:
    """The .arrow files of a Hugging Face `save_to_disk` directory, in its order; None if
    `directory` is not one. UserError for a DatasetDict (several splits)."""
    if (directory / "dataset_dict.json").is_file():
        try:
            splits = json.loads((directory / "dataset_dict.json").read_text())["splits"]
            example = directory / str(splits[0])
            names = ", ".join(str(s) for s in splits)
        except (ValueError, KeyError, IndexError, TypeError):
            example, names = directory / "train", "?"
        raise UserError(f"{directory} is a Hugging Face DatasetDict (splits: {names}); pass one "
                        f"split's directory, e.g. {example}")
    state_path = directory / "state.json"
    try:
        state = json.loads(state_path.read_text())
    except (OSError, ValueError):
        return None  # no state.json, or another tool's: a plain directory
    if not isinstance(state, dict) or "_data_files" not in state:
        return None
    try:
        files = [directory / entry["filename"] for entry in state["_data_files"]]
    except (KeyError, TypeError):
        raise UserError(f"{state_path} has no readable '_data_files' list; pass the dataset's "
                        ".arrow files instead, or save the dataset again with save_to_disk") from None
    for f in files:
        if not f.is_file():
            raise UserError(f"{f}, listed in {state_path}, does not exist; save the dataset "
                            "again with save_to_disk")
    if not files:
        raise UserError(f"{directory} is a Hugging Face dataset with no data files "
                        f"({state_path} lists none)")
    return files


def _expand_one(spec: str) -> list[Path]:
    spec = os.path.expanduser(spec)
    if is_glob(spec) and not os.path.exists(spec):  # a name may hold [ ] * ?
        matched = sorted(glob.glob(spec, recursive=True))
        files = [Path(m) for m in matched if os.path.isfile(m)]
        found = [f for f in files if suffix_of(f) is not None]
        if not found:
            what = (f"only files of other formats ({', '.join(f.name for f in files[:3])}...)"
                    if files else "nothing")
            raise UserError(f"the data file pattern {spec} matched {what}; check the pattern "
                            f"(readable files end in {_SUPPORTED})")
        return found
    path = Path(spec)
    if path.is_dir():
        hf = _hf_dataset_files(path)
        if hf is not None:
            return hf
        found = sorted(p for p in path.iterdir() if p.is_file() and suffix_of(p) is not None)
        if not found:
            raise UserError(f"the data directory {path} holds no readable files; they must end "
                            f"in {_SUPPORTED}")
        return found
    if not path.is_file():
        # A name with no extension (or a trailing /) was meant as a directory of files.
        what = "directory" if not path.suffix or spec.endswith("/") else "file"
        raise UserError(f"the data {what} {path} does not exist; check the path")
    if suffix_of(path) is None:
        raise UserError(f"{path} is not a supported data file; the names that can be read end "
                        f"in {_SUPPORTED}")
    return [path]


def expand_files(spec) -> list[Path]:
    """The data files named by `spec`, in a deterministic order.

    `spec` is a path, a glob (`data/*.jsonl.gz`; `**` matches any depth), a directory, or a
    list of those (expanded in order, each glob's and directory's files sorted by name; a
    file named twice is read twice). A Hugging Face `save_to_disk` directory (holding
    state.json) gives its .arrow files in the dataset's order; a DatasetDict directory is a
    UserError asking for one split's subdirectory; any other directory gives the readable
    files directly in it. UserError when nothing is found.
    """
    if isinstance(spec, (str, os.PathLike)):
        specs = [spec]
    elif isinstance(spec, Iterable):
        specs = list(spec)
    else:
        raise UserError(f"data files {spec!r} must be a path, a glob, a directory or a list of "
                        "those")
    if not specs:
        raise UserError("no data files given; pass a path, a glob or a directory")
    files: list[Path] = []
    for s in specs:
        if not isinstance(s, (str, os.PathLike)) or not str(s):
            raise UserError(f"data file entry {s!r} must be a non-empty path, glob or directory")
        files.extend(_expand_one(os.fspath(s)))
    return files
