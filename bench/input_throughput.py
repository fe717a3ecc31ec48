"""Input pipeline throughput, tokens per second for one process.

    python bench/input_throughput.py [--mb 8] [--seq_len 2048] [--rows 32] [--vocab_path P]

Builds a Pile-format corpus of about --mb MB of JSON text (the sample corpus's Python
documentation, paragraphs reshuffled and repeated) in a temporary directory and
measures, on one process:

  raw       read .jsonl.zst, tokenize on the fly (one thread), pack, make batches
            (what PileEvalInput does, and what training would cost without prepare)
  prepare   python -m tasks.prepare: tokenize into shards, all CPUs
  prepared  PileTrainInput.next_batch from memory-mapped shards, shuffled rows

Files are fresh, so they sit in the page cache: the prepared figure is the
pipeline's own cost, not the disk's. A training step on one GPU consumes
rows*seq_len tokens; the prepared path must stay far above that rate.
"""

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import zstandard  # noqa: E402

from tasks import layout  # noqa: E402
from tasks.input_pipeline import PileTrainInput, raw_rows  # noqa: E402
from tasks.packing import make_batch  # noqa: E402
from tasks.prepare import prepare  # noqa: E402
from tasks.sample_corpus import ensure_sample_data  # noqa: E402
from tasks.text_formats import iter_documents  # noqa: E402
from tasks.train_vocab import train_sentencepiece  # noqa: E402
from tasks.vocab import load_vocabulary  # noqa: E402


def build_corpus(out: Path, megabytes: float, shards: int) -> list[Path]:
    """~megabytes of Pile-format text split over `shards` .jsonl.zst files."""
    sample_dir, _ = ensure_sample_data()
    paragraphs = [
        p
        for f in layout.pile_train_files(sample_dir)
        for doc in iter_documents(f)
        for p in doc.split("\n\n")
        if p.strip()
    ]
    rng = random.Random(0)
    target = int(megabytes * 1e6 / shards)
    files = []
    for s in range(shards):
        lines, size = [], 0
        while size < target:
            doc = "\n\n".join(rng.sample(paragraphs, rng.randint(2, 30)))
            line = json.dumps({"text": doc, "meta": {"pile_set_name": "Bench"}})
            lines.append(line)
            size += len(line)
        path = out / "pile" / "train" / f"{s:02d}.jsonl.zst"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(
            zstandard.ZstdCompressor(level=3, write_checksum=True).compress(
                ("\n".join(lines) + "\n").encode()
            )
        )
        files.append(path)
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=8.0, help="corpus size in MB of JSON text")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--seq_len", type=int, default=2048)
    parser.add_argument(
        "--rows", type=int, default=32, help="rows per batch (this process's share)"
    )
    parser.add_argument(
        "--vocab_path", help="SentencePiece model (default: an 8192-piece BPE trained here)"
    )
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="time spent on the prepared measurement"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        files = build_corpus(tmp, args.mb, args.shards)
        if args.vocab_path:
            vocab = load_vocabulary(args.vocab_path)
        else:
            texts = (t for f in files[:1] for t in iter_documents(f))
            vocab = load_vocabulary(
                train_sentencepiece(texts, 8192, tmp / "bench.model", max_sentences=200_000)
            )
        mb = sum(f.stat().st_size for f in files) / 1e6
        print(
            f"corpus: {args.shards} files, {mb:.1f} MB zstd; vocab {vocab.vocab_size} pieces; "
            f"seq_len {args.seq_len}, {args.rows} rows/batch; {os.cpu_count()} CPUs"
        )

        # raw: read, tokenize (1 thread), pack, batch
        t0 = time.perf_counter()
        tokens, rows, lengths = 0, [], []
        for row, n in raw_rows(files, vocab, args.seq_len):
            rows.append(row)
            lengths.append(n)
            if len(rows) == args.rows:
                tokens += int(
                    make_batch(np.stack(rows), np.array(lengths), vocab.eos_id)["weights"].sum()
                )
                rows, lengths = [], []
        raw_s = time.perf_counter() - t0
        print(f"raw       {tokens / raw_s:>14,.0f} tokens/s  ({tokens:,} tokens in {raw_s:.1f} s)")

        t0 = time.perf_counter()
        shards = prepare(files, vocab, workers=None, progress=False)
        prep_s = time.perf_counter() - t0
        total = sum(s.num_tokens for s in shards)
        print(
            f"prepare   {total / prep_s:>14,.0f} tokens/s  ({total:,} tokens in {prep_s:.1f} s, "
            f"{min(os.cpu_count() or 1, len(files))} workers)"
        )

        inp = PileTrainInput(files, vocab, args.seq_len, args.rows, (0, args.rows), seed=0)
        inp.next_batch()  # warm the permutation
        t0 = time.perf_counter()
        batches = 0
        while time.perf_counter() - t0 < args.seconds:
            inp.next_batch()
            batches += 1
        read_s = time.perf_counter() - t0
        tokens = batches * args.rows * args.seq_len
        print(
            f"prepared  {tokens / read_s:>14,.0f} tokens/s  ({batches} batches of {args.rows}x{args.seq_len} "
            f"in {read_s:.1f} s, {1e3 * read_s / batches:.2f} ms/batch)"
        )


if __name__ == "__main__":
    main()
