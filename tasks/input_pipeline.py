"""Deterministic, restartable, multi-process input for training and Pile evaluation.

Training (`PileTrainInput`) reads prepared token shards (tasks/prepare.py; made on
first use if missing) through memory maps. The stream `[EOS] doc [EOS] doc ...`
is cut into sequences as described in tasks/packing.py: row k at k*L, or, under a
segment bound that cuts some rows (MAX_SEGMENTS_PER_SEQ), where `packed_rows` finds
it from the documents' ends, stored as runs of rows L apart between cut rows (a
few bytes per cut row, found in seconds for The Pile). Global batch k is

    epoch, i = divmod(k, batches_per_epoch)
    sequences perm_epoch[i*G : (i+1)*G]          G = global_batch_size

where perm_epoch is a pseudo-random permutation of all sequence indices keyed by
(seed, epoch). It is a 4-round Feistel network with cycle walking rather than a
stored shuffle: computing G entries costs O(G) time and no memory, while a stored
permutation of The Pile's ~150M sequences would take over 1 GB per process and
seconds to build each epoch. A process gets rows [process_rows[0]:process_rows[1]]
of every global batch and reads only those sequences' tokens, so processes read
disjoint slices whose union is the global batch. The state is the global batch
index alone, identical on every process, so a run restarts with exactly the next
batch, even with a different number of processes. The sequences left over after
the last full batch of an epoch (fewer than G) are skipped in that epoch; the
next epoch's permutation differs, so no sequence is skipped for good.

Evaluation (`PileEvalInput`) tokenizes the beginning of the raw validation file on
the fly, packs it the same way in file order, keeps the first `num_batches`
batches in memory and replays them on every evaluation.
"""

import array
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from paxloom.core.errors import UserError
from paxloom.core.framing import framing_of
from paxloom.core.log import log
from tasks.packing import make_batch, pack_documents, pad_batch_rows
from tasks.prepare import PreparedFile, Tokenizer, prepare
from tasks.text_formats import TextFormat
from tasks.vocab import PAD_ID

_DEFAULT_FORMAT = TextFormat()

_ENCODE_BATCH_DOCS = 256


class FeistelPermutation:
    """A bijection of [0, n) keyed by `key`, evaluated on arrays of indices."""

    ROUNDS = 4

    def __init__(self, n: int, key):
        self.n = int(n)
        bits = max(2, (self.n - 1).bit_length())
        bits += bits % 2  # balanced halves
        self.half = np.uint64(bits // 2)
        self.mask = np.uint64((1 << (bits // 2)) - 1)
        self.keys = np.random.default_rng(key).integers(
            0, 1 << 63, size=self.ROUNDS, dtype=np.uint64
        )

    def _f(self, r: np.ndarray, k: np.uint64) -> np.ndarray:
        # splitmix64's finaliser: cheap, and mixes every input bit into the low bits.
        x = (r ^ k) * np.uint64(0x9E3779B97F4A7C15)
        x ^= x >> np.uint64(29)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(32)
        return x & self.mask

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        for k in self.keys:
            left, right = right, left ^ self._f(right, k)
        return (left << self.half) | right

    def __call__(self, indices) -> np.ndarray:
        x = self._encrypt(np.asarray(indices, np.uint64))
        # Cycle walking: the network permutes [0, 4^half) >= n; re-encrypting values
        # outside [0, n) until they land inside keeps it a bijection of [0, n).
        while (outside := x >= self.n).any():
            x[outside] = self._encrypt(x[outside])
        return x.astype(np.int64)


class TokenStream:
    """The virtual concatenation `[EOS] + shard_0 + shard_1 + ...` over memory-mapped shards
    (with `lead=False`, under ADD_BOS, no leading token: each document starts with its BOS)."""

    def __init__(self, shards: list[PreparedFile], eos_id: int, lead: bool = True):
        self.pieces = ([np.array([eos_id] if lead else [], np.uint32)]
                       + [s.tokens() for s in shards])
        lengths = [len(p) for p in self.pieces]
        self.starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # [pieces + 1]
        self.num_tokens = int(self.starts[-1])

    def read(self, start: int, length: int) -> np.ndarray:
        """[length] int64 tokens stream[start : start + length] (must lie inside the stream)."""
        out = np.empty(length, np.int64)
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        filled = 0
        while filled < length:
            offset = start + filled - self.starts[i]
            chunk = self.pieces[i][offset : offset + length - filled]
            out[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
            i += 1
        return out


def _unpacked_sequences(shards: list[PreparedFile], stream: TokenStream, seq_len: int,
                        lead: bool = True):
    """(starts, lengths) [num_sequences] int64 of one-document rows for packed=False.

    Document d occupies stream[s_d : e_d] (its EOS included) and is preceded by an
    EOS, so `stream[s_d - 1 : e_d]` is the document with its BOS-like EOS; it is
    cut into ceil((e_d - s_d) / L) rows of up to L+1 tokens, overlapping by one.
    Without `lead` (ADD_BOS) the document starts with its own BOS: its rows cut
    `stream[s_d : e_d]`.
    """
    doc_starts, doc_ends = [], []
    for j, shard in enumerate(shards):
        ends = np.asarray(shard.doc_ends(), np.int64) + stream.starts[j + 1]
        doc_ends.append(ends)
        doc_starts.append(np.concatenate([[stream.starts[j + 1]], ends[:-1]]))
    doc_starts, doc_ends = np.concatenate(doc_starts), np.concatenate(doc_ends)  # [D]
    doc_starts = doc_starts - int(lead)  # [D] each document's first input token
    chunks = -(-(doc_ends - doc_starts - 1) // seq_len)  # [D]
    doc_of_chunk = np.repeat(np.arange(len(chunks)), chunks)  # [S]
    chunk_in_doc = np.arange(len(doc_of_chunk)) - np.repeat(
        np.cumsum(chunks) - chunks, chunks
    )  # [S]
    starts = doc_starts[doc_of_chunk] + chunk_in_doc * seq_len  # [S]
    lengths = np.minimum(seq_len + 1, doc_ends[doc_of_chunk] - starts)  # [S]
    return starts, lengths


class TokenStreamEos:
    """Positions of the EOS tokens of a TokenStream, read from the shards' document ends
    (memory-mapped), a window at a time: the leading EOS at 0, then each document's last.
    With `lead=False` (ADD_BOS), the BOS tokens that open the segments instead: each
    document's first."""

    def __init__(self, shards: list[PreparedFile], stream: TokenStream, lead: bool = True):
        self.starts = stream.starts
        self.ends = [shard.doc_ends() for shard in shards]  # [num_docs] int64 each, exclusive
        self.lead = lead

    def between(self, lo: int, hi: int) -> np.ndarray:
        """[n] int64: the stream positions p of EOS tokens with lo <= p < hi, ascending."""
        parts = [np.zeros(1, np.int64)] if self.lead and lo <= 0 < hi else []
        first = max(1, int(np.searchsorted(self.starts, lo, side="right")) - 1)
        for i in range(first, len(self.starts) - 1):
            base = int(self.starts[i])
            if base >= hi:
                break
            ends = self.ends[i - 1]  # piece i is shard i-1; its EOS are at base + end - 1
            if self.lead:
                a, b = np.searchsorted(ends, [lo - base + 1, hi - base + 1])
                parts.append(np.asarray(ends[a:b], np.int64) + (base - 1))
                continue
            # Its BOS: at base (its first document) and where each other one ends.
            if len(ends) and lo <= base < hi:
                parts.append(np.array([base], np.int64))
            a, b = np.searchsorted(ends[:-1], [max(lo - base, 1), hi - base])
            parts.append(np.asarray(ends[a:b], np.int64) + base)
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)


class PackedRows:
    """The packed rows of a stream under a segment bound (tasks/packing.py): runs of rows
    L tokens apart, each run but the last ended by a row cut short. Only each run's first
    row index and stream position are stored, so memory grows with the cut rows alone.

    run_rows, run_starts: [runs] int64; run r's rows are run_rows[r] .. run_rows[r+1]-1,
    the last of them the cut row, which ends (inclusive) where run r+1 starts.
    """

    def __init__(self, run_rows, run_starts, num_rows: int, seq_len: int):
        self.run_rows = np.asarray(run_rows, np.int64)  # [runs]
        self.run_starts = np.asarray(run_starts, np.int64)  # [runs]
        self.num_rows = int(num_rows)
        self.seq_len = int(seq_len)

    @property
    def cut_rows(self) -> int:
        return len(self.run_rows) - 1

    def span(self, row: int) -> tuple[int, int]:
        """(start, real tokens) of `row` in the stream."""
        run = int(np.searchsorted(self.run_rows, row, side="right")) - 1
        start = int(self.run_starts[run]) + (row - int(self.run_rows[run])) * self.seq_len
        if run + 1 < len(self.run_rows) and row == self.run_rows[run + 1] - 1:
            return start, int(self.run_starts[run + 1]) - start + 1  # cut after that EOS
        return start, self.seq_len + 1


_FIRST_WINDOW = 64  # rows tested at once after a cut; doubled while none is cut
_MAX_WINDOW = 1 << 16
_READ_ROWS = 4096  # EOS positions are read for at least this many rows at a time


def packed_rows(eos_between, num_tokens: int, seq_len: int, max_segments: int) -> PackedRows:
    """The full rows of a stream of `num_tokens` tokens under the segment bound
    `max_segments` (>= 2), as tasks/packing.py's pack_documents makes them (its final
    partial row dropped). `eos_between(lo, hi)` gives the EOS positions in [lo, hi)
    (TokenStreamEos.between).

    A row starting at s holds 1 + (EOS in stream[s+1 : s+L]) segments. The walk tests a
    window of the run's next rows at once (searchsorted over the EOS positions), doubling
    it while none is cut. After a cut the next row starts at an EOS; where that row is
    cut too (a stretch of short documents), the rows starting at EOS e, e+M-1,
    e+2(M-1), ... are tested at once. The time grows with the rows and with the runs
    between cuts (some microseconds each).
    """
    if max_segments < 2:
        raise ValueError(f"max_segments={max_segments} must be at least 2")
    L, M = int(seq_len), int(max_segments)
    run_rows, run_starts = array.array("q", [0]), array.array("q", [0])
    start, row, window = 0, 0, _FIRST_WINDOW  # the next row's stream position and index
    offsets = L * np.arange(_MAX_WINDOW, dtype=np.int64)
    beyond = np.full(M, num_tokens + L, np.int64)  # positions past every row's inputs
    eos, hi = beyond, 0  # the EOS positions in [start, hi) (read ahead), then `beyond`
    while (limit := (num_tokens - 1 - start) // L) > 0:  # full rows left from `start`
        m = min(window, limit)
        if start + m * L > hi:
            hi = start + min(max(m, _READ_ROWS), limit) * L
            eos = np.concatenate([eos_between(start, hi), beyond])  # [E + M] ascending
        rows = start + offsets[:m]  # [m]
        first = eos.searchsorted(rows, "right")  # [m] each row's first EOS after its start
        over = eos[first + (M - 1)] < rows + L  # [m]: its M-th lies among its inputs
        j = int(over.argmax())
        if not over[j]:
            row, start, window = row + m, start + m * L, min(2 * window, _MAX_WINDOW)
            continue
        e = int(first[j]) + M - 2  # the cut row's last token: the EOS ending its (M-1)-th
        row, start, window = row + j + 1, int(eos[e]), _FIRST_WINDOW
        run_rows.append(row)
        run_starts.append(start)
        if j:
            continue
        # Two cuts in a row: test the rows starting at EOS e, e+M-1, ... at once.
        x = np.arange(e, len(eos) - M, M - 1)  # [C]
        cut = (eos[x + M] < eos[x] + L) & (eos[x] + L <= hi)  # [C]
        c = len(cut) if cut.all() else int(cut.argmin())
        if c:
            ends = eos[x[:c] + M - 1]  # [c]
            run_rows.extend(range(row + 1, row + c + 1))
            run_starts.frombytes(ends.tobytes())
            row, start = row + c, int(ends[-1])
    return PackedRows(np.frombuffer(run_rows, np.int64), np.frombuffer(run_starts, np.int64),
                      row, L)


class PileTrainInput:
    """Shuffled, packed training batches for rows [process_rows[0]:process_rows[1]] of each global batch.

    files: raw text files (tasks.layout.pile_train_files, or tasks.text_formats.expand_files
      for a user's corpus), read as `text_format` says; they are tokenized once into
      `cache_dir` (default: the token cache, tasks/prepare.py) if not yet prepared.
    packed: pack documents across rows (the default). With packed=False each row
      holds (a piece of) one document, padded; long documents still span rows.
    max_segments: with packed, the most segments a row holds (MAX_SEGMENTS_PER_SEQ,
      tasks/packing.py; 0: no bound). The rows it cuts shift the rows after them, so
      rows are found from the documents' ends (packed_rows); where it cuts none, the
      rows are those of no bound.
    """

    def __init__(
        self,
        files,
        vocab: Tokenizer,
        seq_len: int,
        global_batch_size: int,
        process_rows: tuple[int, int],
        seed: int,
        packed: bool = True,
        cache_dir=None,
        workers: int | None = None,
        text_format: TextFormat = _DEFAULT_FORMAT,
        max_segments: int = 0,
    ):
        lo, hi = process_rows
        if max_segments < 0 or max_segments == 1:
            raise ValueError(f"max_segments={max_segments} must be 0 (no bound) or at least 2")
        if not 0 <= lo < hi <= global_batch_size:
            raise ValueError(
                f"process_rows={process_rows} is not a slice of a global batch of {global_batch_size}"
            )
        self.vocab = vocab
        self.seq_len = int(seq_len)
        self.global_batch_size = int(global_batch_size)
        self.process_rows = (int(lo), int(hi))
        self.seed = int(seed)
        self.packed = bool(packed)
        self.max_segments = int(max_segments)
        self.text_format = text_format
        self.shards = prepare(files, vocab, cache_dir, workers, text_format=text_format)
        self.framing = framing_of(vocab)
        lead = self.framing.leads
        self.stream = TokenStream(self.shards, self.framing.start_id, lead)
        self._rows = None  # PackedRows where the bound cuts a row; else rows are k*L
        if self.packed:
            self.num_sequences = (self.stream.num_tokens - 1) // self.seq_len
            self._starts = self._lengths = None
            if self.max_segments:
                rows = packed_rows(TokenStreamEos(self.shards, self.stream, lead).between,
                                   self.stream.num_tokens, self.seq_len, self.max_segments)
                if rows.cut_rows:
                    self._rows, self.num_sequences = rows, rows.num_rows
        else:
            self._starts, self._lengths = _unpacked_sequences(
                self.shards, self.stream, self.seq_len, lead
            )
            self.num_sequences = len(self._starts)
        self.batches_per_epoch = self.num_sequences // self.global_batch_size
        if self.batches_per_epoch == 0:
            raise UserError(
                f"the train files ({Path(self.shards[0].source).parent}) hold {self.stream.num_tokens:,} tokens, "
                f"{self.num_sequences} sequences of {self.seq_len}, fewer than one global batch of "
                f"{self.global_batch_size}; add data or lower the batch size or MAX_SEQ_LEN"
            )
        self.batch_index = 0
        self._perm_epoch = None
        self._perm = None
        log(f"training data: {len(self.shards)} file(s), "
            f"{sum(s.num_docs for s in self.shards):,} documents, "
            f"{self.stream.num_tokens:,} tokens: {self.num_sequences:,} "
            f"{'packed' if self.packed else 'unpacked'} sequences of {self.seq_len}"
            + (f" ({self._rows.cut_rows:,} cut short by MAX_SEGMENTS_PER_SEQ="
               f"{self.max_segments})" if self._rows is not None else "") + ", "
            f"{self.batches_per_epoch:,} steps per epoch of {self.global_batch_size}")

    def _permutation(self, epoch: int) -> FeistelPermutation:
        if self._perm_epoch != epoch:
            self._perm = FeistelPermutation(self.num_sequences, [self.seed % (1 << 63), epoch])
            self._perm_epoch = epoch
        return self._perm

    def sequences_of_batch(self, batch_index: int) -> np.ndarray:
        """[rows] indices of the sequences this process reads for global batch `batch_index`."""
        epoch, i = divmod(batch_index, self.batches_per_epoch)
        lo, hi = self.process_rows
        positions = np.arange(i * self.global_batch_size + lo, i * self.global_batch_size + hi)
        return self._permutation(epoch)(positions)

    def _row_span(self, seq: int) -> tuple[int, int]:
        if self._rows is not None:
            return self._rows.span(seq)
        if self.packed:
            return seq * self.seq_len, self.seq_len + 1
        return int(self._starts[seq]), int(self._lengths[seq])

    def next_batch(self) -> dict:
        """The next batch: ids, labels, segment_ids, segment_pos [rows, seq_len] int32; weights, paddings float32."""
        seqs = self.sequences_of_batch(self.batch_index)
        rows = np.full((len(seqs), self.seq_len + 1), PAD_ID, np.int64)  # [rows, L+1]
        lengths = np.empty(len(seqs), np.int64)  # [rows]
        for r, seq in enumerate(seqs):
            start, n = self._row_span(int(seq))
            rows[r, :n] = self.stream.read(start, n)
            lengths[r] = n
        self.batch_index += 1
        return make_batch(rows, lengths, self.framing.start_id, packed=self.packed,
                          unlabelled_id=self.framing.unlabelled_id)

    def __iter__(self) -> Iterator[dict]:
        while True:
            yield self.next_batch()

    def get_state(self) -> dict:
        """JSON-serialisable position: the same on every process. `max_segments` is the
        bound that shaped the rows: 0 where it cut none (the rows of no bound), so a
        changed bound that cuts no row still continues the same data order."""
        return {
            "batch_index": self.batch_index,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "global_batch_size": self.global_batch_size,
            "packed": self.packed,
            "num_sequences": self.num_sequences,
            "max_segments": self.max_segments if self._rows is not None else 0,
        }

    def set_state(self, state: dict) -> None:
        """Continue after the batch where get_state() was taken; UserError if the data order would differ."""
        mine = self.get_state()
        # max_segments only where saved (states from before the bound lack it), and before
        # num_sequences, which a bound that cuts rows changes too.
        for key in ("seed", "seq_len", "global_batch_size", "packed", "max_segments",
                    "num_sequences"):
            if key not in state or state[key] == mine[key]:
                continue
            if key == "max_segments":
                raise UserError(self._other_bound(state[key]))
            raise UserError(
                f"the checkpointed input state has {key}={state[key]!r} but this run has {key}={mine[key]!r}, "
                "so it would not continue the same data order; restore with the original settings and data "
                "or start a new --job_log_dir"
            )
        self.batch_index = int(state["batch_index"])

    def _other_bound(self, saved: int) -> str:
        def rows(bound: int) -> str:
            return f"cut at MAX_SEGMENTS_PER_SEQ={bound}" if bound else "not cut"

        restore = (f"--fdl.MAX_SEGMENTS_PER_SEQ={saved}" if saved
                   else "the original MAX_SEGMENTS_PER_SEQ (one that cuts no row)")
        return (f"the checkpointed input's rows were {rows(saved)} but this run's, with "
                f"MAX_SEGMENTS_PER_SEQ={self.max_segments}, are {rows(self.get_state()['max_segments'])}, "
                f"so it would not continue the same data order; restore with {restore} or start a "
                f"new --job_log_dir")


def raw_rows(
    files: Iterable,
    vocab: Tokenizer,
    seq_len: int,
    keep_last_partial: bool = False,
    num_threads: int = 1,
    text_format: TextFormat = _DEFAULT_FORMAT,
    max_segments: int = 0,
) -> Iterator[tuple[np.ndarray, int]]:
    """Packed (row [L+1], n_real) from raw files in order, tokenizing on the fly, at most
    `max_segments` segments a row (0: no bound; tasks/packing.py)."""

    framing = framing_of(vocab)

    def docs():
        for path in files:
            batch = []
            for text in text_format.documents(path):
                batch.append(text)
                if len(batch) == _ENCODE_BATCH_DOCS:
                    yield from map(framing.document, vocab.encode_batch(batch, num_threads))
                    batch = []
            yield from map(framing.document, vocab.encode_batch(batch, num_threads))

    return pack_documents(docs(), seq_len, framing.start_id, keep_last_partial, max_segments,
                          lead=framing.leads)


class PileEvalInput:
    """The first `num_batches` packed batches of the validation file(s), the same every evaluation.

    Iterating yields this process's rows of each batch. When the file runs out,
    the last batch is padded with all-padding rows (weight 0) and there are fewer
    batches; `num_batches=None` takes the whole file. `max_segments`: the most segments a
    row holds (MAX_SEGMENTS_PER_SEQ; 0: no bound).
    """

    def __init__(
        self,
        files,
        vocab: Tokenizer,
        seq_len: int,
        batch_size: int,
        num_batches: int | None,
        process_rows: tuple[int, int] | None = None,
        text_format: TextFormat = _DEFAULT_FORMAT,
        max_segments: int = 0,
    ):
        lo, hi = process_rows if process_rows is not None else (0, batch_size)
        if not 0 <= lo < hi <= batch_size:
            raise ValueError(
                f"process_rows={process_rows} is not a slice of a batch of {batch_size}"
            )
        if num_batches is not None and num_batches < 1:
            raise ValueError(
                f"num_batches={num_batches} must be at least 1 (or None for the whole file)"
            )
        self.files = [Path(files)] if isinstance(files, (str, Path)) else [Path(f) for f in files]
        self.vocab = vocab
        self.seq_len = int(seq_len)
        self.batch_size = int(batch_size)
        self.num_batches = num_batches
        self.process_rows = (lo, hi)
        self.text_format = text_format
        self.max_segments = int(max_segments)
        self._batches: list[dict] | None = None

    def _build(self) -> list[dict]:
        limit = None if self.num_batches is None else self.num_batches * self.batch_size
        rows, lengths = [], []
        for row, n in raw_rows(self.files, self.vocab, self.seq_len, keep_last_partial=True,
                               text_format=self.text_format, max_segments=self.max_segments):
            rows.append(row)
            lengths.append(n)
            if limit is not None and len(rows) == limit:
                break
        batches = []
        lo, hi = self.process_rows
        for b in range(0, len(rows), self.batch_size):
            batch_rows, batch_lengths = pad_batch_rows(
                np.stack(rows[b : b + self.batch_size]),
                np.asarray(lengths[b : b + self.batch_size]),
                self.batch_size,
            )
            framing = framing_of(self.vocab)
            batches.append(make_batch(batch_rows[lo:hi], batch_lengths[lo:hi], framing.start_id,
                                      unlabelled_id=framing.unlabelled_id))
        return batches

    def __iter__(self) -> Iterator[dict]:
        if self._batches is None:
            self._batches = self._build()
        return iter(self._batches)

    def __len__(self) -> int:
        if self._batches is None:
            self._batches = self._build()
        return len(self._batches)
