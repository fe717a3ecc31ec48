"""The embedded sample corpus: real layout, readable by every reader, deterministic, atomic;
and the BoolQ sample made from the same text."""

import numpy as np

import experiments
from tasks import boolq, layout
from tasks.input_pipeline import PileEvalInput, PileTrainInput
from tasks.lambada import lambada_batches, read_lambada
from tasks.sample_corpus import BOOLQ_EXAMPLES, VOCAB_SIZE, ensure_sample_data, write_boolq_sample
from tasks.text_formats import iter_documents
from tasks.tokenizer import load_tokenizer
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


def test_boolq_sample_is_tfds_boolq_with_single_token_answers(tmp_path):
    """Pax's BoolQ in TFDS's layout, the same bytes every time, each answer right about its
    passage, and a vocabulary of LLaMABoolQTiny's size in which the answers are one token."""
    out, vocab_path, (yes_id, no_id) = write_boolq_sample(tmp_path / "a")
    write_boolq_sample(tmp_path / "b")
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    dev_path = boolq.boolq_file(out, "dev")
    assert dev_path.endswith("super_glue/boolq/1.0.2/super_glue-validation.tfrecord")
    train, dev = boolq.read_boolq(boolq.boolq_file(out, "train")), boolq.read_boolq(dev_path)
    assert (len(train), len(dev)) == (BOOLQ_EXAMPLES["train"], BOOLQ_EXAMPLES["validation"])
    assert [e.line for e in dev] == list(range(1, len(dev) + 1))
    assert not {e.passage for e in train} & {e.passage for e in dev}  # held-out documents
    for example in train + dev:
        word = example.question.removeprefix("does the passage mention ")
        assert (word in example.passage.lower().split()) == example.answer, example
    assert 0.4 < np.mean([e.answer for e in train]) < 0.6

    tokenizer = load_tokenizer(vocab_path)
    assert tokenizer.vocab_size == experiments.resolve("experiments.LLaMABoolQTiny").VOCAB_SIZE
    assert boolq.answer_token_ids(tokenizer) == (yes_id, no_id)
    assert [tokenizer.decode([yes_id]), tokenizer.decode([no_id])] == ["yes", "no"]
