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

`write_boolq_sample(DIR)` writes a BoolQ sample from the same text, for Pax's LLaMA
recipe (scripts_gpu/run_llama_boolq.sh) on a CPU: DIR is a TFDS_DATA_DIR as paxml's
download_boolq.py leaves it, with a vocabulary in which the answers are single tokens:

    super_glue/boolq/1.0.2/super_glue-train.tfrecord-0000N-of-00002   1000 examples
                           super_glue-validation.tfrecord-00000-of-00001  100
                           dataset_info.json, features.json, label.labels.txt
    boolq_spm.model       SentencePiece BPE, 1024 pieces, 'yes' and 'no' one token each

Each example asks whether a passage mentions a word: half of them one of its own words
(yes), half a word of another document that it lacks (no). The shards are written without
TensorFlow (tasks/tfds.py).

    python -m tasks.sample_corpus                        the sample corpus; prints its paths
    python -m tasks.sample_corpus --boolq_dir=DIR        the BoolQ sample under DIR
"""

import hashlib
import inspect
import json
import os
import random
import re
import shutil
import sys
import warnings
import zlib
from pathlib import Path

import sentencepiece
import zstandard
from absl import flags

from paxloom.core.errors import UserError
from paxloom.core.user_cache import user_cache_dir
from tasks import tfds
from tasks.train_vocab import train_sentencepiece

SAMPLE_VERSION = 2
VOCAB_SIZE = 1024
NUM_TRAIN_SHARDS = 4
HELD_OUT_PERCENT = 18
# Lambada passage shape: a window of up to this many words ending in a repeated word.
PASSAGE_WORDS = (20, 60)
MAX_LAMBADA = 500
# The BoolQ sample: examples per split, shards per split (TFDS's names), passage length in
# words, and its vocabulary's file name.
BOOLQ_EXAMPLES = {"train": 1000, "validation": 100}
BOOLQ_SHARDS = {"train": 2, "validation": 1}
BOOLQ_PASSAGE_WORDS = (20, 40)
BOOLQ_VOCAB = "boolq_spm.model"
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
            with warnings.catch_warnings():
                # A deprecated member (typing.io) warns when read: it is no document.
                warnings.simplefilter("error", DeprecationWarning)
                try:
                    doc = inspect.getdoc(obj)
                except DeprecationWarning:
                    continue
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


# ----- a BoolQ sample ---------------------------------------------------------------------


def _boolq_records(texts: list[str], count: int, rng: random.Random) -> list[dict]:
    """`count` {"question", "passage", "label"} records (TFDS's features; label 1 is True):
    a passage of `texts` and whether it mentions a word, one of its own or one it lacks,
    each half the time."""
    def plain_words(words):  # the words a question asks about: letters only, 4 or more
        return sorted({w.lower() for w in words if re.fullmatch(r"[A-Za-z]{4,}", w)})

    documents = [text.split() for text in texts]
    documents = [words for words in documents if len(words) >= BOOLQ_PASSAGE_WORDS[1]]
    vocabulary = plain_words(w for words in documents for w in words)
    records = []
    while len(records) < count:
        words = rng.choice(documents)
        length = rng.randint(*BOOLQ_PASSAGE_WORDS)
        start = rng.randrange(len(words) - length + 1)
        passage = words[start:start + length]
        own = plain_words(passage)
        if rng.random() < 0.5 and own:
            word, label = rng.choice(own), 1
        else:
            word, label = rng.choice(vocabulary), 0
            # Not even inside a longer word ("list" in "lists"): the answer is plainly no.
            if any(word in w.lower() for w in passage):
                continue
        records.append({"question": f"does the passage mention {word}",
                        "passage": " ".join(passage), "label": label})
    return records


def _write_tfds_boolq(root: Path, splits: dict[str, list[dict]]) -> Path:
    """TFDS's super_glue/boolq/1.0.2 under `root`: each split's tf.train.Examples (bytes
    "question" and "passage", int "idx" and "label") in BOOLQ_SHARDS shards, and the
    metadata files TFDS writes beside them."""
    directory = tfds.builder_dir(root, tfds.BOOLQ)
    directory.mkdir(parents=True, exist_ok=True)
    split_infos = []
    for split, records in splits.items():
        examples = [tfds.serialize_example({
            "idx": [idx], "label": [record["label"]], "passage": [record["passage"].encode()],
            "question": [record["question"].encode()]}) for idx, record in enumerate(records)]
        num_shards = BOOLQ_SHARDS[split]
        per_shard = -(-len(examples) // num_shards)
        prefix = tfds.split_prefix(root, tfds.BOOLQ, split)
        for shard in range(num_shards):
            tfds.write_records(f"{prefix}-{shard:05d}-of-{num_shards:05d}",
                               examples[shard * per_shard:(shard + 1) * per_shard])
        split_infos.append({
            "name": split, "numBytes": str(sum(map(len, examples))),
            "shardLengths": [str(len(examples[i * per_shard:(i + 1) * per_shard]))
                             for i in range(num_shards)],
            "filepathTemplate": "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"})
    tfds.write_boolq_info(directory, split_infos)
    return directory


def write_boolq_sample(out_dir) -> tuple[Path, Path, tuple[int, int]]:
    """The BoolQ sample (see the module docstring) under `out_dir`: (out_dir, its vocabulary,
    the token ids of 'yes' and 'no' in it). The same files every time."""
    from tasks import boolq  # imports jax: only on this path
    from tasks.tokenizer import load_tokenizer

    out = Path(out_dir)
    docs = _documents()
    texts = {"train": [t for n, _, t in docs if not _held_out(n)],
             "validation": [t for n, _, t in docs if _held_out(n)]}
    splits = {split: _boolq_records(texts[split], BOOLQ_EXAMPLES[split], random.Random(split))
              for split in BOOLQ_EXAMPLES}
    _write_tfds_boolq(out, splits)
    # Trained on the training rows as the model reads them, answers included: frequent
    # enough that each answer is one piece.
    yes_word, no_word = boolq.ANSWER_WORDS
    rows = (boolq.format_input(boolq.BoolQExample(r["question"], r["passage"], bool(r["label"]),
                                                  0)) + " " + (yes_word if r["label"] else no_word)
            for r in splits["train"])
    vocab_path = train_sentencepiece(rows, VOCAB_SIZE, out / BOOLQ_VOCAB, num_threads=1)
    return out, vocab_path, boolq.answer_token_ids(load_tokenizer(vocab_path))


def main(argv):
    if len(argv) > 2:
        raise UserError(f"unexpected arguments {argv[2:]}; expected at most one, the cache "
                        f"directory of the sample corpus")
    if FLAGS.boolq_dir:
        out, vocab_path, (yes_id, no_id) = write_boolq_sample(FLAGS.boolq_dir)
        counts = ", ".join(f"{n} {split}" for split, n in BOOLQ_EXAMPLES.items())
        print(f"wrote BoolQ ({counts} examples) in TFDS's layout under "
              f"{tfds.builder_dir(out, tfds.BOOLQ)}, and {vocab_path}, in which the answers "
              f"'yes' and 'no' are the single tokens {yes_id} and {no_id}")
        print(f"TFDS_DATA_DIR={out} VOCAB_PATH={vocab_path}")
        return
    data_dir, vocab = ensure_sample_data(argv[1] if len(argv) > 1 else None)
    print(f"data_dir={data_dir} vocab_path={vocab}")


if __name__ == "__main__":
    flags.DEFINE_string("boolq_dir", None, "Write a BoolQ sample under this directory instead: "
                        "BoolQ in TFDS's layout (a TFDS_DATA_DIR) and boolq_spm.model, a "
                        "vocabulary in which 'yes' and 'no' are single tokens.")
    FLAGS = flags.FLAGS
    from tasks import cli

    cli.run(main)
