"""Tokenize raw text files once into memory-mappable token shards.

    python -m tasks.prepare --data_dir=DIR --vocab_path=P [--workers=N]

The files are read with tasks/text_formats.py (Pile jsonl.zst, jsonl, jsonl.gz, parquet,
Arrow, txt, TFDS shards; a TextFormat says which field holds the text), the tokenizer is
a SentencePiece model or a Hugging Face tokenizer.json (tasks/tokenizer.py). For a set of
source files, a tokenizer and a text format, the cache directory is

    <cache_root>/<key>/                  key = hash(tokenizer, text format, source
                                               absolute paths+sizes+mtimes)
        000-00.jsonl.zst.tokens.npy      [num_tokens] uint16 (uint32 if vocab > 65536): each
                                         document's ids followed by EOS (framed as the
                                         tokenizer's `framing` says: a BOS first under
                                         ADD_BOS, which is then part of the key), documents
                                         in file order
        000-00.jsonl.zst.docs.npy        [num_docs] int64: end offset (exclusive) of each document
        000-00.jsonl.zst.json            per-file counts; written last, so it marks the file done
        manifest.json                    the whole set; written when every file is done

<cache_root> is --cache_dir, else $PAXLOOM_TOKEN_CACHE_DIR, else ~/.cache/paxloom/tokenized
(paxloom/core/user_cache.py), never the data's own directory: on a cluster that is often
shared or read-only. The key holds each source's absolute path, so corpora of the same file
names in two directories never share an entry.

Every file is written under a temporary name and os.replace'd into place, so an
interrupted prepare never leaves a half shard; rerunning resumes with the files
that are not done yet (a Pile shard takes a while). In a multi-process job (jax.distributed)
process 0 tokenizes while the others wait for it, then read its shards; a process that
does not see them (a cache directory local to each node) tokenizes its own copy. Several
processes preparing the same set at once is safe anyway (same bytes, atomic renames).
"""

import dataclasses
import gc
import hashlib
import itertools
import json
import multiprocessing
import os
import sys
import threading
from pathlib import Path

import numpy as np
from absl import flags, logging

from paxloom.core.errors import UserError
from paxloom.core.framing import framing_of
from paxloom.core.user_cache import TOKEN_CACHE_ENV, token_cache_dir
from tasks import layout
from tasks.progress import Progress
from tasks.text_formats import ReadStats, TextFormat
from tasks.tokenizer import HFTokenizer, load_tokenizer
from tasks.vocab import Vocabulary

# Either tokenizer of tasks/tokenizer.py (anything with the core.data.Tokenizer
# methods and a `path` and `sha256`).
Tokenizer = Vocabulary | HFTokenizer
_DEFAULT_FORMAT = TextFormat()

FORMAT_VERSION = 1
_NPY_HEADER_BYTES = 128  # fixed, so the final shape can be written over the placeholder
_ENCODE_BATCH_DOCS = 256


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


class _NpyAppender:
    """Write a 1-D .npy of unknown final length by appending, atomically at close()."""

    def __init__(self, path: Path, dtype: np.dtype):
        self.path = path
        self.dtype = np.dtype(dtype)
        self.tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        self.count = 0
        self.f = open(self.tmp, "wb")
        self.f.write(self._header(0))

    def _header(self, n: int) -> bytes:
        text = repr({"descr": self.dtype.str, "fortran_order": False, "shape": (n,)})
        prefix = b"\x93NUMPY\x01\x00"
        body_len = _NPY_HEADER_BYTES - len(prefix) - 2
        body = text.encode("latin1").ljust(body_len - 1) + b"\n"
        return prefix + body_len.to_bytes(2, "little") + body

    def append(self, arr: np.ndarray) -> None:
        self.f.write(np.ascontiguousarray(arr, self.dtype).tobytes())
        self.count += len(arr)

    def close(self) -> None:
        self.f.seek(0)
        self.f.write(self._header(self.count))
        self.f.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.f.close()
        self.tmp.unlink(missing_ok=True)


@dataclasses.dataclass
class PreparedFile:
    source: str
    tokens_path: Path
    docs_path: Path
    num_tokens: int
    num_docs: int

    def tokens(self) -> np.ndarray:
        """[num_tokens] memory-mapped token ids (EOS after each document)."""
        return np.load(self.tokens_path, mmap_mode="r")

    def doc_ends(self) -> np.ndarray:
        """[num_docs] int64 exclusive end offset of each document in tokens()."""
        return np.load(self.docs_path, mmap_mode="r")


def cache_key(files, vocab: Tokenizer, text_format: TextFormat = _DEFAULT_FORMAT) -> str:
    """Hash of everything the shards depend on: the tokenizer's bytes (and, for a Hugging
    Face tokenizer, its EOS, which tokenizer_config.json may choose), the text format,
    the sources' absolute paths, sizes and mtimes (one cache directory serves every
    corpus)."""
    h = hashlib.sha256()
    h.update(f"v{FORMAT_VERSION}\n{vocab.sha256}\n".encode())
    if not isinstance(vocab, Vocabulary):
        h.update(f"{type(vocab).__name__} eos={vocab.eos_id}\n".encode())
    framing = framing_of(vocab)
    if framing.bos_id is not None:  # ADD_BOS, ADD_EOS; Pax's framing adds nothing
        h.update(f"bos={framing.bos_id} add_eos={framing.add_eos}\n".encode())
    if text_format != _DEFAULT_FORMAT:
        h.update(f"{json.dumps(dataclasses.asdict(text_format), sort_keys=True)}\n".encode())
    for path in files:
        st = os.stat(path)
        h.update(f"{Path(path).resolve()}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:20]


def _stem(index: int, path) -> str:
    return f"{index:03d}-{Path(path).name}"


# Shared progress slots (bytes of each source file read so far), set by the pool initializer.
_progress = None


def _init_worker(progress, threads: int | None = None) -> None:
    global _progress
    _progress = progress
    if threads is not None:
        # The pool size of Hugging Face tokenizers' encode_batch (Rust, rayon), read when the
        # pool starts: without this each worker would start one thread per CPU.
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))


def _prepare_one(
    index: int, source: str, out_dir: str, vocab: Tokenizer, num_threads: int,
    text_format: TextFormat = _DEFAULT_FORMAT,
) -> dict:
    """Tokenize one source file into its .tokens.npy/.docs.npy/.json; returns its counts."""
    out = Path(out_dir)
    stem = _stem(index, source)
    stats = ReadStats(source)
    framing = framing_of(vocab)
    tokens = _NpyAppender(out / f"{stem}.tokens.npy", token_dtype(vocab.vocab_size))
    docs = _NpyAppender(out / f"{stem}.docs.npy", np.int64)
    try:
        batch: list[str] = []

        def flush():
            encoded = vocab.encode_batch(batch, num_threads=num_threads)
            flat: list[int] = []
            ends = np.empty(len(encoded), np.int64)
            for i, ids in enumerate(encoded):
                flat.extend(framing.document(ids))
                ends[i] = len(flat)
            docs.append(ends + tokens.count)
            tokens.append(np.asarray(flat))
            batch.clear()
            if _progress is not None:
                _progress[index] = stats.bytes_read

        for text in text_format.documents(source, stats):
            batch.append(text)
            if len(batch) >= _ENCODE_BATCH_DOCS:
                flush()
        if batch:
            flush()
    except BaseException:
        tokens.abort()
        docs.abort()
        raise
    docs.close()
    tokens.close()
    info = {
        "source": source,
        "tokens": tokens.path.name,
        "docs": docs.path.name,
        "num_tokens": tokens.count,
        "num_docs": docs.count,
        "skipped_lines": stats.skipped,
        "summary": stats.summary(),
    }
    _write_json_atomic(out / f"{stem}.json", info)
    return info


def _write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def _report_progress(progress, sizes: list[int], stop: threading.Event) -> None:
    """Bytes of the source files tokenized so far (the workers' shared counters)."""
    report = Progress(f"tokenizing {len(sizes)} file(s)", sum(sizes))
    while not stop.wait(0.5):
        report.update(sum(progress[:]))
    report.finish()


def prepare(
    files, vocab: Tokenizer, cache_root=None, workers: int | None = None, progress: bool = True,
    text_format: TextFormat = _DEFAULT_FORMAT,
) -> list[PreparedFile]:
    """Make sure `files` (read as `text_format` says) are tokenized with `vocab`; return the
    shards, in `files` order."""
    files = [str(Path(f).resolve()) for f in files]
    if not files:
        raise UserError("no source files to prepare")
    for f in files:
        if not os.path.isfile(f):
            raise UserError(f"{f} does not exist; check --data_dir")
    cache_root = Path(cache_root) if cache_root else token_cache_dir()
    out_dir = cache_root / cache_key(files, vocab, text_format)
    _on_process_zero_first(out_dir, lambda: _tokenize(files, vocab, out_dir, workers, progress,
                                                       text_format))
    manifest = json.loads((out_dir / "manifest.json").read_text())
    return [
        PreparedFile(
            info["source"],
            out_dir / info["tokens"],
            out_dir / info["docs"],
            info["num_tokens"],
            info["num_docs"],
        )
        for info in manifest["files"]
    ]


# Which of this process's prepare() calls this is: the key of process 0's answer that the
# others wait for (every process of a job prepares its sets in the same order).
_ROUNDS = itertools.count(1)
# How long the other processes wait for process 0 to tokenize (The Pile takes hours).
_WAIT_S = 7 * 24 * 3600


def _jax_job():
    """jax's record of a multi-process job (jax.distributed started), or None. Read where
    jax is already imported: `python -m tasks.prepare` and the tests need no jax."""
    distributed = sys.modules.get("jax._src.distributed")
    state = getattr(distributed, "global_state", None)
    if state is None or state.client is None or (state.num_processes or 1) <= 1:
        return None
    return state


def _on_process_zero_first(out_dir: Path, tokenize) -> None:
    """`tokenize()` on process 0 while the other processes of a multi-process job wait for
    it (jax.distributed's key-value store, not a device collective: tokenizing may take
    hours). A process that then finds no manifest.json (a cache directory local to each
    node, not the one process 0 wrote) tokenizes its own copy. A failure on process 0 ends
    the others too, with its message."""
    job = _jax_job()
    if job is None:
        tokenize()
        return
    key = f"paxloom/token_cache/{next(_ROUNDS)}"
    if job.process_id == 0:
        try:
            tokenize()
        except BaseException as error:
            reason = str(error) if isinstance(error, UserError) else type(error).__name__
            job.client.key_value_set(key, f"error: {reason}")
            raise
        job.client.key_value_set(key, f"done: {out_dir.name}")
        return
    status = job.client.blocking_key_value_get(key, _WAIT_S * 1000)
    if status.startswith("error: "):
        raise UserError(f"process 0 could not tokenize the training data: {status[7:]}")
    if not (out_dir / "manifest.json").is_file():
        # Another cache entry than process 0's (the data at other paths), or the same one in
        # a cache directory local to each node.
        logging.warning("process %d does not see process 0's token cache (%s here; process "
                        "0's entry: %s): tokenizing its own copy", job.process_id, out_dir,
                        status.removeprefix("done: "))
        tokenize()


def _tokenize(files: list[str], vocab: Tokenizer, out_dir: Path, workers, progress: bool,
              text_format: TextFormat) -> None:
    """Tokenize what of `files` is not yet in `out_dir`, then write its manifest.json."""
    manifest_path = out_dir / "manifest.json"
    if manifest_path.is_file():
        return
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(
            f"cannot create the token cache {out_dir} ({e.strerror}); pass a writable cache "
            f"directory (--cache_dir or ${TOKEN_CACHE_ENV})"
        ) from None
    _prepare_missing(files, vocab, out_dir, workers, progress, text_format)
    infos = [
        json.loads((out_dir / f"{_stem(i, f)}.json").read_text()) for i, f in enumerate(files)
    ]
    manifest = {
        "format_version": FORMAT_VERSION,
        "vocab_path": str(vocab.path),
        "vocab_sha256": vocab.sha256,
        "vocab_size": vocab.vocab_size,
        "eos_id": vocab.eos_id,
        "text_format": dataclasses.asdict(text_format),
        "dtype": token_dtype(vocab.vocab_size).str,
        "files": infos,
    }
    _write_json_atomic(manifest_path, manifest)


def _prepare_missing(
    files: list[str], vocab: Tokenizer, out_dir: Path, workers, show_progress: bool,
    text_format: TextFormat = _DEFAULT_FORMAT,
) -> None:
    todo = [(i, f) for i, f in enumerate(files) if not (out_dir / f"{_stem(i, f)}.json").is_file()]
    if not todo:
        return
    cpus = os.cpu_count() or 1
    workers = max(1, min(workers or cpus, len(todo)))
    threads = max(1, cpus // workers)
    logging.info("tokenizing %d file(s) into %s with %d worker(s)", len(todo), out_dir, workers)
    if show_progress:  # where the tokens go, before the progress lines
        print(f"token cache: {out_dir}", file=sys.stderr, flush=True)
    # Spawned, not forked: the caller may be a jax process with live threads.
    ctx = multiprocessing.get_context("spawn")
    progress = ctx.Array("q", len(files), lock=False)
    stop = threading.Event()
    bar = None
    if show_progress:
        sizes = [os.path.getsize(f) for _, f in todo]
        bar = threading.Thread(target=_report_progress, args=(progress, sizes, stop),
                               daemon=True)
        bar.start()
    try:
        if workers == 1:
            _init_worker(progress)
            for i, f in todo:
                _prepare_one(i, f, str(out_dir), vocab, threads, text_format)
        else:
            _run_pool(ctx, workers, progress, threads,
                      [(i, f, str(out_dir), vocab, threads, text_format) for i, f in todo])
    finally:
        _init_worker(None)
        stop.set()
        if bar is not None:
            bar.join()


def _run_pool(ctx, workers: int, progress, threads: int, jobs: list[tuple]) -> None:
    """_prepare_one of every job in a pool of `workers` processes. On a failure the pool is
    stopped and freed before the error goes on: its queues' semaphores must be released
    here, or a process that then exits at once (main.py's error line) leaves
    multiprocessing's resource tracker to print a warning after that line."""
    pool = ctx.Pool(workers, initializer=_init_worker, initargs=(progress, threads))
    error = result = None
    try:
        for result in [pool.apply_async(_prepare_one, job) for job in jobs]:
            result.get()
    except BaseException as e:  # noqa: BLE001 (re-raised below, once the pool is freed)
        error = e.with_traceback(None)  # the traceback's frames hold the pool
    finally:
        pool.terminate()
        pool.join()
    del pool, result
    gc.collect()
    if error is not None:
        raise error


def main(argv):
    del argv
    vocab = load_tokenizer(FLAGS.vocab_path)
    sets = []
    if "train" in FLAGS.splits:
        sets.append(layout.pile_train_files(FLAGS.data_dir))
    if "val" in FLAGS.splits:
        sets.append(layout.pile_val_files(FLAGS.data_dir))
    for files in sets:
        shards = prepare(files, vocab, FLAGS.cache_dir, FLAGS.workers)
        tokens = sum(s.num_tokens for s in shards)
        print(
            f"prepared {len(shards)} file(s), {tokens:,} tokens, in {shards[0].tokens_path.parent}"
        )


if __name__ == "__main__":
    flags.DEFINE_string(
        "data_dir",
        None,
        "Directory holding pile/train/*.jsonl.zst and pile/val.jsonl.zst.",
        required=True,
    )
    flags.DEFINE_string(
        "vocab_path", os.environ.get("VOCAB_PATH"), "SentencePiece .model file or Hugging Face tokenizer.json (or $VOCAB_PATH)."
    )
    flags.DEFINE_string(
        "cache_dir", None, "Root of the token cache (default $PAXLOOM_TOKEN_CACHE_DIR, else "
        "~/.cache/paxloom/tokenized)."
    )
    flags.DEFINE_integer(
        "workers", None, "Tokenizer processes (default: one per CPU, at most one per file)."
    )
    flags.DEFINE_list(
        "splits", ["train"], "Which of train,val to prepare (PileEvalInput reads val raw)."
    )
    FLAGS = flags.FLAGS
    from tasks import cli

    cli.run(main)
