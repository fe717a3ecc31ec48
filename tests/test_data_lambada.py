"""Lambada: exact reading, target tokenization and weights, and the metric on hand-made cases."""

import json
import math

import numpy as np
import pytest

from paxloom.core.errors import UserError
from tasks.lambada import (
    LambadaExample,
    lambada_batches,
    lambada_metrics,
    read_lambada,
    score_batch,
    tokenize_example,
    write_predictions,
)
from tasks.vocab import load_vocabulary
from tests.support import data as fx


@pytest.fixture(scope="session")
def vocab(tmp_path_factory):
    return load_vocabulary(fx.tiny_vocab_path(tmp_path_factory))


def _write(tmp_path, lines):
    return fx.write_lines(tmp_path / "lambada_test.jsonl", lines)


def test_read_splits_last_word_with_its_space(tmp_path):
    path = _write(
        tmp_path, [{"text": "the cat sat on the mat"}, "", {"text": "He opened the door .  window"}]
    )
    examples = read_lambada(path)
    assert examples == [
        LambadaExample("the cat sat on the", " mat", 1),
        LambadaExample("He opened the door .", "  window", 3),
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"{broken", r"lambada_test\.jsonl:2 is not valid JSON"),
        ({"txt": "a b"}, r'lambada_test\.jsonl:2 has no "text" string'),
        ({"text": 5}, r'lambada_test\.jsonl:2 has no "text" string'),
        ({"text": "   single   "}, r"lambada_test\.jsonl:2 has fewer than two words"),
    ],
)
def test_bad_lines_are_errors_with_file_and_line(tmp_path, line, message):
    path = _write(tmp_path, [{"text": "fine passage here"}, line])
    with pytest.raises(UserError, match=message):
        read_lambada(path)


def test_empty_or_missing_file(tmp_path):
    with pytest.raises(UserError, match="has no examples"):
        read_lambada(_write(tmp_path, [""]))
    with pytest.raises(
        UserError,
        match=r"does not exist; download it with `python scripts_gpu/download_lambada\.py`",
    ):
        read_lambada(tmp_path / "missing.jsonl")


def test_target_tokens_are_weighted_exactly(vocab):
    examples = [
        LambadaExample("the river flows under the", " bridge", 1),
        LambadaExample("a quiet garden", " music", 2),
        LambadaExample("signal", " number", 3),
    ]
    seq_len = 64
    batches = list(lambada_batches(examples, vocab, seq_len, batch_size=2))
    assert len(batches) == 2
    for b, batch in enumerate(batches):
        for r in range(2):
            i = 2 * b + r
            if i >= len(examples):  # padding row
                assert batch["weights"][r].sum() == 0 and (batch["paddings"][r] == 1).all()
                continue
            ex = examples[i]
            target = vocab.encode(ex.target)
            tokens = [vocab.eos_id] + vocab.encode(ex.context) + target
            n = len(tokens)
            assert batch["ids"][r, : n - 1].tolist() == tokens[:-1]
            assert batch["labels"][r, : n - 1].tolist() == tokens[1:]
            weighted = batch["labels"][r][batch["weights"][r] > 0].tolist()
            assert weighted == target
            assert vocab.decode(weighted) == ex.target.strip()
            assert batch["paddings"][r].tolist() == [0.0] * (n - 1) + [1.0] * (seq_len - n + 1)
            assert batch["segment_ids"][r].tolist() == [1] * (n - 1) + [0] * (seq_len - n + 1)


def test_long_context_truncated_from_the_left(vocab):
    ex = LambadaExample("model data train token " * 50 + "last words before the", " answer", 1)
    tokens, num_target = tokenize_example(ex, vocab, seq_len=16)
    assert len(tokens) == 17
    assert tokens[-num_target:].tolist() == vocab.encode(" answer")
    assert (
        tokens[:-num_target].tolist()
        == ([vocab.eos_id] + vocab.encode(ex.context))[-(17 - num_target) :]
    )
    with pytest.raises(UserError, match="does not fit MAX_SEQ_LEN=2"):
        tokenize_example(LambadaExample("x", " extraordinarily", 7), vocab, seq_len=2)


def test_process_rows_slice_the_batch(vocab):
    examples = [LambadaExample(f"context number {i} is", " here", i) for i in range(6)]
    whole = list(lambada_batches(examples, vocab, 16, 4))
    parts = [
        list(lambada_batches(examples, vocab, 16, 4, process_rows=r)) for r in [(0, 1), (1, 4)]
    ]
    for k in range(2):
        for key in whole[k]:
            assert np.array_equal(
                np.concatenate([parts[0][k][key], parts[1][k][key]]), whole[k][key]
            )


def test_metric_predicting_targets_gives_accuracy_one(vocab):
    examples = [
        LambadaExample("the cat sat on the", " mat", 1),
        LambadaExample("open the", " window", 2),
    ]
    (batch,) = lambada_batches(examples, vocab, 16, 4)
    logprob = np.where(batch["weights"] > 0, math.log(0.5), -9.0)
    scores = score_batch(batch, batch["labels"], logprob)
    n = scores["num_targets"]
    assert n.tolist()[2:] == [0, 0]  # padding rows
    metrics = lambada_metrics(scores["num_correct_targets"], n, scores["target_logprob"])
    assert metrics["accuracy"] == 1.0
    assert metrics["num_examples"] == 2
    assert metrics["perplexity"] == pytest.approx(2.0)
    assert metrics["target_log_likelihood"] == pytest.approx(np.mean(n[:2]) * math.log(0.5))


def test_metric_one_wrong_token_makes_the_example_wrong():
    # example 0: 3 target tokens, 2 right; example 1: 1 token, right
    metrics = lambada_metrics([2, 1], [3, 1], [-1.0, -0.5])
    assert metrics["accuracy"] == 0.5
    assert lambada_metrics([2], [3], [-1.0])["accuracy"] == 0.0
    assert metrics["perplexity"] == pytest.approx(math.exp(1.5 / 4))
    assert metrics["target_log_likelihood"] == pytest.approx(-0.75)


def test_score_batch_counts_wrong_argmax(vocab):
    (batch,) = lambada_batches([LambadaExample("signal and", " extraordinarily", 1)], vocab, 16, 1)
    predicted = batch["labels"].copy()
    target_positions = np.flatnonzero(batch["weights"][0])
    assert len(target_positions) > 1
    predicted[0, target_positions[-1]] += 1
    scores = score_batch(batch, predicted, np.zeros_like(batch["weights"]))
    assert scores["num_correct_targets"][0] == len(target_positions) - 1
    assert (
        lambada_metrics(scores["num_correct_targets"], scores["num_targets"], [0.0])["accuracy"]
        == 0.0
    )


def test_write_predictions(tmp_path, vocab):
    examples = [
        LambadaExample("the cat sat on the", " mat", 1),
        LambadaExample("open the", " window", 2),
    ]
    predicted = [vocab.encode(" mat"), vocab.encode(" door")]
    out = write_predictions(
        tmp_path / "eval" / "lambada.jsonl",
        examples,
        vocab,
        [1, 0],
        [1, 1],
        [-0.1, -3.0],
        predicted,
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records[0] == {
        "line": 1,
        "context": "the cat sat on the",
        "target": " mat",
        "prediction": "mat",
        "correct": True,
        "target_logprob": -0.1,
    }
    assert records[1]["correct"] is False and records[1]["prediction"] == "door"
