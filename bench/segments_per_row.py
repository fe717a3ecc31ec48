"""Documents per packed row, and what a segment bound (MAX_SEGMENTS_PER_SEQ) costs.

    python bench/segments_per_row.py                                # the built-in sample corpus
    python bench/segments_per_row.py --files 'DIR/pile/train/*.jsonl.zst' --vocab_path=P
    python bench/segments_per_row.py --pile_sample 4000000          # a Pile-shaped sample

For a corpus packed into rows of --seq_len tokens as training packs it (tasks/packing.py),
prints the segments per row without a bound (percentiles 50/90/99/99.9 and the most;
a segment is a document or the piece of one that a row holds, so 1 is a row inside one
long document), then, for each bound M in --bounds, the rows it cuts short (% of the
rows) and the padding it adds (% of the rows' tokens; rows without a bound hold no
padding), with the time the training input takes to find the rows (packed_rows).

Corpora: the sample corpus (tasks/sample_corpus.py) and --files are tokenized as the
training input tokenizes them (tasks/prepare.py; --files with --vocab_path's tokenizer, in
a cache under --cache_dir). --pile_sample N draws the lengths of N documents shaped like The
Pile's, no text, at --bytes_per_token (default 4) bytes a token:

- Each document comes from one of The Pile's 22 components, in proportion to its number
  of documents: raw size / mean document size, both from Table 1 of Gao et al., "The Pile:
  An 800GB Dataset of Diverse Text for Language Modeling" (arXiv 2101.00027); the table
  is _PILE below. That gives about 146M documents of 5.9 KiB on average.
- Table 1 gives each component's mean document size only, not the spread. A document's
  size is log-normal around its component's mean with --sigma (natural log, default
  1.5), an assumption: run 1.0 and 2.0 too to see how much the answer depends on it.
  Web text is about 1.0 (C4's median document is about 0.6 of its mean); code and
  forum components spread wider.
- Documents follow one another in random order, as in The Pile's shuffled train files.
"""

import argparse
import glob
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from tasks import layout  # noqa: E402
from tasks.input_pipeline import TokenStream, TokenStreamEos, packed_rows  # noqa: E402
from tasks.prepare import prepare  # noqa: E402
from tasks.sample_corpus import ensure_sample_data  # noqa: E402
from tasks.tokenizer import load_tokenizer  # noqa: E402

# The Pile's components (Gao et al. 2020, Table 1): raw size in GiB, mean document size in KiB.
_PILE = {
    "Pile-CC": (227.12, 4.33), "PubMed Central": (90.27, 30.55), "Books3": (100.96, 538.36),
    "OpenWebText2": (62.77, 3.85), "ArXiv": (56.21, 46.61), "Github": (95.16, 5.25),
    "FreeLaw": (51.15, 15.06), "StackExchange": (32.20, 2.16),
    "USPTO Backgrounds": (22.90, 4.08), "PubMed Abstracts": (19.26, 1.30),
    "Gutenberg (PG-19)": (10.88, 398.73), "OpenSubtitles": (12.98, 30.48),
    "Wikipedia (en)": (6.38, 1.11), "DM Mathematics": (7.75, 8.00),
    "Ubuntu IRC": (5.52, 545.48), "BookCorpus2": (6.30, 369.87), "EuroParl": (4.59, 68.87),
    "HackerNews": (3.90, 4.92), "YoutubeSubtitles": (3.73, 22.55), "PhilPapers": (2.38, 73.37),
    "NIH ExPorter": (1.89, 2.11), "Enron Emails": (0.88, 1.78),
}


def pile_sample(num_docs: int, sigma: float, bytes_per_token: float, seed: int):
    """(EOS positions [num_docs + 1], stream length) of `num_docs` Pile-shaped documents."""
    raw_gib, mean_kib = (np.array(column) for column in zip(*_PILE.values(), strict=True))
    counts = raw_gib * 2**20 / mean_kib  # documents per component
    rng = np.random.default_rng(seed)
    component = rng.choice(len(counts), size=num_docs, p=counts / counts.sum())  # [D]
    mean_tokens = mean_kib[component] * 1024 / bytes_per_token  # [D]
    # log-normal with that mean: mu = log(mean) - sigma^2 / 2
    tokens = np.exp(rng.normal(np.log(mean_tokens) - sigma**2 / 2, sigma))  # [D]
    lengths = np.maximum(1, np.round(tokens)).astype(np.int64) + 1  # [D] text, then EOS
    eos = np.concatenate([[0], np.cumsum(lengths)])  # the leading EOS, then each document's
    return eos, int(eos[-1]) + 1


def prepared_corpus(files, vocab_path: str, cache_dir):
    """(EOS positions, stream length) of `files` tokenized as the training input does."""
    vocab = load_tokenizer(vocab_path)
    shards = prepare(files, vocab, cache_dir, progress=False)
    stream = TokenStream(shards, vocab.eos_id)
    return TokenStreamEos(shards, stream).between(0, stream.num_tokens), stream.num_tokens


def report(eos: np.ndarray, num_tokens: int, seq_len: int, bounds: list[int]) -> None:
    rows = (num_tokens - 1) // seq_len
    starts = seq_len * np.arange(rows, dtype=np.int64)  # [R] rows without a bound
    segments = 1 + np.searchsorted(eos, starts + seq_len) - np.searchsorted(eos, starts, "right")
    print(f"{len(eos) - 1:,} documents, {num_tokens:,} tokens: {rows:,} rows of {seq_len}")
    if not rows:
        return
    p50, p90, p99, p999 = np.percentile(segments, [50, 90, 99, 99.9])
    print(f"segments per row without a bound: mean {segments.mean():.2f}, 50% {p50:g}, "
          f"90% {p90:g}, 99% {p99:g}, 99.9% {p999:g}, most {segments.max()}")
    print(f"{'M':>4} {'rows cut':>9} {'padding':>9} {'rows':>12} {'seconds':>8}")
    for m in bounds:
        t0 = time.perf_counter()
        bounded = packed_rows(lambda lo, hi: eos[np.searchsorted(eos, lo):np.searchsorted(eos, hi)],
                              num_tokens, seq_len, m)
        seconds = time.perf_counter() - t0
        runs_rows, runs_starts = bounded.run_rows, bounded.run_starts  # [runs]
        cut = runs_rows[1:] - 1  # [cuts] the cut rows
        cut_start = runs_starts[:-1] + (cut - runs_rows[:-1]) * seq_len  # [cuts]
        padding = int(np.sum(seq_len - (runs_starts[1:] - cut_start)))  # labels: end - start
        n = max(bounded.num_rows, 1)
        print(f"{m:>4} {100 * bounded.cut_rows / n:>8.3f}% {100 * padding / (n * seq_len):>8.3f}% "
              f"{bounded.num_rows:>12,} {seconds:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", help="Pile-format .jsonl/.jsonl.zst files (a glob); "
                        "default: the sample corpus")
    parser.add_argument("--vocab_path", help="the tokenizer of --files (default: the sample "
                        "corpus's SentencePiece model)")
    parser.add_argument("--cache_dir", help="where --files are tokenized (default: the token "
                        "cache, ~/.cache/paxloom/tokenized)")
    parser.add_argument("--pile_sample", type=int, default=0, metavar="N",
                        help="N Pile-shaped document lengths instead of files (see above)")
    parser.add_argument("--sigma", type=float, default=1.5,
                        help="--pile_sample: log-normal spread of document sizes")
    parser.add_argument("--bytes_per_token", type=float, default=4.0,
                        help="--pile_sample: bytes of text a token")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seq_len", type=int, default=2048)
    parser.add_argument("--bounds", default="4,8,16,32,64", help="values of M, comma-separated")
    args = parser.parse_args()
    bounds = [int(m) for m in args.bounds.split(",")]

    if args.pile_sample:
        print(f"Pile-shaped sample: sigma {args.sigma}, {args.bytes_per_token} bytes a token, "
              f"seed {args.seed}")
        eos, num_tokens = pile_sample(args.pile_sample, args.sigma, args.bytes_per_token,
                                      args.seed)
    else:
        data_dir, sample_vocab = ensure_sample_data()
        files = (sorted(glob.glob(args.files)) if args.files
                 else layout.pile_train_files(data_dir))
        if not files:
            sys.exit(f"--files={args.files!r} matches no file")
        print(f"{len(files)} file(s): {files[0]}{' ...' if len(files) > 1 else ''}")
        eos, num_tokens = prepared_corpus(files, args.vocab_path or str(sample_vocab),
                                          args.cache_dir)
    report(eos, num_tokens, args.seq_len, bounds)


if __name__ == "__main__":
    main()
