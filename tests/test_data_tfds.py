"""A Pax user's TFDS data directory (paxml's the_pile and my_lambada builds) as it is."""

import sys

import pytest

from paxloom.core.errors import UserError
from paxloom.core.user_cache import token_cache_dir
from tasks import layout, tfds
from tasks.lambada import read_lambada
from tasks.text_formats import iter_documents
from tests.support.data import make_tfds_data, write_lines
from tests.support.processes import bare_env, run_main
from tests.support.tiny import SHORT_PILE_RUN, tiny_flags


@pytest.fixture(scope="module")
def tfds_data(tmp_path_factory):
    return make_tfds_data(tmp_path_factory.mktemp("tfds"), num_train=200, num_passages=16,
                          seed=7)


def test_tfds_layout_is_found_and_read_exactly(tfds_data, tmp_path):
    data_dir, _, docs, passages = tfds_data
    train = layout.pile_train_files(data_dir)
    assert [p.name for p in train] == ["the_pile-train.tfrecord-00000-of-00002",
                                       "the_pile-train.tfrecord-00001-of-00002"]
    assert [t for p in train for t in iter_documents(p)] == docs[:200]
    (val,) = layout.pile_val_files(data_dir)
    assert list(iter_documents(val)) == docs[200:]
    # Lambada from TFDS: the same context and target as the jsonl of the same passages.
    (shard,) = layout.lambada_files(data_dir)
    jsonl = write_lines(tmp_path / "lambada_test.jsonl", [{"text": p} for p in passages])
    from_tfds, from_jsonl = read_lambada(shard), read_lambada(jsonl)
    assert [(e.context, e.target) for e in from_tfds] == [
        (e.context, e.target) for e in from_jsonl]
    assert from_tfds[0].target == " harbor"


def test_records_written_without_tensorflow_are_tensorflows(tmp_path):
    """tfds.write_records and serialize_example (the BoolQ sample's writer): the file
    TensorFlow's TFRecordWriter writes, examples TensorFlow parses, and read back here."""
    import tensorflow as tf

    features = {"question": ["naïve?".encode()], "passage": [b"", b"two"],
                "idx": [0, 2**40], "label": [-1]}
    records = [tfds.serialize_example(features), b""]
    ours, theirs = tmp_path / "ours.tfrecord", tmp_path / "theirs.tfrecord"
    tfds.write_records(ours, records)
    with tf.io.TFRecordWriter(str(theirs)) as writer:
        for record in records:
            writer.write(record)
    assert ours.read_bytes() == theirs.read_bytes()
    assert list(tfds.read_records(ours)) == records
    example = tf.train.Example.FromString(records[0])
    assert {name: list(feature.bytes_list.value or feature.int64_list.value)
            for name, feature in example.features.feature.items()} == features
    assert tfds.parse_example(records[0]) == features


def test_corrupt_shard_and_missing_tensorflow_are_one_line_errors(tfds_data, tmp_path,
                                                                  monkeypatch):
    data_dir, *_ = tfds_data
    good = layout.pile_train_files(data_dir)[0].read_bytes()
    bad = tmp_path / "the_pile-train.tfrecord-00000-of-00001"
    bad.write_bytes(good[: len(good) // 2])  # truncated mid-record
    with pytest.raises(UserError, match=r"the_pile-train.tfrecord-00000-of-00001 is corrupt "
                                        r"after \d+ records") as info:
        list(iter_documents(bad))
    assert "\n" not in str(info.value)
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # as on a machine without it
    with pytest.raises(UserError, match=r"needs TensorFlow: pip install '.\[tfds\]'"):
        list(iter_documents(layout.pile_train_files(data_dir)[0]))


def test_the_token_cache_is_the_users_never_the_data_directory(tmp_path):
    """Tokenized data go to $PAXLOOM_TOKEN_CACHE_DIR, else the user's cache, wherever the
    data are (tests/test_token_cache.py trains from a read-only data directory)."""
    assert token_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "paxloom" / "tokenized"
    assert token_cache_dir({"XDG_CACHE_HOME": str(tmp_path),
                            "PAXLOOM_TOKEN_CACHE_DIR": str(tmp_path / "t")}) == tmp_path / "t"


@pytest.mark.slow  # 27 s; make test keeps the TFDS reads above, make test-all this run
@pytest.mark.process
def test_main_trains_and_evaluates_from_tfds_data_dir_in_the_environment(tfds_data, tmp_path):
    data_dir, vocab, *_ = tfds_data
    cache = tmp_path / "token_cache"
    out = run_main("--fdl_config=experiments.GPT126M", f"--job_log_dir={tmp_path / 'job'}",
                   f"--cache_dir={cache}",
                   *tiny_flags(**SHORT_PILE_RUN, ICI_MESH_SHAPE=[8, 1, 1], PERCORE_BATCH_SIZE=1,
                               LAMBADA_EVAL=True),
                   env=bare_env(TFDS_DATA_DIR=str(data_dir), VOCAB_PATH=str(vocab),
                                PATH="/usr/bin:/bin", HOME=str(tmp_path)))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step      4 | loss" in out.stdout
    assert "eval pile_val | loss" in out.stdout and "eval lambada | accuracy" in out.stdout
    assert "num_examples 16" in out.stdout
    # Tokenized once into --cache_dir; nothing written beside the dataset.
    assert list(cache.glob("*/manifest.json"))
    assert not (tfds.builder_dir(data_dir, tfds.PILE) / "tokenized").exists()
