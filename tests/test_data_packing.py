"""Packing: token conservation, the shifted ids/labels, segment ids and positions, padding."""

import numpy as np

from tasks.packing import BATCH_KEYS, make_batch, pack_documents, pad_batch_rows

EOS = 1


def _docs(lengths, start=10):
    """Documents of distinct tokens, each ending in EOS."""
    docs, t = [], start
    for n in lengths:
        docs.append(list(range(t, t + n - 1)) + [EOS])
        t += n - 1
    return docs


def test_hand_made_rows_and_segments():
    # stream: E 10 11 12 E 13 14 E 15 16 17 18 19 20 E
    docs = _docs([4, 3, 7])
    rows = list(pack_documents(docs, seq_len=5, eos_id=EOS, keep_last_partial=True))
    stream = [EOS] + sum(docs, [])
    assert [r.tolist()[:n] for r, n in rows] == [stream[0:6], stream[5:11], stream[10:15]]
    batch = make_batch(np.stack([r for r, _ in rows]), np.array([n for _, n in rows]), EOS)
    assert set(batch) == set(BATCH_KEYS)
    # row 0 ids: E 10 11 12 E 13 -> the EOS opens a segment (it plays BOS for the next doc)
    assert batch["ids"][0].tolist() == [EOS, 10, 11, 12, EOS]
    assert batch["labels"][0].tolist() == [10, 11, 12, EOS, 13]
    assert batch["segment_ids"][0].tolist() == [1, 1, 1, 1, 2]
    assert batch["segment_pos"][0].tolist() == [0, 1, 2, 3, 0]
    # row 1 ids: 13 14 E 15 16: the row starts mid-document, so its positions restart at 0
    assert batch["ids"][1].tolist() == [13, 14, EOS, 15, 16]
    assert batch["segment_ids"][1].tolist() == [1, 1, 2, 2, 2]
    assert batch["segment_pos"][1].tolist() == [0, 1, 0, 1, 2]
    # row 2 is the padded tail: 4 real inputs, 1 padding position
    assert batch["ids"][2].tolist() == [17, 18, 19, 20, 0]
    assert batch["labels"][2].tolist() == [18, 19, 20, EOS, 0]
    assert batch["weights"][2].tolist() == [1, 1, 1, 1, 0]
    assert batch["paddings"][2].tolist() == [0, 0, 0, 0, 1]
    assert batch["segment_ids"][2].tolist() == [1, 1, 1, 1, 0]
    assert batch["segment_pos"][2].tolist() == [0, 1, 2, 3, 0]
    for key in ("ids", "labels", "segment_ids", "segment_pos"):
        assert batch[key].dtype == np.int32
    assert batch["weights"].dtype == batch["paddings"].dtype == np.float32


def test_packing_conserves_tokens_every_token_a_label_once():
    rng = np.random.default_rng(0)
    docs = _docs(rng.integers(1, 60, size=200).tolist())
    seq_len = 16
    rows = list(pack_documents(docs, seq_len, EOS, keep_last_partial=True))
    stream = [EOS] + sum(docs, [])
    batch = make_batch(np.stack([r for r, _ in rows]), np.array([n for _, n in rows]), EOS)
    labels = batch["labels"][batch["weights"] > 0]
    ids = batch["ids"][batch["weights"] > 0]
    assert labels.tolist() == stream[1:]  # every token after the leading EOS, once, in order
    assert ids.tolist() == stream[:-1]
    # Dropping the partial tail loses fewer than seq_len labels.
    full = list(pack_documents(docs, seq_len, EOS))
    assert all(n == seq_len + 1 for _, n in full)
    assert 0 <= len(stream) - 1 - len(full) * seq_len < seq_len


def test_segments_never_cross_documents():
    rng = np.random.default_rng(1)
    docs = _docs(rng.integers(1, 30, size=100).tolist())
    # doc index of every stream token; the EOS ending doc k belongs, as an input, to doc k+1
    owner = [0]
    for k, d in enumerate(docs):
        owner += [k] * (len(d) - 1) + [k + 1]
    rows = list(pack_documents(docs, 12, EOS))
    batch = make_batch(np.stack([r for r, _ in rows]), np.array([n for _, n in rows]), EOS)
    for r in range(len(rows)):
        input_owner = owner[r * 12 : r * 12 + 12]
        seg = batch["segment_ids"][r]
        # same segment <=> same document, and positions count from the segment's first token
        same_seg = seg[:, None] == seg[None, :]
        same_doc = np.equal.outer(input_owner, input_owner)
        assert (same_seg == same_doc).all()
        first = {s: np.argmax(seg == s) for s in set(seg.tolist())}
        assert batch["segment_pos"][r].tolist() == [
            t - first[s] for t, s in enumerate(seg.tolist())
        ]


def test_one_document_longer_than_many_rows():
    docs = _docs([1000])
    rows = list(pack_documents(docs, 64, EOS, keep_last_partial=True))
    assert len(rows) == -(-1000 // 64)
    batch = make_batch(np.stack([r for r, _ in rows]), np.array([n for _, n in rows]), EOS)
    assert batch["weights"].sum() == 1000
    assert (batch["segment_ids"][1:-1] == 1).all()  # middle rows: one segment, no EOS inside


def test_unpacked_rows_have_one_segment():
    rows = np.array([[EOS, 5, 6, 7, EOS, 0], [EOS, 8, 9, 0, 0, 0]])
    batch = make_batch(rows, np.array([5, 3]), EOS, packed=False)
    assert batch["segment_ids"].tolist() == [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]]
    assert batch["segment_pos"].tolist() == [[0, 1, 2, 3, 0], [0, 1, 0, 0, 0]]
    assert batch["weights"].tolist() == [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]]


def test_pad_batch_rows():
    rows, lengths = pad_batch_rows(np.ones((2, 5), np.int64), np.array([5, 3]), 4)
    assert rows.shape == (4, 5) and lengths.tolist() == [5, 3, 0, 0]
    batch = make_batch(rows, lengths, EOS)
    assert batch["weights"][2:].sum() == 0 and (batch["paddings"][2:] == 1).all()
    assert (batch["segment_ids"][2:] == 0).all()
