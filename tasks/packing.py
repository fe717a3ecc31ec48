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
- Padding (only at the end of eval data): ids = labels = PAD_ID (0), weight 0,
  paddings 1, segment id 0, segment position 0.
"""

from collections.abc import Iterable, Iterator

import numpy as np

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


def make_batch(rows: np.ndarray, lengths: np.ndarray, eos_id: int, packed: bool = True) -> dict:
    """The batch dict for token rows.

    rows: [R, L+1] token ids (any int dtype), positions >= lengths[r] are padding.
    lengths: [R] real tokens per row, in 0..L+1 (a row of n tokens gives n-1 labels).
    packed: segments from EOS positions; otherwise one segment per row (segment
      id 1, positions 0..n-2) for rows that each hold one document.
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
        "paddings": 1.0 - weights,
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


def pack_documents(
    docs: Iterable[np.ndarray], seq_len: int, eos_id: int, keep_last_partial: bool = False
) -> Iterator[tuple[np.ndarray, int]]:
    """Pack tokenized documents (each already ending in EOS) into rows.

    Yields (row [L+1], n_real): rows follow the convention in the module docstring.
    The final partial row (fewer than L+1 tokens) is dropped unless
    keep_last_partial, in which case it comes padded with its real length.
    """
    width = seq_len + 1
    buf = np.empty(max(4 * width, 1 << 16), np.int64)
    buf[0] = eos_id  # the leading EOS: the first document's first token gets a label too
    n = 1
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
            yield buf[start : start + width].copy(), width
            start += seq_len  # overlap one token: the last label is the next row's first id
        if start:
            buf[: n - start] = buf[start:n]
            n -= start
    if keep_last_partial and n > 1:
        row = np.full(width, PAD_ID, np.int64)
        row[:n] = buf[:n]
        yield row, n
