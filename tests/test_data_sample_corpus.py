"""The embedded sample corpus: real layout, readable by every reader, deterministic, atomic."""

import numpy as np

from tasks import layout
from tasks.input_pipeline import PileEvalInput, PileTrainInput
from tasks.lambada import lambada_batches, read_lambada
from tasks.sample_corpus import VOCAB_SIZE, ensure_sample_data
from tasks.text_formats import iter_documents
from tasks.vocab import check_vocab_size, load_vocabulary


def _files(root):
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_builds_in_real_layout_and_is_deterministic(tmp_path):
    data_dir, vocab_path = ensure_sample_data(tmp_path / "a")
    again_dir, _ = ensure_sample_data(tmp_path / "a")
    assert again_dir == data_dir
    other_dir, _ = ensure_sample_data(tmp_path / "b")
    assert _files(data_dir) == _files(other_dir)  # byte for byte, vocabulary included
    assert [p.name for p in (tmp_path / "a").iterdir()] == [data_dir.name]  # no temp dirs left

    vocab = load_vocabulary(vocab_path)
    assert vocab.vocab_size == VOCAB_SIZE
    check_vocab_size(vocab, 1024)
    train = layout.pile_train_files(data_dir)
    assert len(train) >= 2
    train_docs = [d for f in train for d in iter_documents(f)]
    val_docs = list(iter_documents(layout.pile_val_files(data_dir)[0]))
    assert len(train_docs) > 300 and len(val_docs) > 30
    assert not set(train_docs) & set(val_docs)
    examples = read_lambada(layout.lambada_files(data_dir)[0])
    assert len(examples) >= 200
    for ex in examples:
        assert ex.target.strip() in ex.context.split()  # the target word occurred earlier
    assert not any(ex.context in " ".join(train_docs) for ex in examples[:20])


def test_sample_corpus_feeds_the_pipelines(tmp_path):
    data_dir, vocab_path = ensure_sample_data(tmp_path)
    vocab = load_vocabulary(vocab_path)
    train = PileTrainInput(layout.pile_train_files(data_dir), vocab, 128, 8, (0, 8), seed=0)
    assert train.batches_per_epoch > 50
    assert train.next_batch()["ids"].shape == (8, 128)
    (val,) = PileEvalInput(layout.pile_val_files(data_dir)[0], vocab, 128, 8, 1)
    assert val["weights"].sum() == 8 * 128
    batch = next(lambada_batches(read_lambada(layout.lambada_files(data_dir)[0]), vocab, 128, 8))
    assert (batch["weights"].sum(axis=1) > 0).all()
    assert np.all(batch["weights"] <= 1 - batch["paddings"])
