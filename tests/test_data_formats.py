"""A user's own corpus and tokenizer: every file format, the file expansion, the tokenizer
loader, and prepare() with both tokenizers. Small and fast: no model, no JAX."""

import json
import logging
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

from paxloom.core.errors import UserError
from tasks.input_pipeline import PileEvalInput, raw_rows
from tasks.prepare import cache_key, prepare
from tasks.text_formats import ReadStats, TextFormat, expand_files, iter_documents
from tasks.tokenizer import HFTokenizer, load_tokenizer
from tasks.vocab import Vocabulary, check_vocab_size
from tests.support import data as fx

DOCS = fx.make_docs(40, seed=11) + ["héllo 世界 🙂\n\ttabs  and  spaces ", "x"]
FIELD = {"txt": "text", "txt_blank_line": "text"}  # txt has no fields; others use "body"


def _read_all(spec, text_format) -> list[str]:
    return [d for f in expand_files(spec) for d in iter_documents(f, None, text_format)]


def _one_line(error) -> str:
    text = str(error.value)
    assert "\n" not in text
    return text


@pytest.fixture(scope="module")
def sp_vocab(tmp_path_factory):
    from tasks.vocab import load_vocabulary

    return load_vocabulary(fx.tiny_vocab_path(tmp_path_factory))


@pytest.fixture(scope="module")
def hf_path(tmp_path_factory):
    return fx.train_hf_tokenizer(tmp_path_factory.mktemp("hf"), fx.make_docs(300, seed=1234))


@pytest.fixture(scope="module")
def hf_tok(hf_path):
    return load_tokenizer(hf_path)


# --- formats --------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", fx.CORPUS_FORMATS)
def test_each_format_reads_back_exactly(tmp_path, fmt):
    docs = fx.as_blocks(DOCS) if fmt == "txt_blank_line" else DOCS
    field = FIELD.get(fmt, "body")
    spec = fx.write_corpus(tmp_path, fmt, docs, text_field=field)
    text_format = TextFormat(text_field=field,
                             txt_documents="blank_line" if fmt == "txt_blank_line" else "file")
    assert _read_all(spec, text_format) == docs
    pairs = [p for f in expand_files(spec) for p in text_format.documents(f, with_set_name=True)]
    assert pairs == [(d, None) for d in docs]


def test_default_text_field_and_stats(tmp_path):
    path = fx.write_corpus(tmp_path, "parquet", DOCS)
    stats = ReadStats(str(path))
    assert list(iter_documents(path, stats)) == DOCS
    assert (stats.docs, stats.lines, stats.skipped) == (len(DOCS), len(DOCS), 0)
    assert stats.bytes_read == path.stat().st_size  # the progress bar ends at 100%


def test_hf_dataset_shards_in_state_json_order(tmp_path):
    import datasets

    out = tmp_path / "ds"
    datasets.Dataset.from_dict({"content": DOCS}).save_to_disk(str(out), num_shards=3)
    files = expand_files(out)
    order = [e["filename"] for e in json.loads((out / "state.json").read_text())["_data_files"]]
    assert [f.name for f in files] == order and len(files) == 3
    assert _read_all(out, TextFormat("content")) == DOCS
    assert expand_files([out, out]) == files + files  # a list, in order


def test_arrow_ipc_file_format_is_read_too(tmp_path):
    import pyarrow as pa

    path = tmp_path / "f.arrow"
    table = pa.table({"text": DOCS})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table, max_chunksize=7)
    assert list(iter_documents(path)) == DOCS


def test_txt_blank_line_blocks(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes(b"\n\n first\r\nblock\n  \n\n\nsecond\n\t\nthird, no newline")
    blocks = list(iter_documents(path, None, TextFormat(txt_documents="blank_line")))
    assert blocks == [" first\nblock", "second", "third, no newline"]
    assert list(iter_documents(path)) == ["\n\n first\nblock\n  \n\n\nsecond\n\t\nthird, no newline"]


def test_bad_records_are_counted_and_logged(tmp_path, caplog):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"body": ["good one", None, "", "good two"]}), path)
    stats = ReadStats(str(path))
    with caplog.at_level(logging.WARNING):
        assert list(iter_documents(path, stats, TextFormat("body"))) == ["good one", "good two"]
    assert (stats.docs, stats.missing_text, stats.empty_text, stats.skipped) == (2, 1, 1, 2)
    assert f"{path}: row 2: skipped: no 'body' field" in caplog.text
    assert "skipped 2" in caplog.text and "empty 'body'" in caplog.text

    jsonl = fx.write_lines(tmp_path / "b.jsonl.gz", [{"body": "ok"}, {"text": "wrong key"},
                                                     {"body": 3}], compress=False)
    import gzip

    jsonl.write_bytes(gzip.compress(jsonl.read_bytes()))
    stats = ReadStats(str(jsonl))
    assert list(iter_documents(jsonl, stats, TextFormat("body"))) == ["ok"]
    assert (stats.missing_text, stats.non_string_text) == (1, 1)


def test_files_without_documents(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"text": ["", None]}), path)
    with pytest.raises(UserError, match=r"empty\.parquet contains no documents .*skipped 2"):
        list(iter_documents(path))
    txt = tmp_path / "blank.txt"
    txt.write_text(" \n\n")
    for mode in ("file", "blank_line"):
        with pytest.raises(UserError, match=r"blank\.txt contains no documents"):
            list(iter_documents(txt, None, TextFormat(txt_documents=mode)))
    other_key = fx.write_corpus(tmp_path, "jsonl", ["a", "b"], text_field="content")
    with pytest.raises(UserError) as e:
        list(iter_documents(other_key))
    assert _one_line(e) == (f"{other_key} has no 'text' key in any line (its keys: 'id', "
                            f"'content'); set TEXT_FIELD to the key or column that holds the "
                            f"text, e.g. --fdl.TEXT_FIELD=content")


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "hf_dataset"])
def test_missing_column_names_file_field_and_columns(tmp_path, fmt):
    spec = fx.write_corpus(tmp_path, fmt, DOCS, text_field="content")
    (path,) = expand_files(spec)[:1]
    with pytest.raises(UserError, match=r"\.arrow|\.parquet") as e:
        list(iter_documents(path, None, TextFormat("body")))
    assert _one_line(e) == (f"{path} has no column 'body' (its columns: 'id', 'content'); "
                            "set TEXT_FIELD to the key or column that holds the text, e.g. "
                            "--fdl.TEXT_FIELD=content")
    with pytest.raises(UserError, match=r"column 'id' of .* holds int64, not strings; set "
                                        r"TEXT_FIELD .*--fdl.TEXT_FIELD=content"):
        list(iter_documents(path, None, TextFormat("id")))


def test_corrupt_gzip_and_parquet(tmp_path):
    gz = fx.write_corpus(tmp_path, "jsonl.gz", fx.make_docs(2000, seed=2))
    gz.write_bytes(gz.read_bytes()[: gz.stat().st_size // 2])
    with pytest.raises(UserError, match=r"corpus\.jsonl\.gz is truncated .* after \d+ documents"):
        list(iter_documents(gz))
    pq = tmp_path / "x.parquet"
    pq.write_bytes(b"not parquet at all")
    with pytest.raises(UserError, match=r"x\.parquet is not a readable Parquet file"):
        list(iter_documents(pq))


def test_unknown_suffix(tmp_path):
    csv = tmp_path / "data.csv"
    csv.write_text("text\nhello\n")
    expected = (r"data\.csv is not a supported data file; the names that can be read end in "
                r"\.jsonl, \.jsonl\.gz, \.jsonl\.zst, \.parquet, \.arrow, \.txt or TFDS")
    with pytest.raises(UserError, match=expected) as e:
        list(iter_documents(csv))
    _one_line(e)
    with pytest.raises(UserError, match=expected):
        expand_files(csv)


def test_expand_files_globs_dirs_and_lists(tmp_path):
    for sub, names in {"a": ["2.jsonl", "10.jsonl.gz", "README.md"], "a/deep": ["1.parquet"],
                       "b": ["x.txt"]}.items():
        (tmp_path / sub).mkdir(parents=True, exist_ok=True)
        for n in names:
            (tmp_path / sub / n).write_text("")
    assert [p.name for p in expand_files(tmp_path / "a")] == ["10.jsonl.gz", "2.jsonl"]
    assert [p.relative_to(tmp_path).as_posix() for p in expand_files(f"{tmp_path}/**/*")] == [
        "a/10.jsonl.gz", "a/2.jsonl", "a/deep/1.parquet", "b/x.txt"]
    assert [p.name for p in expand_files([f"{tmp_path}/b/*.txt", str(tmp_path / "a" / "2.jsonl")])
            ] == ["x.txt", "2.jsonl"]
    with pytest.raises(UserError, match=r"the data file pattern .*/\*\.jsonl\.zst matched "
                                        r"nothing; check the pattern") as e:
        expand_files(f"{tmp_path}/*.jsonl.zst")
    _one_line(e)
    with pytest.raises(UserError, match=r"matched only files of other formats \(README\.md"):
        expand_files(f"{tmp_path}/a/*.md")
    # Another tool's state.json does not make a directory a Hugging Face dataset; a name
    # with glob characters that exists is that file.
    (tmp_path / "b" / "state.json").write_text('{"step": 3}')
    (tmp_path / "b" / "x[1].jsonl").write_text("")
    assert [p.name for p in expand_files(tmp_path / "b")] == ["x.txt", "x[1].jsonl"]
    assert expand_files(tmp_path / "b" / "x[1].jsonl") == [tmp_path / "b" / "x[1].jsonl"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"the data directory .*empty holds no readable files"):
        expand_files(tmp_path / "empty")
    with pytest.raises(UserError, match=r"the data file .*nope\.jsonl does not exist"):
        expand_files(tmp_path / "nope.jsonl")
    # A name with no extension was meant as a directory.
    with pytest.raises(UserError, match=r"the data directory .*/nope does not exist"):
        expand_files(tmp_path / "nope")
    with pytest.raises(UserError, match="no data files given"):
        expand_files([])


def test_dataset_dict_directory_asks_for_a_split(tmp_path):
    import datasets

    ds = datasets.Dataset.from_dict({"text": ["a", "b"]})
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(UserError) as e:
        expand_files(tmp_path / "dd")
    assert _one_line(e) == (f"{tmp_path / 'dd'} is a Hugging Face DatasetDict (splits: train, "
                            f"test); pass one split's directory, e.g. {tmp_path / 'dd' / 'train'}")
    assert _read_all(tmp_path / "dd" / "train", TextFormat()) == ["a", "b"]


def test_missing_pyarrow(tmp_path, monkeypatch):
    path = fx.write_corpus(tmp_path, "parquet", DOCS)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(UserError) as e:
        list(iter_documents(path))
    assert _one_line(e).startswith(f"reading {path} needs pyarrow: pip install")


def test_text_format_values_are_checked():
    with pytest.raises(UserError, match=r"txt_documents='paragraph' is not one of 'file', "
                                        r"'blank_line'") as e:
        TextFormat(txt_documents="paragraph")
    _one_line(e)
    with pytest.raises(UserError, match=r"text_field='' must be a non-empty string"):
        TextFormat(text_field="")
    assert pickle.loads(pickle.dumps(TextFormat("body", "blank_line"))) == TextFormat(
        "body", "blank_line")


# --- tokenizers -----------------------------------------------------------------------------


def test_hf_tokenizer_roundtrip_ids_and_pickle(hf_path, hf_tok):
    assert isinstance(hf_tok, HFTokenizer)
    text = "The river model 123. Ünïcode ✓\n\nnew line"
    ids = hf_tok.encode(text)
    assert hf_tok.decode(ids) == text  # byte-level: nothing is lost
    assert (hf_tok.eos_id, hf_tok.pad_id, hf_tok.vocab_size) == (1, 0, 400)
    assert hf_tok.eos_id not in ids and 0 not in ids
    assert hf_tok.decode(ids + [hf_tok.eos_id]) == text  # special tokens are skipped
    assert hf_tok.encode_batch([text, "river"]) == [ids, hf_tok.encode("river")]
    assert hf_tok.encode_batch([text, "river"], num_threads=2) == [ids, hf_tok.encode("river")]
    again = pickle.loads(pickle.dumps(hf_tok))
    assert again.encode(text) == ids and again.sha256 == hf_tok.sha256 == __import__(
        "hashlib").sha256(hf_path.read_bytes()).hexdigest()
    assert load_tokenizer(hf_path.parent).sha256 == hf_tok.sha256  # the directory works too


def test_hf_tokenizer_adds_no_special_tokens(tmp_path, hf_path):
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(hf_path))
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", 1)])
    assert tok.encode("river").ids[-1] == 1
    (tmp_path / "t").mkdir()
    tok.save(str(tmp_path / "t" / "tokenizer.json"))
    loaded = load_tokenizer(tmp_path / "t" / "tokenizer.json")
    assert loaded.encode("river") == tok.encode("river", add_special_tokens=False).ids
    assert 1 not in loaded.encode("river")


def test_hf_tokenizer_eos_choice(tmp_path):
    texts = fx.make_docs(50, seed=5)
    path = fx.train_hf_tokenizer(tmp_path / "a", texts, 300, ("<pad>", "</s>", "<|endoftext|>"))
    assert load_tokenizer(path).eos_id == 1
    (path.parent / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": {"content": "<|endoftext|>", "special": True}}))
    assert load_tokenizer(path).eos_id == 2
    (path.parent / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    with pytest.raises(UserError, match=r"has no token '<\|im_end\|>' \(its EOS\); add an EOS"):
        load_tokenizer(path)
    no_eos = fx.train_hf_tokenizer(tmp_path / "b", texts, 300, ("<pad>",))
    with pytest.raises(UserError) as e:
        load_tokenizer(no_eos)
    assert _one_line(e).startswith(f"tokenizer {no_eos} has no EOS token (none of </s>, ")
    assert "add an EOS token" in str(e.value)


def test_a_tokenizer_is_recognised_by_its_content_whatever_its_name(tmp_path, sp_vocab,
                                                                    hf_path):
    """Pax's scripts mount the SentencePiece model as /mnt/vocab, with no suffix."""
    vocab = tmp_path / "vocab"
    vocab.write_bytes(Path(sp_vocab.path).read_bytes())
    loaded = load_tokenizer(vocab)
    assert isinstance(loaded, Vocabulary)
    assert loaded.encode("the data layer") == sp_vocab.encode("the data layer")
    tok = tmp_path / "tok"
    tok.write_bytes(Path(hf_path).read_bytes())
    assert isinstance(load_tokenizer(tok), HFTokenizer)
    misnamed = tmp_path / "spm.json"  # a name says nothing: a SentencePiece model
    misnamed.write_bytes(Path(sp_vocab.path).read_bytes())
    assert isinstance(load_tokenizer(misnamed), Vocabulary)


def test_load_tokenizer_kinds_and_errors(tmp_path, sp_vocab, monkeypatch):
    assert isinstance(load_tokenizer(sp_vocab.path), Vocabulary)
    vocab_txt = tmp_path / "vocab.txt"
    vocab_txt.write_text("a\nb\n")
    with pytest.raises(UserError) as e:
        load_tokenizer(vocab_txt)
    assert "is not a SentencePiece .model file or a Hugging Face tokenizer.json" in _one_line(e)
    with pytest.raises(UserError, match=r"tokenizer directory .* holds no tokenizer\.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(UserError, match=r"tokenizer .*nope\.json does not exist"):
        load_tokenizer(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(UserError, match=r"bad\.json is not a readable Hugging Face "
                                        r"tokenizer\.json") as e:
        load_tokenizer(bad)
    _one_line(e)
    with pytest.raises(UserError, match="no vocabulary given; set VOCAB_PATH / --vocab_path to a SentencePiece"):
        load_tokenizer(None)
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(UserError) as e:
        load_tokenizer(bad)
    assert _one_line(e).startswith(f"reading {bad} needs the tokenizers package: pip install")


def test_check_vocab_size_for_both(hf_tok, sp_vocab):
    check_vocab_size(hf_tok, 400)
    check_vocab_size(hf_tok, 50304)
    with pytest.raises(UserError, match=r"VOCAB_SIZE=256 but .*tokenizer\.json has 400 pieces; "
                                        r"set --fdl\.VOCAB_SIZE=512"):
        check_vocab_size(hf_tok, 256)
    with pytest.raises(UserError, match=r"tiny\.model has 320 pieces; set --fdl\.VOCAB_SIZE=384"):
        check_vocab_size(sp_vocab, 256)


# --- prepare and the inputs -----------------------------------------------------------------


def _expected_tokens(tok, docs) -> list[int]:
    return [t for d in docs for t in tok.encode(d) + [tok.eos_id]]


@pytest.mark.parametrize("which", ["sentencepiece", "hf"])
def test_prepare_parquet_with_each_tokenizer(tmp_path, which, sp_vocab, hf_tok):
    tok = sp_vocab if which == "sentencepiece" else hf_tok
    docs_a, docs_b = fx.make_docs(30, seed=21), fx.make_docs(20, seed=22)
    files = [fx.write_corpus(tmp_path, "parquet", docs_a, "body", name="a"),
             fx.write_corpus(tmp_path, "jsonl.gz", docs_b, "body", name="b")]
    text_format = TextFormat("body")
    # Two worker processes for the Hugging Face tokenizer: it and the format are pickled.
    shards = prepare(files, tok, cache_root=tmp_path / "cache", workers=2 if which == "hf" else 1,
                     progress=False, text_format=text_format)
    for shard, docs in zip(shards, [docs_a, docs_b], strict=True):
        assert list(shard.tokens()) == _expected_tokens(tok, docs)
        assert shard.num_docs == len(docs)
    manifest = json.loads((shards[0].tokens_path.parent / "manifest.json").read_text())
    assert manifest["text_format"] == {"text_field": "body", "txt_documents": "file"}
    assert manifest["eos_id"] == tok.eos_id
    # Without the format the field is missing, so the cache made with it is not reused.
    with pytest.raises(UserError, match=r"a\.parquet has no column 'text'"):
        prepare(files, tok, cache_root=tmp_path / "cache", workers=1, progress=False)


def test_cache_key_depends_on_format_and_tokenizer(tmp_path, sp_vocab, hf_tok):
    f = fx.write_corpus(tmp_path, "jsonl", ["a", "b"])
    key = cache_key([f], sp_vocab)
    assert cache_key([f], sp_vocab, TextFormat()) == key
    assert cache_key([f], sp_vocab, TextFormat("body")) != key
    assert cache_key([f], sp_vocab, TextFormat(txt_documents="blank_line")) != key
    assert cache_key([f], hf_tok) != key
    assert cache_key([f], hf_tok) == cache_key([f], pickle.loads(pickle.dumps(hf_tok)))


def test_eval_input_reads_the_format(tmp_path, hf_tok):
    docs = fx.make_docs(30, seed=31)
    path = fx.write_corpus(tmp_path, "arrow", docs, "body")
    rows = list(raw_rows([path], hf_tok, 32, keep_last_partial=True,
                         text_format=TextFormat("body")))
    stream = np.concatenate([row[1:n] for row, n in rows])
    assert list(stream) == _expected_tokens(hf_tok, docs)
    ev = PileEvalInput(path, hf_tok, 32, 4, None, text_format=TextFormat("body"))
    assert len(ev) == -(-len(rows) // 4)
