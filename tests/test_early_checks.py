"""Everything a run needs is checked before its first step (data files of every enabled
evaluation, the vocabulary, the output directory), and --mode=decode/eval reuse the
recorded run's settings (issue 24, parts 3 and 5)."""

import json
import os

import pytest

from paxloom.core.errors import UserError
from paxloom.launch import job
from paxloom.launch import record as run_record
from tests.support.data import make_docs, make_pile_dir, tiny_vocab_path
from tests.support.processes import run_main

# Tiny on a Pile-format directory: evaluates (Pile validation, Lambada) at step 2.
PILE_TINY = ["--fdl_config=experiments.Tiny", "--fdl.DATASET='pile'", "--fdl.MAX_STEPS=4",
             "--fdl.EVAL_INTERVAL_STEPS=2", "--fdl.CHECKPOINT_EVERY_N_STEPS=2",
             "--fdl.EVAL_BATCHES=1", "--fdl.LAMBADA_MAX_EXAMPLES=4",
             "--fdl.SUMMARY_INTERVAL_STEPS=2"]


def error_lines(out) -> list[str]:
    return [line for line in out.stderr.strip().splitlines() if line.startswith("error:")]


@pytest.fixture
def vocab(tmp_path_factory):
    return str(tiny_vocab_path(tmp_path_factory))


@pytest.fixture
def other_vocab(tmp_path_factory):
    from tasks.train_vocab import train_sentencepiece

    path = tmp_path_factory.mktemp("other_vocab") / "other.model"
    train_sentencepiece(make_docs(300, seed=77), 320, path, num_threads=1)
    return str(path)


# ----- Part 3: data files are checked before the first step ------------------------------


@pytest.mark.process
def test_missing_validation_file_fails_before_the_first_step(tmp_path, vocab):
    data = make_pile_dir(tmp_path / "data", num_train_files=1, docs_per_file=20)
    (data / "pile" / "val.jsonl.zst").unlink()
    run_dir = tmp_path / "run"
    out = run_main(*PILE_TINY, f"--data_dir={data}", f"--vocab_path={vocab}",
                   f"--job_log_dir={run_dir}")
    assert out.returncode == 2, out.stderr[-2000:]
    (line,) = error_lines(out)
    assert "val.jsonl.zst does not exist" in line and "--fdl.EVAL_BATCHES=0" in line, line
    assert not (run_dir / "checkpoints").exists()
    assert not (run_dir / "hyperparameters.json").exists()  # nothing recorded: no step ran
    assert "step" not in out.stdout.lower() or "step 1" not in out.stdout


def _tiny(**overrides):
    from experiments import gpt

    return gpt.Tiny(**{"DATASET": "pile", "MAX_STEPS": 4, "EVAL_INTERVAL_STEPS": 2,
                       "EVAL_BATCHES": 1, **overrides})


def test_missing_lambada_file_names_the_switch(tmp_path, vocab):
    data = make_pile_dir(tmp_path / "data", num_train_files=1, docs_per_file=20)
    (data / "lambada" / "lambada_test.jsonl").unlink()
    exp = _tiny(LAMBADA_EVAL=True)
    config = exp.run_config(data_dir=str(data), vocab_path=vocab)
    with pytest.raises(UserError, match=r"lambada_test.jsonl does not exist.*"
                                        r"--fdl.LAMBADA_EVAL=False") as caught:
        job.run(exp, job.RunOptions(job_log_dir=str(tmp_path / "run")), config)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "run" / "checkpoints").exists()
    # Without evaluation during training, the missing files are not needed.
    config.loop.eval_interval_steps = 0
    job.check_inputs(job.pax_fiddle.build(config), "train")
    with pytest.raises(UserError, match="LAMBADA_EVAL=False"):  # --mode=eval runs them all
        job.check_inputs(job.pax_fiddle.build(config), "eval")


# ----- Part 5: decode and eval use the run's recorded settings ---------------------------


def _record(run_dir, exp, config, vocab, data):
    """hyperparameters.json as a training run with these flags writes it."""
    spec = job.pax_fiddle.build(config)
    run_record.write_config(str(run_dir), exp, config, run_record.run_record(
        {"data_dir": str(data), "vocab_path": vocab, "cache_dir": None}, spec.tokenizer))


def test_vocabulary_fingerprint_is_recorded_and_checked(tmp_path, vocab, other_vocab):
    from tasks.tokenizer import load_tokenizer

    data = make_pile_dir(tmp_path / "data", num_train_files=1, docs_per_file=20)
    exp = _tiny()
    _record(tmp_path / "run", exp, exp.run_config(data_dir=str(data), vocab_path=vocab),
            vocab, data)
    record = json.loads((tmp_path / "run" / "hyperparameters.json").read_text())
    assert record["data_locations"]["vocab_path"] == os.path.abspath(vocab)
    assert record["tokenizer"]["vocab_size"] == load_tokenizer(vocab).vocab_size
    run_record.check_vocabulary(load_tokenizer(vocab), str(tmp_path / "run"), None)  # the same: ok
    with pytest.raises(UserError, match=r"--vocab_path=.*other.model .* is not the vocabulary "
                                        r"this run trained with .*tiny.model.*drop --vocab_path"):
        run_record.check_vocabulary(load_tokenizer(other_vocab), str(tmp_path / "run"), other_vocab)


@pytest.mark.process
def test_decode_uses_recorded_vocabulary_and_refuses_another(tmp_path, vocab, other_vocab):
    """Fast: a recorded (untrained) run; decode stops at 'no checkpoint', after the settings."""
    data = make_pile_dir(tmp_path / "data", num_train_files=1, docs_per_file=20)
    exp = _tiny()
    run_dir = tmp_path / "run"
    _record(run_dir, exp, exp.run_config(data_dir=str(data), vocab_path=vocab), vocab, data)
    decode = ["--mode=decode", "--fdl_config=experiments.Tiny", f"--job_log_dir={run_dir}",
              "--prompt=the river"]
    out = run_main(*decode)
    assert "using the run's recorded settings" in out.stdout + out.stderr, out.stderr[-2000:]
    assert f"--vocab_path={os.path.abspath(vocab)}" in out.stdout + out.stderr
    assert "DATASET='pile'" in out.stdout + out.stderr
    (line,) = error_lines(out)
    assert "not the vocabulary" not in line  # it got past the check (no checkpoint yet)
    out = run_main(*decode, f"--vocab_path={other_vocab}")
    assert out.returncode == 2
    (line,) = error_lines(out)
    assert "is not the vocabulary this run trained with" in line, line


@pytest.mark.process
@pytest.mark.slow
def test_trained_run_decodes_with_its_recorded_settings(tmp_path, vocab, other_vocab):
    data = make_pile_dir(tmp_path / "data", num_train_files=1, docs_per_file=40)
    run_dir = tmp_path / "run"
    out = run_main(*PILE_TINY, "--fdl.MAX_STEPS=2", "--fdl.VOCAB_SIZE=320",
                   f"--data_dir={data}", f"--vocab_path={vocab}", f"--job_log_dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    decode = ["--mode=decode", f"--job_log_dir={run_dir}", "--prompt=the river",
              "--max_decode_steps=4"]  # not even --fdl_config: the record names it
    out = run_main(*decode)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"--vocab_path={os.path.abspath(vocab)}" in out.stdout + out.stderr
    records = [json.loads(line) for line in
               (run_dir / "decode_outputs.jsonl").read_text().splitlines()]
    assert records and records[0]["prompt"] == "the river"
    out = run_main(*decode, f"--vocab_path={other_vocab}")
    assert out.returncode == 2
    (line,) = error_lines(out)
    assert "is not the vocabulary this run trained with" in line, line
    out = run_main("--mode=eval", f"--job_log_dir={run_dir}")  # eval too, flags not repeated
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.process
@pytest.mark.slow
def test_resume_with_another_vocabulary_is_refused_before_anything_is_written(
        tmp_path, vocab, other_vocab):
    from tests.support.files import tree_digest

    data = make_pile_dir(tmp_path / "data", num_train_files=1, docs_per_file=40)
    run_dir = tmp_path / "run"
    train = [*PILE_TINY, "--fdl.MAX_STEPS=2", "--fdl.VOCAB_SIZE=320", f"--data_dir={data}",
             f"--job_log_dir={run_dir}"]
    out = run_main(*train, f"--vocab_path={vocab}")
    assert out.returncode == 0, out.stderr[-3000:]
    before = tree_digest(run_dir)
    out = run_main(*train, "--fdl.MAX_STEPS=4", f"--vocab_path={other_vocab}")
    assert out.returncode == 2, out.stderr[-3000:]
    (line,) = error_lines(out)
    assert f"--vocab_path={other_vocab}" in line and os.path.abspath(vocab) in line, line
    assert "is not the vocabulary this run trained with" in line, line
    assert tree_digest(run_dir) == before
