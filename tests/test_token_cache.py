"""The token cache (tasks/prepare.py) and the text field of your own files.

Tokenized data go to the user's cache ($PAXLOOM_TOKEN_CACHE_DIR, else ~/.cache/paxloom/
tokenized, or --cache_dir), never into the data directory, which is only read; the cache's
key holds each file's absolute path, size and mtime. In a multi-process job process 0
tokenizes and the others wait for it. TEXT_FIELD names the jsonl key or parquet column of
the text, for the training files and the evaluation files alike; a wrong one is one line
naming TEXT_FIELD, the file and the keys or columns it has."""

import json
import os
import subprocess
import textwrap

import fiddle as fdl
import pytest
from praxis import pax_fiddle

import experiments
from paxloom.core.errors import UserError
from tasks.prepare import cache_key, prepare
from tasks.text import TextFiles
from tasks.tokenizer import load_tokenizer
from tests.support.data import make_docs, tiny_vocab_path, write_corpus
from tests.support.processes import (
    PYTHON,
    TIMEOUT_S,
    free_port,
    isolated_env,
    run_main,
    session_env,
)
from tests.support.tiny import TINY, tiny_flags


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return tiny_vocab_path(tmp_path_factory)


def listing(root) -> dict:
    """{path: (size, mtime)} of everything under `root`: a data directory, unchanged."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def read_only(root) -> None:
    for p in [*root.rglob("*"), root]:
        p.chmod(0o555 if p.is_dir() else 0o444)


def writable(root) -> None:
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


@pytest.mark.process
def test_a_read_only_data_directory_trains_with_its_own_text_field(tmp_path, vocab):
    """main.py on jsonl files whose text is under "content", in read-only directories:
    --fdl.TEXT_FIELD=content is read by training and by the validation files alike, the
    token cache is made under $PAXLOOM_TOKEN_CACHE_DIR, and the data are left as they were.
    (Tests run as root, whom chmod does not stop: the listing shows nothing was written.)"""
    data, held_out = tmp_path / "data", tmp_path / "held_out"
    write_corpus(data, "jsonl", make_docs(160, seed=21), text_field="content")
    write_corpus(held_out, "jsonl", make_docs(40, seed=22), text_field="content")
    before = {**listing(data), **listing(held_out)}
    read_only(data)
    read_only(held_out)
    try:
        out = run_main(
            "--fdl_config=experiments.Tiny", f"--data_dir={data}", f"--vocab_path={vocab}",
            f"--job_log_dir={tmp_path / 'job'}",
            *tiny_flags(DATASET="text", TEXT_FIELD="content", VALIDATION_FILES=str(held_out),
                        MAX_STEPS=2, SUMMARY_INTERVAL_STEPS=1, EVAL_INTERVAL_STEPS=2,
                        EVAL_BATCHES=1, LAMBADA_EVAL=False, CHECKPOINT_EVERY_N_STEPS=0),
            env=session_env(PAXLOOM_TOKEN_CACHE_DIR=str(tmp_path / "tokens")))
    finally:
        writable(data)
        writable(held_out)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step      2 | loss" in out.stdout and "eval validation | loss" in out.stdout
    assert {**listing(data), **listing(held_out)} == before
    (manifest,) = (tmp_path / "tokens").glob("*/manifest.json")
    recorded = json.loads(manifest.read_text())
    assert recorded["text_format"]["text_field"] == "content"
    assert [f["source"] for f in recorded["files"]] == [str(data / "corpus.jsonl")]
    assert recorded["files"][0]["num_docs"] == 160  # every line read: none lacked "content"


def test_the_cache_key_tells_corpora_of_the_same_names_apart(tmp_path, vocab, monkeypatch):
    """Two directories with a file of the same name, size and mtime: two cache entries, in
    $PAXLOOM_TOKEN_CACHE_DIR; a second prepare of either finds its own."""
    docs = make_docs(20, seed=1)
    a = write_corpus(tmp_path / "a", "jsonl", docs)
    b = write_corpus(tmp_path / "b", "jsonl", [d.swapcase() for d in docs])  # as many bytes
    assert a.name == b.name and a.stat().st_size == b.stat().st_size
    os.utime(b, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns))
    tokenizer = load_tokenizer(str(vocab))
    assert cache_key([a], tokenizer) != cache_key([b], tokenizer)
    monkeypatch.setenv("PAXLOOM_TOKEN_CACHE_DIR", str(tmp_path / "tokens"))
    (shard_a,), (shard_b,) = (prepare([f], tokenizer, workers=1, progress=False) for f in (a, b))
    assert shard_a.tokens_path.parent.parent == tmp_path / "tokens"
    assert shard_a.tokens_path.parent != shard_b.tokens_path.parent
    assert list(shard_a.tokens()) != list(shard_b.tokens())
    assert not list((tmp_path / "a").glob("*tokenized*"))


def _text_run(tmp_path, vocab, **hyperparameters):
    exp = experiments.BaseExperiment(**{**TINY, "DATASET": "text", **hyperparameters})
    return exp.run_config(data_dir=str(tmp_path / "data"), vocab_path=str(vocab),
                          cache_dir=str(tmp_path / "cache"))


def test_text_field_is_one_node_for_training_and_evaluation(tmp_path, vocab):
    write_corpus(tmp_path / "data", "jsonl", make_docs(20, seed=3), text_field="content")
    write_corpus(tmp_path / "val", "jsonl", make_docs(8, seed=4), text_field="content")
    config = _text_run(tmp_path, vocab, TEXT_FIELD="content", EVAL_BATCHES=1,
                       VALIDATION_FILES=str(tmp_path / "val"))
    train_format = config.make_train_input.text_format
    assert train_format is config.evals[0].make_input.text_format  # derived once, shared
    assert train_format.text_field == "content" and fdl.get_callable(train_format).__name__ == (
        "TextFormat")
    # A held-out share: the two halves' formats, both of the one field.
    held = _text_run(tmp_path, vocab, TEXT_FIELD="content", EVAL_BATCHES=1,
                     VALIDATION_FRACTION=0.2)
    assert {held.make_train_input.text_format.text_field,
            held.evals[0].make_input.text_format.text_field} == {"content"}


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_wrong_text_field_is_one_line_naming_text_field_and_what_the_file_has(
        tmp_path, vocab, fmt):
    pytest.importorskip("pyarrow")
    path = write_corpus(tmp_path / "data", fmt, make_docs(20, seed=5), text_field="content")
    run = pax_fiddle.build(_text_run(tmp_path, vocab))
    with pytest.raises(UserError) as error:
        run.make_train_input(global_batch_size=8, process_rows=(0, 8))
    has = {"jsonl": "has no 'text' key in any line (its keys:",
           "parquet": "has no column 'text' (its columns:"}[fmt]
    assert str(error.value) == (
        f"{path} {has} 'id', 'content'); set TEXT_FIELD to the key or column that holds the "
        f"text, e.g. --fdl.TEXT_FIELD=content")


def test_text_field_where_no_text_field_is_read(tmp_path):
    with pytest.raises(UserError, match=r"^TEXT_FIELD='content': BaseExperiment's dataset "
                                        r"\(Synthetic\) has no text field to choose"):
        experiments.BaseExperiment(**{**TINY, "TEXT_FIELD": "content"})

    class Own(experiments.BaseExperiment):
        def dataset(self):
            return TextFiles(train=str(tmp_path), text_field="body")

    with pytest.raises(UserError, match=r"TEXT_FIELD='content', but the experiment's "
                                        r"TextFiles\(text_field='body'\) names its own"):
        Own(**{**TINY, "TEXT_FIELD": "content"}).run_config()


# Two processes of one jax.distributed job prepare the same file (tasks/prepare.py).
PREPARE = textwrap.dedent('''
    import json, sys, time
    import jax
    jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2,
                               process_id=int(sys.argv[2]))
    from tasks import prepare
    from tasks.tokenizer import load_tokenizer

    calls = []
    tokenize = prepare._prepare_missing

    def counted(*args, **kwargs):
        calls.append(1)
        if sys.argv[2] == "0":
            time.sleep(2)  # the other process waits for this, and does not start its own
        return tokenize(*args, **kwargs)

    prepare._prepare_missing = counted
    (shard,) = prepare.prepare([sys.argv[3]], load_tokenizer(sys.argv[4]),
                               cache_root=sys.argv[5], workers=1, progress=False)
    print(json.dumps({"tokenized": len(calls), "tokens": int(shard.num_tokens),
                      "where": str(shard.tokens_path.parent)}))
''')


def _prepare_in_two_processes(corpus, vocab, caches) -> list[dict]:
    address = f"127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([PYTHON, "-c", PREPARE, address, str(rank), str(corpus),
                               str(vocab), str(cache)], env=isolated_env(1),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank, cache in enumerate(caches)]
    outs = [p.communicate(timeout=TIMEOUT_S) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


@pytest.mark.process
@pytest.mark.multiprocess
def test_process_zero_tokenizes_and_the_others_wait(tmp_path, vocab):
    corpus = write_corpus(tmp_path / "data", "jsonl", make_docs(60, seed=6))
    shared = tmp_path / "shared"
    zero, one = _prepare_in_two_processes(corpus, vocab, [shared, shared])
    assert (zero["tokenized"], one["tokenized"]) == (1, 0)
    assert zero["where"] == one["where"] and zero["tokens"] == one["tokens"]
    # A cache local to each node: process 1 does not see process 0's, and makes its own.
    zero, one = _prepare_in_two_processes(corpus, vocab, [tmp_path / "node0", tmp_path / "node1"])
    assert (zero["tokenized"], one["tokenized"]) == (1, 1) and zero["tokens"] == one["tokens"]
