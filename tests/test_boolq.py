"""BoolQ (tasks/boolq.py), as Pax's GPU Llama experiments use it: the jsonl reader, Pax's input
format with the weight on the answer token only, the yes/no logit accuracy against a hand
computation, exact resume of the train input, one-line errors, and a tiny experiment with
DATASET="boolq" that trains and evaluates on 8 fake CPU devices."""

import json
import re
import types

import fiddle as fdl
import numpy as np
import pytest
import tokenizers
from praxis import py_utils

import experiments
from paxloom.core import errors
from paxloom.core.data import BATCH_DTYPES, DataSettings
from paxloom.core.errors import UserError
from paxloom.launch import job
from tasks import boolq, datasets
from tasks.tokenizer import load_tokenizer
from tests.support.data import make_docs, train_hf_tokenizer
from tests.support.tiny import TINY

SEQ_LEN = 64


def record(i: int, answer: bool) -> dict:
    words = make_docs(1, seed=i, min_words=4, max_words=10)[0].replace("\n", " ")
    return {"question": f"is the river {i} golden", "title": f"River {i}", "answer": answer,
            "passage": words}


TRAIN = [record(i, i % 3 != 0) for i in range(10)]
DEV = [record(100 + i, i % 2 == 0) for i in range(4)]
# SuperGLUE's copy: "label" 0/1 instead of "answer".
DEV.append({"question": "is it a superglue line", "passage": "It is.", "idx": 4, "label": 0})


def write_jsonl(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in records))
    return path


def yes_no_tokenizer(tmp_path_factory, vocab_size: int = 400):
    """A byte-level BPE tokenizer.json in which 'yes' and 'no' are single tokens."""
    texts = make_docs(100, seed=3) + ["yes", "no"] * 1000
    return train_hf_tokenizer(tmp_path_factory.mktemp("tok"), texts, vocab_size=vocab_size)


def write_boolq(root):
    """A data_dir with boolq/train.jsonl (TRAIN) and boolq/dev.jsonl (DEV)."""
    write_jsonl(root / "boolq" / "train.jsonl", TRAIN)
    write_jsonl(root / "boolq" / "dev.jsonl", DEV)
    return root


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    return yes_no_tokenizer(tmp_path_factory)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_path):
    return load_tokenizer(tokenizer_path)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_boolq(tmp_path_factory.mktemp("data"))


def eval_input(data_dir, tokenizer, batch_size=4, process_rows=(0, 4), seq_len=SEQ_LEN, **kw):
    return boolq.BoolQEvalInput(
        path=boolq.boolq_file(data_dir, "dev"), tokenizer=tokenizer,
        answer_ids=boolq.answer_token_ids(tokenizer), seq_len=seq_len,
        global_batch_size=batch_size, process_rows=process_rows, **kw)


def train_input(data_dir, tokenizer, seed=7, process_rows=(0, 4)):
    return boolq.BoolQTrainInput(
        path=boolq.boolq_file(data_dir, "train"), tokenizer=tokenizer,
        answer_ids=boolq.answer_token_ids(tokenizer), seq_len=SEQ_LEN, seed=seed,
        global_batch_size=4, process_rows=process_rows)


# ----- reading and formatting ------------------------------------------------------------


def test_reader_and_pax_format(tmp_path, tokenizer, data_dir):
    # Blank lines are skipped, and lines keep their numbers in the file.
    path = write_jsonl(tmp_path / "dev.jsonl", [DEV[0], "", DEV[4]])
    first, superglue = boolq.read_boolq(path)
    assert (first.question, first.passage, first.answer, first.line) == (
        DEV[0]["question"], DEV[0]["passage"], True, 1)
    assert (superglue.answer, superglue.line) == (False, 3)
    assert boolq.format_input(superglue) == "It is.\nquestion: is it a superglue line?\nanswer:"
    # data_dir may also be the directory holding the files.
    assert boolq.boolq_file(data_dir / "boolq", "dev") == boolq.boolq_file(data_dir, "dev")

    yes, no = boolq.answer_token_ids(tokenizer)
    assert [yes] == tokenizer.encode("yes") and [no] == tokenizer.encode("no")
    batches = list(eval_input(data_dir, tokenizer))
    assert len(batches) == 2  # 5 examples, batches of 4: the last has 3 padding rows
    for batch in batches:
        assert set(batch) == set(BATCH_DTYPES)
        for key, dtype in BATCH_DTYPES.items():
            assert batch[key].dtype == dtype and batch[key].shape == (4, SEQ_LEN), key
    examples = boolq.read_boolq(data_dir / "boolq" / "dev.jsonl")
    for index, example in enumerate(examples):
        batch, r = batches[index // 4], index % 4
        # [EOS as BOS] + the input text's tokens + the answer word's token, no EOS after it.
        tokens = ([tokenizer.eos_id] + tokenizer.encode(boolq.format_input(example))
                  + [yes if example.answer else no])
        n = len(tokens)
        np.testing.assert_array_equal(batch["ids"][r, :n - 1], tokens[:-1])
        np.testing.assert_array_equal(batch["labels"][r, :n - 1], tokens[1:])
        expected_weights = np.zeros(SEQ_LEN, np.float32)
        expected_weights[n - 2] = 1.0  # the answer token's label only
        np.testing.assert_array_equal(batch["weights"][r], expected_weights)
        np.testing.assert_array_equal(batch["paddings"][r], np.arange(SEQ_LEN) >= n - 1)
        np.testing.assert_array_equal(batch["segment_ids"][r], np.arange(SEQ_LEN) < n - 1)
    padding = batches[1]
    assert not padding["weights"][1:].any() and padding["paddings"][1:].all()

    # Each process gets its rows of the same global batches.
    halves = [list(eval_input(data_dir, tokenizer, process_rows=rows))
              for rows in ((0, 2), (2, 4))]
    for whole, low, high in zip(batches, *halves, strict=True):
        for key in BATCH_DTYPES:
            np.testing.assert_array_equal(whole[key], np.concatenate([low[key], high[key]]))


def test_long_inputs_keep_their_question(tokenizer, data_dir):
    """A row holds MAX_SEQ_LEN - 1 input tokens at MAX_SEQ_LEN <= 64 (MAX_SEQ_LEN - 64 above,
    as Pax), and a longer input keeps its end: the question and 'answer:'."""
    assert boolq.input_budget(4096) == 4096 - 64 and boolq.input_budget(16) == 15
    example = boolq.read_boolq(data_dir / "boolq" / "dev.jsonl")[0]
    full = tokenizer.encode(boolq.format_input(example))
    assert len(full) > 15
    batch = next(iter(eval_input(data_dir, tokenizer, seq_len=16, max_examples=1)))
    yes, _ = boolq.answer_token_ids(tokenizer)
    np.testing.assert_array_equal(batch["ids"][0], [tokenizer.eos_id] + full[-15:])
    assert batch["labels"][0, -1] == yes and batch["weights"][0, -1] == 1.0


# ----- the metric ------------------------------------------------------------------------


YES, NO = 3, 4  # answer ids of the fake predictions below (vocabulary of 5)


def fake_predictions():
    """Three examples and one padding row, T=4: per-position logits of 'yes' and 'no'."""
    labels = np.array([[1, 2, YES, 0],  # answer 'yes' at position 2
                       [1, NO, 0, 0],  # answer 'no' at position 1
                       [2, 1, 1, NO],  # answer 'no' at position 3
                       [0, 0, YES, 0]], np.int32)  # batch padding: no weights
    weights = np.zeros((4, 4), np.float32)
    weights[0, 2] = weights[1, 1] = weights[2, 3] = 1.0
    logits = np.zeros((4, 4, 5), np.float32)
    logits[0, 2, [YES, NO]] = [2.0, 1.0]  # yes > no, label yes: right
    logits[1, 1, [YES, NO]] = [1.5, 0.5]  # yes > no, label no: wrong...
    logits[1, 2, [YES, NO]] = [0.0, 9.0]  # ...whatever unweighted positions say
    logits[2, 3, [YES, NO]] = [-1.0, 2.0]  # no > yes, label no: right
    logits[3, 2, [YES, NO]] = [5.0, 0.0]  # padding would be right: must not count
    xent = np.arange(16, dtype=np.float32).reshape(4, 4) / 10
    predictions = py_utils.NestedMap(logits=logits, per_example_xent=xent,
                                     per_example_argmax=np.argmax(logits, -1))
    return predictions, {"labels": labels, "weights": weights}


def pax_boolq_acc(logits, labels, weights, num_examples):
    """praxis/contrib/gpu/scripts_gpu/models.py's boolq_acc, in numpy."""
    b, t = np.indices(labels.shape)
    ll_correct = logits[b, t, labels]
    # jnp indexing clamps the out-of-range 'other' ids of unweighted positions; so does this.
    ll_incorrect = logits[b, t, np.clip(YES + NO - labels, 0, logits.shape[-1] - 1)]
    return np.sum(((ll_correct - ll_incorrect) > 0) * weights) / num_examples


def test_accuracy_and_loss_against_a_hand_computation(tmp_path):
    predictions, batch = fake_predictions()
    evaluation = boolq.BoolQEval(name="boolq", make_input=None, answer_ids=(YES, NO))
    outputs = {k: np.asarray(v) for k, v in evaluation.batch_outputs(predictions, batch).items()}
    np.testing.assert_array_equal(outputs["num_answers_correct"], [1, 0, 1, 0])
    metrics = evaluation.metrics(outputs)
    assert metrics["num_examples"] == 3
    assert metrics["accuracy"] == pytest.approx(2 / 3)
    real = np.array([1, 1, 1, 0], np.float32)[:, None]
    assert metrics["accuracy"] == pytest.approx(pax_boolq_acc(
        predictions.logits, batch["labels"], batch["weights"] * real, 3))
    # Loss over the answer tokens of the three examples: xent [0, 2], [1, 1], [2, 3].
    assert metrics["loss"] == pytest.approx((0.2 + 0.5 + 1.1) / 3)

    data = types.SimpleNamespace(examples=[
        boolq.BoolQExample(f"q{i}", "p", answer, i + 1)
        for i, answer in enumerate([True, False, False])])
    path = evaluation.write_outputs(str(tmp_path), data, outputs)
    rows = [json.loads(line) for line in open(path)]
    assert [(r["answer"], r["predicted"], r["correct"]) for r in rows] == [
        ("yes", "yes", True), ("no", "yes", False), ("no", "no", True)]


# ----- the train input -------------------------------------------------------------------


def test_train_input_shuffles_each_epoch_and_resumes_exactly(tokenizer, data_dir):
    data = train_input(data_dir, tokenizer)
    for _ in range(3):
        data.next_batch()
    state = json.loads(json.dumps(data.get_state()))  # checkpoints store it as JSON
    expected = [data.next_batch() for _ in range(4)]
    resumed = train_input(data_dir, tokenizer)
    resumed.set_state(state)
    for want, got in zip(expected, (resumed.next_batch() for _ in range(4)), strict=True):
        for key in BATCH_DTYPES:
            np.testing.assert_array_equal(want[key], got[key])

    # One example per row, weighted on its answer only; every epoch is a new permutation.
    fresh = train_input(data_dir, tokenizer)
    batches = [fresh.next_batch() for _ in range(5)]  # 20 rows: two epochs of 10
    assert all((b["weights"].sum(axis=1) == 1).all() for b in batches)
    by_tokens = {tuple(t): i for i, t in enumerate(fresh.tokens)}
    order = [by_tokens[tuple(np.r_[b["ids"][r, 0], b["labels"][r][b["paddings"][r] == 0]])]
             for b in batches for r in range(4)]
    assert sorted(order[:10]) == sorted(order[10:]) == list(range(10))
    assert order[:10] != order[10:]
    other_seed = train_input(data_dir, tokenizer, seed=8).next_batch()
    assert not np.array_equal(other_seed["ids"], batches[0]["ids"])
    # Two processes' rows make the one global batch.
    halves = [train_input(data_dir, tokenizer, process_rows=rows).next_batch()
              for rows in ((0, 1), (1, 4))]
    np.testing.assert_array_equal(np.concatenate([h["ids"] for h in halves]), batches[0]["ids"])

    with pytest.raises(UserError, match="global_batch_size=8 but this run has "
                                        "global_batch_size=4"):
        resumed.set_state({**state, "global_batch_size": 8})


# ----- bad inputs: one line each ---------------------------------------------------------


def one_line(excinfo) -> str:
    message = errors.message(excinfo.value)  # as main.py prints it
    assert "\n" not in message, message
    return message


def test_bad_inputs_are_one_line(tmp_path, tokenizer_path, tokenizer, data_dir):
    with pytest.raises(UserError, match=r"missing\.jsonl does not exist; download") as e:
        boolq.read_boolq(tmp_path / "missing.jsonl")
    one_line(e)
    with pytest.raises(UserError, match=r"no BoolQ dev split under --data_dir=.*boolq/dev\.jsonl"
                       ) as e:
        boolq.boolq_file(tmp_path, "dev")
    one_line(e)
    with pytest.raises(UserError, match="DATASET='boolq' needs --data_dir") as e:
        boolq.boolq_file(None, "dev")
    one_line(e)

    cases = [
        ([DEV[0], "{not json"], r"bad\.jsonl:2 is not valid JSON"),
        ([{"passage": "p", "answer": True}], r'bad\.jsonl:1 has no "question" string'),
        ([DEV[0], {"question": "q", "passage": "p"}], r'bad\.jsonl:2 has no "answer"'),
        ([{"question": "q", "passage": "p", "answer": "maybe"}],
         r'bad\.jsonl:1 has "answer": "maybe"; it must be true or false'),
    ]
    for lines, message in cases:
        path = write_jsonl(tmp_path / "bad.jsonl", lines)
        with pytest.raises(UserError, match=message) as e:
            boolq.read_boolq(path)
        one_line(e)

    # A tokenizer that never saw 'yes' spells it in several byte-level pieces.
    other = load_tokenizer(train_hf_tokenizer(tmp_path, make_docs(100, seed=4), vocab_size=300))
    with pytest.raises(UserError, match=r"tokenizer .*tokenizer\.json encodes the BoolQ answer "
                                        r"'yes' as \d tokens") as e:
        boolq.answer_token_ids(other)
    one_line(e)

    settings = DataSettings(seq_len=SEQ_LEN, vocab_size=512, seed=0, packed=False,
                            eval_batches=0, data_dir=str(data_dir))
    dataset = datasets.lookup("boolq")
    with pytest.raises(UserError, match="DATASET='boolq' needs --vocab_path") as e:
        fdl.build(dataset.tokenizer(settings))
    one_line(e)


def test_answer_words_are_the_tokens_that_follow_answer(tmp_path):
    """A byte-level BPE tokenizer (docs/guides/data.md's recipe) continues "answer:" with
    " yes" (one token, "Ġyes"), not with "yes" on its own: the row ends "answer: yes", as
    the model reads it, not "answer:yes"."""
    texts = make_docs(100, seed=5) + [f"question: q?\nanswer: {w}" for w in ("yes", "no")] * 500
    path = train_hf_tokenizer(tmp_path, texts, vocab_size=400)
    bpe = load_tokenizer(path)
    vocab = tokenizers.Tokenizer.from_file(str(path))
    assert bpe.encode("yes") != [vocab.token_to_id("Ġyes")]  # Pax's s.encode('yes')
    assert boolq.answer_token_ids(bpe) == (vocab.token_to_id("Ġyes"), vocab.token_to_id("Ġno"))


# ----- end to end ------------------------------------------------------------------------


@pytest.mark.usefixtures("compilation_cache")
def test_tiny_experiment_trains_and_reports_boolq_accuracy(tmp_path, tokenizer_path, data_dir,
                                                           capsys):
    exp = experiments.BaseExperiment(**{
        **TINY, "DATASET": "boolq", "ICI_MESH_SHAPE": [2, 2, 2], "PERCORE_BATCH_SIZE": 1,
        "MAX_STEPS": 3, "EVAL_INTERVAL_STEPS": 3, "SUMMARY_INTERVAL_STEPS": 1})
    config = exp.run_config(data_dir=str(data_dir), vocab_path=str(tokenizer_path))
    job.run(exp, job.RunOptions(mode="train", job_log_dir=str(tmp_path)), config=config)
    out = capsys.readouterr().out
    assert len(re.findall(r"^step +\d \| loss ([\d.]+)", out, re.M)) == 3, out
    accuracy = re.search(r"step +3 \| eval boolq \| accuracy ([\d.]+) \| loss ([\d.]+) \| "
                         r"num_examples 5", out)
    assert accuracy and 0.0 <= float(accuracy.group(1)) <= 1.0, out

    results = job.run(exp, job.RunOptions(mode="eval", job_log_dir=str(tmp_path)),
                      config=config)
    assert results["boolq"]["accuracy"] == pytest.approx(float(accuracy.group(1)))
    rows = [json.loads(line) for line in open(tmp_path / "boolq_predictions.jsonl")]
    assert [r["answer"] for r in rows] == ["yes", "no", "yes", "no", "no"]
    assert np.mean([r["correct"] for r in rows]) == pytest.approx(results["boolq"]["accuracy"])


def test_pax_llama_experiments_take_the_answer_words_from_a_hyperparameter(tmp_path):
    """Issue 31: which words answer BoolQ is set without code (--fdl.BOOLQ_ANSWER_WORDS),
    and the words reach the answer tokens."""
    exp = experiments.resolve("experiments.LLaMA7B")(BOOLQ_ANSWER_WORDS=["true", "false"])
    dataset = exp.dataset()
    assert dataset.answer_words == ("true", "false") and dataset.bos_id == 1
    texts = make_docs(100, seed=5) + [f"question: q?\nanswer: {w}" for w in ("true", "false")] * 500
    path = train_hf_tokenizer(tmp_path, texts, vocab_size=400)
    vocab = tokenizers.Tokenizer.from_file(str(path))
    assert boolq.answer_token_ids(load_tokenizer(path), dataset.answer_words) == (
        vocab.token_to_id("Ġtrue"), vocab.token_to_id("Ġfalse"))
