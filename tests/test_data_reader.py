"""Pile reader, data layout and vocabulary: good input, and every kind of bad input."""

import json
import logging
import pickle

import pytest
import zstandard

from paxloom.core.errors import UserError
from tasks import layout
from tasks.text_formats import ReadStats, iter_documents
from tasks.vocab import check_vocab_size, load_vocabulary
from tests.support import data as fx
from tests.support.processes import run_python


@pytest.fixture(scope="session")
def vocab(tmp_path_factory):
    return load_vocabulary(fx.tiny_vocab_path(tmp_path_factory))


def test_reads_zst_and_jsonl_with_set_names(tmp_path):
    docs = fx.make_docs(50, seed=3)
    zst = fx.write_pile(tmp_path / "a.jsonl.zst", docs)
    plain = fx.write_pile(tmp_path / "a.jsonl", docs)
    assert list(iter_documents(zst)) == docs
    assert list(iter_documents(plain)) == docs
    assert list(iter_documents(zst, with_set_name=True))[0] == (docs[0], "Pile-CC")


def test_unicode_and_other_corpora_need_only_text(tmp_path):
    path = fx.write_lines(
        tmp_path / "c.jsonl.zst", [{"text": "héllo 世界 🙂"}, {"text": "x", "id": 3}]
    )
    assert list(iter_documents(path, with_set_name=True)) == [("héllo 世界 🙂", None), ("x", None)]


def test_multi_frame_zst(tmp_path):
    # pzstd and `zstd` on concatenated input write several frames; all must be read.
    c = zstandard.ZstdCompressor(write_checksum=True)
    first = c.compress(b'{"text": "one"}\n{"text": "tw')
    second = c.compress(b'o"}\n{"text": "three"}\n')
    path = tmp_path / "m.jsonl.zst"
    path.write_bytes(first + second)
    assert list(iter_documents(path)) == ["one", "two", "three"]


def test_very_long_text_is_read_whole(tmp_path):
    text = "word " * 200_000
    path = fx.write_pile(tmp_path / "long.jsonl.zst", ["short", text, "after"])
    assert list(iter_documents(path)) == ["short", text, "after"]


def _big_zst(tmp_path, n=3000):
    return fx.write_pile(tmp_path / "big.jsonl.zst", fx.make_docs(n, seed=5))


def test_corrupt_zst_names_file_and_docs_read(tmp_path):
    path = _big_zst(tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    path.write_bytes(bytes(data))
    with pytest.raises(
        UserError, match=r"big\.jsonl\.zst is corrupt .* after \d+ documents; delete it"
    ):
        list(iter_documents(path))


def test_truncated_zst(tmp_path):
    path = _big_zst(tmp_path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(UserError, match=r"big\.jsonl\.zst is truncated .* after \d+ documents"):
        list(iter_documents(path))


def test_not_zstd_at_all(tmp_path):
    path = tmp_path / "x.jsonl.zst"
    path.write_bytes(b'{"text": "plain json, wrong extension"}\n')
    with pytest.raises(UserError, match=r"x\.jsonl\.zst is corrupt"):
        list(iter_documents(path))


def test_bad_lines_are_skipped_counted_and_logged(tmp_path, caplog):
    lines = [
        {"text": "good one"},
        b"{not json",
        {"meta": {"pile_set_name": "X"}},
        {"text": 42},
        {"text": ""},
        b"\xff\xfe not utf-8",
        "[1, 2]",
        "",
        {"text": "good two"},
    ]
    path = fx.write_lines(tmp_path / "bad.jsonl.zst", lines)
    stats = ReadStats(str(path))
    with caplog.at_level(logging.WARNING):
        assert list(iter_documents(path, stats)) == ["good one", "good two"]
    assert (
        stats.docs,
        stats.malformed_json,
        stats.missing_text,
        stats.non_string_text,
        stats.empty_text,
    ) == (
        2,
        2,
        2,
        1,
        1,
    )
    assert stats.skipped == 6
    text = caplog.text
    assert f"{path}:2: skipped line: not JSON" in text
    assert f"{path}:3: skipped line: no 'text' field" in text
    assert "skipped 6" in text  # the summary


def test_empty_split_is_an_error(tmp_path):
    empty = tmp_path / "val.jsonl.zst"
    empty.write_bytes(zstandard.ZstdCompressor().compress(b""))
    with pytest.raises(UserError, match=r"val\.jsonl\.zst contains no documents"):
        list(iter_documents(empty))
    only_bad = fx.write_lines(tmp_path / "val2.jsonl", [{"text": ""}, b"oops"])
    with pytest.raises(UserError, match=r"val2\.jsonl contains no documents .*skipped 2"):
        list(iter_documents(only_bad))


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="nope.jsonl.zst does not exist"):
        list(iter_documents(tmp_path / "nope.jsonl.zst"))


def test_layout_finds_files_sorted(tmp_path):
    root = fx.make_pile_dir(tmp_path, num_train_files=3, docs_per_file=5)
    fx.write_pile(root / "pile" / "train" / "10.jsonl", ["plain"])
    (root / "pile" / "train" / "README.txt").write_text("ignored")
    names = [p.name for p in layout.pile_train_files(root)]
    assert names == ["00.jsonl.zst", "01.jsonl.zst", "02.jsonl.zst", "10.jsonl"]
    assert layout.pile_val_files(root)[0].name == "val.jsonl.zst"
    assert layout.pile_test_files(root)[0].name == "test.jsonl.zst"
    assert layout.lambada_files(root)[0].name == "lambada_test.jsonl"


def test_layout_errors_name_path_and_download_command(tmp_path):
    with pytest.raises(
        UserError,
        match=r"pile/train does not exist \(nor paxml's TFDS build, .*the_pile/lm/1.0.0\); "
              r"download The Pile with `python scripts_gpu/download_the_pile.py --data_dir",
    ):
        layout.pile_train_files(tmp_path)
    (tmp_path / "pile" / "train").mkdir(parents=True)
    with pytest.raises(UserError, match=r"has no \*\.jsonl\.zst or \*\.jsonl files"):
        layout.pile_train_files(tmp_path)
    with pytest.raises(UserError, match=r"pile/val\.jsonl\.zst does not exist; .*--splits val"):
        layout.pile_val_files(tmp_path)
    with pytest.raises(
        UserError, match=r"lambada_test\.jsonl does not exist; .*download_lambada\.py"
    ):
        layout.lambada_files(tmp_path)


def test_vocabulary_roundtrip_and_ids(vocab):
    text = "The river model 123. Ünïcode ✓"
    ids = vocab.encode(text)
    assert vocab.decode(ids) == text  # byte fallback: nothing becomes <unk>
    assert vocab.eos_id == 1 and vocab.pad_id == 0
    assert vocab.vocab_size == 320
    assert vocab.encode_batch([text, "river"]) == [ids, vocab.encode("river")]
    again = pickle.loads(pickle.dumps(vocab))
    assert again.encode(text) == ids and again.sha256 == vocab.sha256


def test_missing_or_bad_vocabulary(tmp_path):
    with pytest.raises(
        UserError, match=r"vocabulary .*nope\.model does not exist; set VOCAB_PATH / --vocab_path"
    ):
        load_vocabulary(tmp_path / "nope.model")
    with pytest.raises(UserError, match="no vocabulary given; set VOCAB_PATH"):
        load_vocabulary(None)
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"this is not a sentencepiece model")
    with pytest.raises(UserError, match=r"bad\.model is not a readable SentencePiece model"):
        load_vocabulary(bad)


def test_check_vocab_size(vocab):
    check_vocab_size(vocab, 320)
    check_vocab_size(vocab, 50304)  # larger embeddings are fine
    with pytest.raises(
        UserError,
        match=r"VOCAB_SIZE=256 but .*tiny\.model has 320 pieces; set --fdl\.VOCAB_SIZE=384",
    ):
        check_vocab_size(vocab, 256)


@pytest.mark.process
def test_train_vocab_command(tmp_path):
    root = fx.make_pile_dir(tmp_path / "data", num_train_files=2, docs_per_file=40)
    out = tmp_path / "v.model"
    proc = run_python(
        "-m", "tasks.train_vocab", f"--data_dir={root}", "--vocab_size=320", f"--output={out}"
    )
    assert proc.returncode == 0, proc.stderr
    v = load_vocabulary(out)
    assert v.vocab_size <= 320 and v.eos_id == 1 and v.pad_id == 0
    # A user error in the command is one line and exit status 2.
    proc = run_python("-m", "tasks.train_vocab", f"--data_dir={tmp_path / 'none'}",
                      f"--output={out}")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


def test_json_record_helper_is_pile_shaped():
    assert json.loads(json.dumps(fx.pile_record("t"))) == {
        "text": "t",
        "meta": {"pile_set_name": "Pile-CC"},
    }
