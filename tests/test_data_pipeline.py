"""Prepared shards and the train/eval inputs: determinism, process slices, resume, epochs."""

import json
import os

import numpy as np
import pytest

from paxloom.core.errors import UserError
from tasks import layout
from tasks.input_pipeline import FeistelPermutation, PileEvalInput, PileTrainInput
from tasks.packing import BATCH_KEYS
from tasks.prepare import cache_key, prepare
from tasks.text_formats import iter_documents
from tasks.vocab import load_vocabulary
from tests.support import data as fx
from tests.support.processes import run_python, session_env

SEQ_LEN = 32
G = 8


@pytest.fixture(scope="session")
def vocab(tmp_path_factory):
    return load_vocabulary(fx.tiny_vocab_path(tmp_path_factory))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, vocab):
    root = fx.make_pile_dir(tmp_path_factory.mktemp("pile"), num_train_files=3, docs_per_file=60)
    prepare(layout.pile_train_files(root), vocab, workers=1, progress=False)
    return root


def _train(data_dir, vocab, rows=(0, G), seed=0, **kw):
    return PileTrainInput(layout.pile_train_files(data_dir), vocab, SEQ_LEN, G, rows, seed, **kw)


def _equal(a, b):
    return all(np.array_equal(a[k], b[k]) for k in BATCH_KEYS)


@pytest.mark.parametrize("n", [1, 2, 3, 17, 1000, 4097])
def test_feistel_is_a_permutation(n):
    perm = FeistelPermutation(n, [5, 0])(np.arange(n))
    assert sorted(perm.tolist()) == list(range(n))
    if n > 100:
        assert not np.array_equal(perm, np.arange(n))
        assert not np.array_equal(perm, FeistelPermutation(n, [5, 1])(np.arange(n)))


def test_prepared_shards_hold_the_documents_tokens(data_dir, vocab):
    files = layout.pile_train_files(data_dir)
    shards = prepare(files, vocab, progress=False)
    for shard, f in zip(shards, files, strict=True):
        expected = [t for text in iter_documents(f) for t in vocab.encode(text) + [vocab.eos_id]]
        assert shard.tokens().tolist() == expected
        assert shard.tokens().dtype == np.uint16
        assert shard.doc_ends()[-1] == len(expected) and shard.num_docs == 60
    manifest = json.loads((shards[0].tokens_path.parent / "manifest.json").read_text())
    assert manifest["vocab_sha256"] == vocab.sha256 and len(manifest["files"]) == 3


def test_prepare_parallel_workers_same_bytes(data_dir, vocab, tmp_path):
    files = layout.pile_train_files(data_dir)
    serial = prepare(files, vocab, progress=False)
    parallel = prepare(files, vocab, cache_root=tmp_path, workers=2, progress=False)
    for a, b in zip(serial, parallel, strict=True):
        assert a.tokens_path.read_bytes() == b.tokens_path.read_bytes()


def test_cache_key_follows_sources(tmp_path, vocab):
    f = fx.write_pile(tmp_path / "a.jsonl.zst", ["one two"])
    key = cache_key([f], vocab)
    os.utime(f, ns=(1, 1))
    assert cache_key([f], vocab) != key


def test_interrupted_prepare_leaves_no_half_shard(tmp_path, vocab):
    good = fx.write_pile(tmp_path / "train" / "00.jsonl.zst", fx.make_docs(30))
    bad = fx.write_pile(tmp_path / "train" / "01.jsonl.zst", fx.make_docs(3000, seed=9))
    bad.write_bytes(bad.read_bytes()[:-100])  # truncated: fails after some documents
    with pytest.raises(UserError, match=r"01\.jsonl\.zst is truncated"):
        prepare([good, bad], vocab, cache_root=tmp_path / "cache", workers=1, progress=False)
    (out_dir,) = (tmp_path / "cache").iterdir()
    names = sorted(p.name for p in out_dir.iterdir())
    # The good file is complete and reusable; nothing of the bad one, no temp files, no manifest.
    assert names == [
        "000-00.jsonl.zst.docs.npy",
        "000-00.jsonl.zst.json",
        "000-00.jsonl.zst.tokens.npy",
    ]


def test_batch_shapes_and_types(data_dir, vocab):
    batch = _train(data_dir, vocab).next_batch()
    assert set(batch) == set(BATCH_KEYS)
    for k in BATCH_KEYS:
        assert batch[k].shape == (G, SEQ_LEN)
    assert batch["ids"].dtype == np.int32 and batch["weights"].dtype == np.float32
    assert (batch["weights"] == 1).all() and (batch["paddings"] == 0).all()  # packed: no padding
    assert (batch["labels"][:, :-1] == batch["ids"][:, 1:]).all()


def test_one_epoch_reads_every_sequence_once_and_conserves_tokens(data_dir, vocab):
    inp = _train(data_dir, vocab)
    seqs = np.concatenate([inp.sequences_of_batch(k) for k in range(inp.batches_per_epoch)])
    assert len(set(seqs.tolist())) == len(seqs) == inp.batches_per_epoch * G
    assert inp.num_sequences - len(seqs) < G  # only the remainder of the last batch is skipped
    # Sequences are consecutive windows of the stream: label windows tile it exactly.
    stream = np.concatenate([[vocab.eos_id]] + [s.tokens() for s in inp.shards])
    for s in seqs[:20]:
        row = stream[s * SEQ_LEN : s * SEQ_LEN + SEQ_LEN + 1]
        b = {"ids": row[:-1], "labels": row[1:]}
        assert b["ids"].tolist() == inp.stream.read(s * SEQ_LEN, SEQ_LEN).tolist()
    # all labels across all sequences = the stream minus its leading EOS
    all_labels = np.concatenate(
        [inp.stream.read(s * SEQ_LEN + 1, SEQ_LEN) for s in range(inp.num_sequences)]
    )
    assert np.array_equal(all_labels, stream[1 : 1 + inp.num_sequences * SEQ_LEN])


def test_same_seed_same_batches_different_seed_different(data_dir, vocab):
    a, b, c = _train(data_dir, vocab), _train(data_dir, vocab), _train(data_dir, vocab, seed=1)
    first = [a.next_batch() for _ in range(3)]
    assert all(_equal(x, b.next_batch()) for x in first)
    assert not _equal(first[0], c.next_batch())


def test_process_slices_are_disjoint_and_union_is_global_batch(data_dir, vocab):
    whole = _train(data_dir, vocab)
    parts = [_train(data_dir, vocab, rows=r) for r in [(0, 3), (3, 4), (4, 8)]]
    for k in range(3):
        seqs = [p.sequences_of_batch(k) for p in parts]
        assert sum(len(s) for s in seqs) == G and len(set(np.concatenate(seqs).tolist())) == G
        glob = whole.next_batch()
        pieces = [p.next_batch() for p in parts]
        for key in BATCH_KEYS:
            assert np.array_equal(np.concatenate([x[key] for x in pieces]), glob[key])


def test_resume_gives_exactly_the_next_batch(data_dir, vocab):
    run = _train(data_dir, vocab, seed=3)
    for _ in range(5):
        run.next_batch()
    state = json.loads(json.dumps(run.get_state()))  # it must survive JSON
    expected = run.next_batch()
    restarted = _train(data_dir, vocab, seed=3, rows=(2, 6))  # even with another process layout
    restarted.set_state(state)
    got = restarted.next_batch()
    for key in BATCH_KEYS:
        assert np.array_equal(got[key], expected[key][2:6])


def test_resume_with_other_settings_is_an_error(data_dir, vocab):
    state = _train(data_dir, vocab, seed=3).get_state()
    with pytest.raises(UserError, match="input state has seed=3 but this run has seed=4"):
        _train(data_dir, vocab, seed=4).set_state(state)
    other = PileTrainInput(layout.pile_train_files(data_dir), vocab, SEQ_LEN * 2, G, (0, G), 3)
    with pytest.raises(UserError, match="seq_len=32 but this run has seq_len=64"):
        other.set_state(state)


def test_epochs_wrap_with_a_new_order(data_dir, vocab):
    inp = _train(data_dir, vocab)
    epoch0 = inp.sequences_of_batch(0)
    epoch1 = inp.sequences_of_batch(inp.batches_per_epoch)
    assert not np.array_equal(epoch0, epoch1)
    inp.set_state({**inp.get_state(), "batch_index": 10 * inp.batches_per_epoch + 1})
    assert inp.next_batch()["ids"].shape == (G, SEQ_LEN)


def test_too_little_data_for_one_batch(tmp_path, vocab):
    f = fx.write_pile(tmp_path / "train" / "00.jsonl.zst", ["just a few words"])
    with pytest.raises(UserError, match=r"fewer than one global batch of 8; add data or lower"):
        PileTrainInput([f], vocab, SEQ_LEN, G, (0, G), 0)


def test_unpacked_rows_hold_one_document(data_dir, vocab):
    inp = _train(data_dir, vocab, packed=False)
    for _ in range(4):
        batch = inp.next_batch()
        real = batch["weights"] > 0
        assert (batch["segment_ids"][real] == 1).all() and (batch["segment_ids"][~real] == 0).all()
        for r in range(G):
            n = int(real[r].sum())
            assert batch["segment_pos"][r, :n].tolist() == list(range(n))
            # no document boundary inside a row: EOS only as the first input
            assert vocab.eos_id not in batch["ids"][r, 1:n].tolist()
    # every document token is a label exactly once across all rows
    total = int(inp._lengths.sum() - len(inp._lengths))
    assert total == sum(s.num_tokens for s in inp.shards)


def test_eval_input_fixed_padded_and_sliced(data_dir, vocab):
    val = layout.pile_val_files(data_dir)[0]
    ev = PileEvalInput(val, vocab, SEQ_LEN, 4, None)
    batches = list(ev)
    assert [_equal(a, b) for a, b in zip(batches, list(ev), strict=True)] == [True] * len(
        batches
    )  # replayable
    labels = np.concatenate([b["labels"][b["weights"] > 0] for b in batches])
    expected = [t for text in iter_documents(val) for t in vocab.encode(text) + [vocab.eos_id]]
    assert labels.tolist() == expected  # the whole file, every token once
    assert batches[-1]["weights"][-1].sum() < SEQ_LEN  # padded tail
    few = PileEvalInput(val, vocab, SEQ_LEN, 4, 2)
    assert len(few) == 2 and all(_equal(a, b) for a, b in zip(few, batches[:2], strict=False))
    halves = [PileEvalInput(val, vocab, SEQ_LEN, 4, 2, process_rows=r) for r in [(0, 2), (2, 4)]]
    for k, (lo, hi) in enumerate(zip(*halves, strict=True)):
        assert np.array_equal(np.concatenate([lo["ids"], hi["ids"]]), batches[k]["ids"])


@pytest.mark.process
def test_prepare_command(tmp_path, vocab):
    root = fx.make_pile_dir(tmp_path / "data", num_train_files=2, docs_per_file=20)
    proc = run_python(
        "-m", "tasks.prepare", f"--data_dir={root}", f"--vocab_path={vocab.path}", "--workers=2",
        env=session_env(PAXLOOM_TOKEN_CACHE_DIR=str(tmp_path / "tokens")),
    )
    assert proc.returncode == 0, proc.stderr
    assert "prepared 2 file(s)" in proc.stdout
    (cache,) = (tmp_path / "tokens").iterdir()  # the token cache, not the data directory
    assert (cache / "manifest.json").is_file() and not (root / "pile" / "tokenized").exists()
    proc = run_python("-m", "tasks.prepare", f"--data_dir={root}", "--vocab_path=")
    assert proc.returncode == 2 and proc.stderr.startswith(
        "error: no vocabulary given; set VOCAB_PATH"
    )
