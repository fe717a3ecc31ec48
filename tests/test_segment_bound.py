"""MAX_SEGMENTS_PER_SEQ: the packers keep every row within the bound (a row's trailing padding
counting as one segment) without losing, reordering or crossing documents; the training
input's rows are those of a plain sequential walk; rows that arrive packed over the bound
are refused in one line."""

import numpy as np
import pytest

from paxloom.core.errors import UserError
from tasks import input_pipeline, layout, packing
from tasks.input_pipeline import PileEvalInput, PileTrainInput
from tasks.packing import check_segment_bound, count_segments, make_batch, pack_documents
from tasks.prepare import prepare
from tasks.vocab import load_vocabulary
from tests.support import data as fx

EOS = 1
SEQ_LEN = 32


def _docs(seed: int, n: int = 400):
    """Documents of distinct tokens (2.. up), each ending in EOS: mostly 1-4 tokens of
    text, some up to three rows long, so rows would hold from one to dozens of segments."""
    rng = np.random.default_rng(seed)
    lengths = np.where(rng.random(n) < 0.8, rng.integers(1, 5, n), rng.integers(5, 3 * SEQ_LEN, n))
    docs, t = [], 2
    for length in lengths:
        docs.append(np.array(list(range(t, t + length)) + [EOS]))
        t += length
    return docs


def _batch(rows):
    return make_batch(np.stack([r for r, _ in rows]), np.array([n for _, n in rows]), EOS)


def check_bounded_packing(docs, max_segments: int) -> None:
    """What the bound promises, against the packer without one."""
    bounded = _batch(list(pack_documents(docs, SEQ_LEN, EOS, True, max_segments)))
    unbounded = _batch(list(pack_documents(docs, SEQ_LEN, EOS, True)))
    assert count_segments(bounded["segment_ids"]).max() <= max_segments
    labels = bounded["labels"][bounded["weights"] == 1]
    assert labels.tolist() == unbounded["labels"][unbounded["weights"] == 1].tolist()
    assert bounded["ids"][bounded["weights"] == 1].tolist() == [EOS] + labels[:-1].tolist()


@pytest.mark.parametrize("max_segments", [2, 3, 5, 8])
def test_packed_rows_keep_the_bound_and_every_token(max_segments):
    docs = _docs(seed=max_segments)
    check_bounded_packing(docs, max_segments)
    # It binds here: without it some rows hold more.
    unbounded = _batch(list(pack_documents(docs, SEQ_LEN, EOS, True)))
    assert count_segments(unbounded["segment_ids"]).max() > max_segments


def test_a_bound_one_too_loose_is_caught(monkeypatch):
    """The check above fails for a packer that lets one segment too many into a row."""
    cut = packing._cut
    monkeypatch.setattr(packing, "_cut", lambda ids, eos_id, max_documents, max_segments:
                        cut(ids, eos_id, max_documents + 1, max_segments + 1))
    with pytest.raises(AssertionError):
        check_bounded_packing(_docs(seed=0), 4)


@pytest.mark.parametrize("max_segments", [2, 4])
def test_segments_stay_inside_documents(max_segments):
    docs = _docs(seed=10 + max_segments)
    document_of = {int(t): d for d, doc in enumerate(docs) for t in doc[:-1]}
    batch = _batch(list(pack_documents(docs, SEQ_LEN, EOS, True, max_segments)))
    for r in range(len(batch["ids"])):
        # The document each label belongs to: a document's EOS, as a label, is its own, and
        # its input then is that document's last token.
        labels, ids = batch["labels"][r], batch["ids"][r]
        real = batch["weights"][r] == 1
        owner = [document_of[int(ids[t] if labels[t] == EOS else labels[t])]
                 for t in np.flatnonzero(real)]
        segment_ids = batch["segment_ids"][r][real]
        for s in np.unique(segment_ids):
            assert len({o for o, i in zip(owner, segment_ids, strict=True) if i == s}) == 1
        # ...and a new document starts a new segment.
        starts = [o != p for p, o in zip(owner[:-1], owner[1:], strict=True)]
        assert starts == [bool(s) for s in np.diff(segment_ids)]


def test_bound_of_two_gives_a_row_per_short_document():
    docs = [np.array([2, 3, EOS]), np.array([4, EOS]), np.array([5, 6, EOS])]
    # stream E 2 3 E 4 E 5 6 E; a full row of 6 inputs would hold 3 segments: E 2 3 | E 4 | E
    rows = list(pack_documents(docs, 6, EOS, keep_last_partial=True, max_segments=2))
    assert [row[:n].tolist() for row, n in rows] == [[EOS, 2, 3, EOS], [EOS, 4, EOS],
                                                     [EOS, 5, 6, EOS]]
    assert _batch(rows)["segment_ids"].tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0],
                                                    [1, 1, 1, 0, 0, 0]]
    # A full row may hold M segments: no padding then.
    rows = list(pack_documents(docs, 4, EOS, keep_last_partial=True, max_segments=2))
    assert [row[:n].tolist() for row, n in rows] == [[EOS, 2, 3, EOS, 4], [4, EOS, 5, 6, EOS]]
    with pytest.raises(ValueError, match="at least 2"):
        list(pack_documents(docs, 4, EOS, max_segments=1))


# ----- the training input: rows found from the documents' ends ----------------------------


def reference_spans(stream: np.ndarray, seq_len: int, max_segments: int):
    """(start, real tokens) of each full row, walking the stream a row at a time."""
    spans, start = [], 0
    while start + seq_len + 1 <= len(stream):
        eos = [p for p in range(start + 1, start + seq_len) if stream[p] == EOS]
        if max_segments == 0 or 1 + len(eos) <= max_segments:
            spans.append((start, seq_len + 1))
            start += seq_len
        else:
            end = eos[max_segments - 2]
            spans.append((start, end - start + 1))
            start = end
    return spans


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return load_vocabulary(fx.tiny_vocab_path(tmp_path_factory))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, vocab):
    """Three Pile-format train files of mostly one- and two-word documents."""
    root = tmp_path_factory.mktemp("pile")
    for i in range(3):
        docs = fx.make_docs(150, seed=50 + i, min_words=1, max_words=2)
        docs[::9] = fx.make_docs(len(docs[::9]), seed=60 + i, min_words=10, max_words=60)
        fx.write_pile(root / "pile" / "train" / f"{i:02d}.jsonl.zst", docs)
    fx.write_pile(root / "pile" / "val.jsonl.zst", fx.make_docs(80, seed=70, min_words=1, max_words=4))
    prepare(layout.pile_train_files(root), vocab, workers=1, progress=False)
    return root


def _train(data_dir, vocab, max_segments):
    return PileTrainInput(layout.pile_train_files(data_dir), vocab, SEQ_LEN, 4, (0, 4), seed=0,
                          max_segments=max_segments)


@pytest.mark.parametrize("max_segments,small_windows", [(2, False), (3, True), (4, False),
                                                         (4, True), (SEQ_LEN, False)])
def test_training_rows_are_those_of_a_sequential_walk(data_dir, vocab, max_segments,
                                                      small_windows, monkeypatch):
    if small_windows:  # every window and read boundary falls inside a run or a cut stretch
        for name, value in (("_FIRST_WINDOW", 1), ("_MAX_WINDOW", 4), ("_READ_ROWS", 1)):
            monkeypatch.setattr(input_pipeline, name, value)
    inp = _train(data_dir, vocab, max_segments)
    stream = np.concatenate([[vocab.eos_id]] + [s.tokens() for s in inp.shards])
    assert vocab.eos_id == EOS
    expected = reference_spans(stream, SEQ_LEN, max_segments)
    assert [inp._row_span(r) for r in range(inp.num_sequences)] == expected
    unbounded = reference_spans(stream, SEQ_LEN, 0)
    if max_segments == SEQ_LEN:  # never binds: the rows (and the saved state) of no bound
        assert expected == unbounded and inp.get_state()["max_segments"] == 0
    else:
        assert len(expected) > len(unbounded) and inp.get_state()["max_segments"] == max_segments
    for _ in range(3):
        batch = inp.next_batch()
        assert count_segments(batch["segment_ids"]).max() <= max_segments


def test_restart_refuses_another_bound_that_cuts(data_dir, vocab):
    state = _train(data_dir, vocab, 3).get_state()
    _train(data_dir, vocab, 3).set_state(state)
    with pytest.raises(UserError, match="rows were cut at MAX_SEGMENTS_PER_SEQ=3 but this run's, "
                                        "with MAX_SEGMENTS_PER_SEQ=4, are cut at "
                                        "MAX_SEGMENTS_PER_SEQ=4.*--fdl.MAX_SEGMENTS_PER_SEQ=3"):
        _train(data_dir, vocab, 4).set_state(state)
    with pytest.raises(UserError, match="with MAX_SEGMENTS_PER_SEQ=32, are not cut"):
        _train(data_dir, vocab, SEQ_LEN).set_state(state)
    old = {k: v for k, v in _train(data_dir, vocab, SEQ_LEN).get_state().items()
           if k != "max_segments"}  # saved before the bound existed
    _train(data_dir, vocab, 10 * SEQ_LEN).set_state(old)


def test_eval_rows_keep_the_bound(data_dir, vocab):
    files = [data_dir / "pile" / "val.jsonl.zst"]
    bounded = list(PileEvalInput(files, vocab, SEQ_LEN, 4, None, max_segments=3))
    plain = list(PileEvalInput(files, vocab, SEQ_LEN, 4, None))
    assert max(count_segments(b["segment_ids"]).max() for b in plain) > 3
    assert max(count_segments(b["segment_ids"]).max() for b in bounded) <= 3
    tokens = [b["labels"][b["weights"] == 1] for b in bounded]
    assert np.concatenate(tokens).tolist() == np.concatenate(
        [b["labels"][b["weights"] == 1] for b in plain]).tolist()


# ----- data that arrive packed --------------------------------------------------------------


def test_count_segments_counts_runs_padding_included():
    segment_ids = np.array([[1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1], [1, 2, 1, 2, 0, 0, 0]])
    assert count_segments(segment_ids).tolist() == [4, 1, 5]


def test_a_prepacked_batch_over_the_bound_is_refused_in_one_line():
    segment_ids = np.array([[1, 2, 3, 4, 0, 0], [1, 1, 1, 2, 2, 2]])  # 5 and 2 segments
    batch = {"segment_ids": segment_ids}
    check_segment_bound(batch, 5, "my_dataset")
    check_segment_bound(batch, 0, "my_dataset")  # no bound
    with pytest.raises(UserError) as error:
        check_segment_bound(batch, 4, "my_dataset (corpus.parquet)")
    message = str(error.value)
    assert "\n" not in message and message.startswith("my_dataset (corpus.parquet): 1 of 2 rows")
    assert "up to 5" in message and "MAX_SEGMENTS_PER_SEQ=4" in message
    assert "--fdl.MAX_SEGMENTS_PER_SEQ" in message and "at most 4 documents" in message


def test_the_trainer_refuses_rows_over_the_bound(tmp_path):
    from tests.support.training import make_trainer

    trainer = make_trainer(tmp_path, MAX_SEGMENTS_PER_SEQ=3)
    batch = trainer.make_train_input().next_batch()
    trainer.to_device(batch)  # synthetic rows: one segment each
    segment_ids = np.array(batch["segment_ids"])
    segment_ids[0, 10:] = 2
    segment_ids[0, 20:] = 3
    segment_ids[0, 30:] = 4
    with pytest.raises(UserError, match=r"^the training input: 1 of \d+ rows hold more than "
                                        r"MAX_SEGMENTS_PER_SEQ=3"):
        trainer.to_device({**batch, "segment_ids": segment_ids})


def test_fewer_than_two_segments_is_refused():
    from experiments import BaseExperiment

    with pytest.raises(UserError, match="MAX_SEGMENTS_PER_SEQ=1 must be at least 2: a row's "
                                        "trailing padding counts as one segment") as info:
        BaseExperiment(MAX_SEGMENTS_PER_SEQ=1)
    assert "\n" not in str(info.value)


@pytest.mark.process
def test_the_measurement_script_agrees_with_the_packer():
    """bench/segments_per_row.py's figures for a Pile-shaped sample are those of packing its
    documents with pack_documents."""
    from bench.segments_per_row import pile_sample
    from tests.support.processes import run_python

    out = run_python("bench/segments_per_row.py", "--pile_sample=3000", "--seq_len=512",
                     "--bounds=4,64", check=True)
    eos, num_tokens = pile_sample(3000, 1.5, 4.0, seed=0)
    stream = np.full(num_tokens, 7)
    stream[eos] = EOS
    docs = np.split(stream[1:], eos[1:])[:-1]
    for m in (4, 64):
        rows = list(pack_documents(docs, 512, EOS, max_segments=m))
        cut = sum(n < 513 for _, n in rows)
        assert (cut > 0) == (m == 4)
        padding = sum(513 - n for _, n in rows)
        line = next(line.split() for line in out.stdout.splitlines()
                    if line.split()[:1] == [str(m)])
        assert line[1:4] == [f"{100 * cut / len(rows):.3f}%",
                             f"{100 * padding / (len(rows) * 512):.3f}%", f"{len(rows):,}"]
