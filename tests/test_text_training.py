"""Training on text in the real Pile/Lambada formats, end to end through the runner."""

import json
import random
import re

import pytest
from praxis import pax_fiddle

import experiments
from paxloom.runner.cluster import mesh as mesh_lib
from paxloom.runner.training.builtin_callbacks import CallbackList, TensorBoard
from paxloom.runner.training.trainer import Trainer
from tasks.train_vocab import train_sentencepiece
from tests.support.data import write_lines, write_pile
from tests.support.processes import bare_env, run_main
from tests.support.tiny import SHORT_PILE_RUN, TINY, tiny_flags

_WORDS = ("amber basil cedar delta ember fable garnet harbor indigo jasper kestrel lumen "
          "meadow nectar orchid pewter quartz raven sable thistle umber violet willow yarrow").split()


def _phrases(n=12, words=7, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.sample(_WORDS, words)) for _ in range(n)]


@pytest.fixture(scope="module")
def learnable_data(tmp_path_factory):
    """Documents made of a few fixed phrases; Lambada asks for each phrase's last word."""
    root = tmp_path_factory.mktemp("learnable")
    phrases = _phrases()
    rng = random.Random(1)
    docs = [". ".join(rng.choice(phrases) for _ in range(rng.randint(3, 12))) for _ in range(600)]
    for i in range(2):
        write_pile(root / "pile" / "train" / f"{i:02d}.jsonl.zst", docs[i * 250:(i + 1) * 250])
    write_pile(root / "pile" / "val.jsonl.zst", docs[500:])
    write_lines(root / "lambada" / "lambada_test.jsonl", [{"text": p} for p in phrases])
    vocab = train_sentencepiece(docs, 512, root / "spm.model", num_threads=1)
    return root, vocab


def _trainer(tmp_path, data_dir, vocab, **overrides):
    exp = experiments.BaseExperiment(**{
        **TINY, "DATASET": "pile", "LAMBADA_EVAL": True, "VOCAB_SIZE": 512,
        "ICI_MESH_SHAPE": [2, 2, 2], "PERCORE_BATCH_SIZE": 1, "EVAL_BATCHES": 2,
        "LEARNING_RATE": 3e-3, "LR_COS_WARMUP": 5, "LR_COS_DECAY_START": 5, **overrides})
    run = pax_fiddle.build(exp.run_config(data_dir=data_dir and str(data_dir), vocab_path=str(vocab)))
    mesh = mesh_lib.create_mesh(run.mesh.ici_mesh_shape, run.mesh.dcn_mesh_shape)
    return Trainer(run, mesh, str(tmp_path))


def test_lambada_accuracy_rises_above_chance(tmp_path, learnable_data):
    data_dir, vocab = learnable_data
    trainer = _trainer(tmp_path, data_dir, vocab, MAX_STEPS=120, LR_COS_DECAY_END=120,
                       SUMMARY_INTERVAL_STEPS=40)
    state = trainer.init_state()
    before = trainer.evaluate(state["params"], 0)
    state = trainer.train(state)
    after = trainer.evaluate(state["params"], 120, predictions_dir=str(tmp_path),
                             callbacks=CallbackList([TensorBoard(str(tmp_path))]))
    assert before["lambada"]["accuracy"] < 0.1
    assert after["lambada"]["accuracy"] >= 0.5, after
    assert after["pile_val"]["loss"] < 0.5 * before["pile_val"]["loss"]
    lines = (tmp_path / "lambada_predictions.jsonl").read_text().splitlines()
    assert len(lines) == 12
    record = json.loads(lines[0])
    assert set(record) >= {"context", "target", "prediction", "correct", "target_logprob"}
    # The metric counts an example correct exactly when the whole target is predicted.
    correct = [json.loads(line)["correct"] for line in lines]
    assert sum(correct) / len(correct) == pytest.approx(after["lambada"]["accuracy"])
    # TensorBoard events for both evaluation sets (the TensorBoard callback's).
    assert list((tmp_path / "tb" / "eval").glob("events.out.tfevents.*"))


@pytest.mark.process
def test_main_trains_on_pile_layout_and_evaluates(tmp_path, learnable_data):
    data_dir, vocab = learnable_data
    out = run_main("--fdl_config=experiments.GPT126M", f"--data_dir={data_dir}",
                   f"--job_log_dir={tmp_path / 'job'}",
                   *tiny_flags(**SHORT_PILE_RUN, ICI_MESH_SHAPE=[8, 1, 1], PERCORE_BATCH_SIZE=1,
                               CHECKPOINT_EVERY_N_STEPS=0),
                   env=bare_env(VOCAB_PATH=str(vocab), PATH="/usr/bin:/bin"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "eval pile_val | loss" in out.stdout
    assert "eval lambada | accuracy" in out.stdout


def test_vocab_size_smaller_than_the_vocabulary_is_one_line_error(tmp_path, learnable_data):
    data_dir, vocab = learnable_data
    with pytest.raises(Exception, match=r"VOCAB_SIZE=256 but .* has 512 pieces; set "
                                        r"--fdl.VOCAB_SIZE=512"):
        _trainer(tmp_path, data_dir, vocab, VOCAB_SIZE=256)


def test_missing_data_dir_is_named(tmp_path, learnable_data):
    _, vocab = learnable_data
    with pytest.raises(Exception, match=r"needs --data_dir"):
        _trainer(tmp_path, None, vocab)


@pytest.mark.process
def test_an_evaluation_interval_with_nothing_to_evaluate_says_so(tmp_path, learnable_data):
    """DATASET="text" on The Pile's training shards alone: no validation set was given, so
    EVAL_INTERVAL_STEPS has nothing to run, and the run says so before training."""
    data_dir, vocab = learnable_data
    out = run_main("--fdl_config=experiments.Tiny", f"--data_dir={data_dir / 'pile' / 'train'}",
                   f"--vocab_path={vocab}", f"--job_log_dir={tmp_path / 'job'}",
                   *tiny_flags(**{**SHORT_PILE_RUN, "DATASET": "text", "LAMBADA_EVAL": False,
                                  "MAX_STEPS": 2, "EVAL_INTERVAL_STEPS": 2}))
    assert out.returncode == 0, out.stderr[-3000:]
    assert ("note: EVAL_INTERVAL_STEPS=2, but Tiny has nothing to evaluate (no validation set, "
            "no Lambada): training only; for evaluations set --fdl.VALIDATION_FRACTION=0.01"
            ) in out.stdout
    assert out.stdout.index("note: EVAL_INTERVAL_STEPS") < out.stdout.index("step      2")
    # The corpus in one line before the first step.
    assert re.search(r"training data: 2 file\(s\), 500 documents, [\d,]+ tokens: [\d,]+ "
                     r"packed sequences of 64, [\d,]+ steps per epoch of 16\n", out.stdout)
    assert out.stdout.index("training data:") < out.stdout.index("step      2")
