"""Turn token rows into model batches; pack a stream of documents into rows.

The packing convention (used by training, Pile eval and the raw reader alike):

- The token stream is `[EOS] doc_1 [EOS] doc_2 [EOS] ...`: every document ends
  with EOS and one extra EOS leads the stream.
- Row k is `stream[k*L : k*L + L + 1]` (L = seq_len): rows overlap by one token,
  `ids = row[:-1]` and `labels = row[1:]`, so every token after the leading EOS is
  a label exactly once and no token is lost at row boundaries. Long documents
  simply continue into the next row.
- Segments: the EOS that ends document k is, as an input token, the first token
  of document k+1's segment (it plays BOS). So a document's last token predicts
  EOS within its own segment, the EOS predicts the next document's first token
  without seeing the previous document, and attention never crosses documents.
  Within a row, `segment_ids` count 1, 2, 3, ... and `segment_pos` restarts at 0
  at each segment start (and at the row start, where a document may be cut).
- Padding (at the end of eval data, and of rows cut by a segment bound): ids =
  labels = PAD_ID (0), weight 0, paddings 1, segment id 0, segment position 0.
- A segment bound M (MAX_SEGMENTS_PER_SEQ; 0: none) caps the segments a row holds,
  a row's trailing padding counting as one: cuDNN's packed attention sizes its
  buffers by M. A row that would hold more is cut right after the EOS that ends its
  (M-1)-th segment: that EOS is the row's last real token (a label only), the row
  is padded to L+1, and the next row starts at that EOS, which plays its leading
  EOS. The rows after it continue every L tokens from there until the next cut.
  So every token is still a label exactly once, in order, and documents are split
  only where the rows' length splits them. Up to the first cut the rows are those
  without a bound, so a bound that cuts no row changes no row.

That is Pax's framing. Under ADD_BOS (paxloom/core/framing.py) every document brings a
BOS of its own, `BOS doc EOS` (or `BOS doc`), and nothing leads the stream: the same rows,
with the BOS in the EOS's place as the token that opens a segment (`eos_id` below is that
token, Framing.start_id; `lead=False`), and a BOS label gets weight 0
(`unlabelled_id`): no document's start is predicted from the one before it.
"""

from collections.abc import Iterable, Iterator

import numpy as np

from paxloom.core.errors import UserError
from tasks.vocab import PAD_ID

BATCH_KEYS = ("ids", "labels", "weights", "paddings", "segment_ids", "segment_pos")


def segments_from_eos(
    ids: np.ndarray, eos_id: int, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Segment ids and positions for packed rows.

    ids: [R, L] input ids; lengths: [R] number of real (non-padding) input positions.
    Returns (segment_ids, segment_pos), both [R, L] int32, 0 on padding.
    """
    rows, seq_len = ids.shape
    t = np.arange(seq_len)  # [L]
    real = t[None, :] < lengths[:, None]  # [R, L]
    starts = ids == eos_id  # [R, L]: an input EOS opens a new segment...
    starts[:, 0] = True  # ...and so does the row start, wherever it cuts the stream.
    segment_ids = np.cumsum(starts, axis=1, dtype=np.int32)  # [R, L]
    # Index of the most recent segment start at or before each position.
    last_start = np.maximum.accumulate(np.where(starts, t[None, :], 0), axis=1)  # [R, L]
    segment_pos = (t[None, :] - last_start).astype(np.int32)  # [R, L]
    segment_ids = np.where(real, segment_ids, 0).astype(np.int32)
    segment_pos = np.where(real, segment_pos, 0).astype(np.int32)
    return segment_ids, segment_pos


def make_batch(rows: np.ndarray, lengths: np.ndarray, eos_id: int, packed: bool = True,
               unlabelled_id: int | None = None) -> dict:
    """The batch dict for token rows.

    rows: [R, L+1] token ids (any int dtype), positions >= lengths[r] are padding.
    lengths: [R] real tokens per row, in 0..L+1 (a row of n tokens gives n-1 labels).
    eos_id: the token that opens a segment (Framing.start_id: EOS, or the BOS).
    packed: segments from EOS positions; otherwise one segment per row (segment
      id 1, positions 0..n-2) for rows that each hold one document.
    unlabelled_id: labels equal to it get weight 0 (Framing.unlabelled_id: the BOS).
    Returns ids, labels, segment_ids, segment_pos: [R, L] int32; weights, paddings: [R, L] float32.
    """
    rows = np.asarray(rows)
    lengths = np.asarray(lengths, dtype=np.int64)
    seq_len = rows.shape[1] - 1
    label_len = np.maximum(lengths - 1, 0)  # [R]
    real = np.arange(seq_len)[None, :] < label_len[:, None]  # [R, L]
    ids = np.where(real, rows[:, :-1], PAD_ID).astype(np.int32)  # [R, L]
    labels = np.where(real, rows[:, 1:], PAD_ID).astype(np.int32)  # [R, L]
    weights = real.astype(np.float32)  # [R, L]
    if unlabelled_id is not None:
        weights = np.where(labels == unlabelled_id, 0.0, weights).astype(np.float32)
    if packed:
        segment_ids, segment_pos = segments_from_eos(ids, eos_id, label_len)
    else:
        segment_ids = real.astype(np.int32)
        segment_pos = np.where(real, np.arange(seq_len, dtype=np.int32)[None, :], 0).astype(
            np.int32
        )
    return {
        "ids": ids,
        "labels": labels,
        "weights": weights,
        "paddings": 1.0 - real.astype(np.float32),
        "segment_ids": segment_ids,
        "segment_pos": segment_pos,
    }


def pad_batch_rows(
    rows: np.ndarray, lengths: np.ndarray, num_rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """Append all-padding rows (length 0) so that there are `num_rows` rows."""
    missing = num_rows - rows.shape[0]
    if missing <= 0:
        return rows, lengths
    rows = np.concatenate([rows, np.full((missing, rows.shape[1]), PAD_ID, rows.dtype)])
    lengths = np.concatenate([lengths, np.zeros(missing, lengths.dtype)])
    return rows, lengths


def count_segments(segment_ids: np.ndarray) -> np.ndarray:
    """[R] segments per row of [R, L] segment ids, as the attention sees them: maximal runs
    of equal ids, so a row's trailing padding (id 0) is one more."""
    segment_ids = np.asarray(segment_ids)
    return 1 + np.count_nonzero(segment_ids[:, 1:] != segment_ids[:, :-1], axis=1)


def check_segment_bound(batch: dict, max_segments: int, source: str) -> None:
    """UserError, in one line, if a row of `batch` holds more than `max_segments`
    segments (count_segments; 0: no bound). `source` names the data (dataset or file).
    The packers here never make such rows; data that arrive packed may hold them, and
    cuDNN's packed attention would drop the segments past the bound."""
    if max_segments <= 0:
        return
    counts = count_segments(batch["segment_ids"])  # [R]
    over = counts > max_segments
    if over.any():
        raise UserError(
            f"{source}: {int(over.sum())} of {len(counts)} rows hold more than "
            f"MAX_SEGMENTS_PER_SEQ={max_segments} segments (up to {int(counts.max())}, a "
            f"row's trailing padding counting as one); raise --fdl.MAX_SEGMENTS_PER_SEQ to at "
            f"least {int(counts.max())} or re-pack the data with at most {max_segments} "
            f"documents a row ({max_segments - 1} in a row that ends in padding)")


def _cut(ids: np.ndarray, eos_id: int, max_documents: int, max_segments: int) -> int | None:
    """Where a row whose inputs are `ids` (its first token a row start) must end under the
    bound: the index in `ids` of the EOS ending its (max_segments-1)-th segment, or None
    when the row holds at most `max_documents` segments (max_segments for a full row,
    one fewer for a padded one)."""
    eos = np.flatnonzero(ids[1:] == eos_id) + 1  # every input EOS but the first token opens one
    if 1 + len(eos) <= max_documents:
        return None
    return int(eos[max_segments - 2])


def pack_documents(
    docs: Iterable[np.ndarray], seq_len: int, eos_id: int, keep_last_partial: bool = False,
    max_segments: int = 0, lead: bool = True,
) -> Iterator[tuple[np.ndarray, int]]:
    """Pack tokenized documents (each already framed: ending in EOS, or starting with the
    BOS `eos_id` when not `lead`) into rows.

    Yields (row [L+1], n_real): rows follow the convention in the module docstring.
    lead: one `eos_id` before the first document (Framing.leads).
    The final partial row (fewer than L+1 tokens) is dropped unless
    keep_last_partial, in which case it comes padded with its real length.
    max_segments: the segment bound M (0: none; else at least 2); rows it cuts come
    padded with their real length.
    """
    if max_segments < 0 or max_segments == 1:
        raise ValueError(f"max_segments={max_segments} must be 0 (no bound) or at least 2")
    width = seq_len + 1

    def padded(start: int, stop: int) -> tuple[np.ndarray, int]:
        row = np.full(width, PAD_ID, np.int64)
        row[: stop - start] = buf[start:stop]
        return row, stop - start

    buf = np.empty(max(4 * width, 1 << 16), np.int64)
    buf[0] = eos_id  # the leading EOS: the first document's first token gets a label too
    n = 1 if lead else 0
    for doc in docs:
        doc = np.asarray(doc)
        if n + len(doc) > len(buf):
            bigger = np.empty(max(2 * len(buf), n + len(doc)), np.int64)
            bigger[:n] = buf[:n]
            buf = bigger
        buf[n : n + len(doc)] = doc
        n += len(doc)
        start = 0
        while n - start >= width:
            cut = (_cut(buf[start : start + seq_len], eos_id, max_segments, max_segments)
                   if max_segments else None)
            if cut is None:
                yield buf[start : start + width].copy(), width
                start += seq_len  # overlap one token: the last label is the next row's first id
            else:
                yield padded(start, start + cut + 1)
                start += cut  # the cut's EOS is the next row's leading EOS
        if start:
            buf[: n - start] = buf[start:n]
            n -= start
    start = 0
    while keep_last_partial and n - start > 1:
        cut = (_cut(buf[start : n - 1], eos_id, max_segments - 1, max_segments)
               if max_segments else None)
        if cut is None:
            yield padded(start, n)
            return
        yield padded(start, start + cut + 1)
        start += cut
