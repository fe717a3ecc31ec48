"""Side files never block a run, and nothing ends in a traceback (issue 24, part 4).

A damaged goodput ledger or run record in a job directory is set aside (renamed, never
deleted) with a one-line warning and the run goes on; flags and dotted graph overrides out of
range, unusable export paths and corrupt data are one line (exit status 2); Ctrl-C in
training saves like SIGTERM.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from paxloom.core.errors import UserError
from paxloom.launch import job, record
from paxloom.runner.training import goodput
from tests.support import data as fx
from tests.support.processes import assert_one_line, run_main, start_main
from tests.support.tiny import TINY, tiny_flags

TINY_FLAGS = tiny_flags(LAMBADA_EVAL=False)


def _record(run="r1", step=5):
    return {"run": run, "start_step": 0, "step": step, "wall": 10.0,
            "seconds": dict.fromkeys(goodput.PHASES, 1.0), "lost_steps": 0,
            "lost_seconds": 0.0, "ended": "finished"}


def _set_aside(directory, name):
    return sorted(p for p in os.listdir(directory) if p.startswith(name + ".damaged-"))


# 1. The goodput ledger.

@pytest.mark.parametrize("damage", [
    '{"run": "r2", "start_step": 0, "st',  # cut short
    '{"run": "r2", "steps": 3}',  # wrong keys
    "\x00\x01garbage",
])
def test_damaged_goodput_files_are_set_aside_and_the_run_goes_on(tmp_path, capsys, damage):
    ledger = tmp_path / "goodput.jsonl"
    ledger.write_text(json.dumps(_record()) + "\n" + damage + "\n")
    (tmp_path / "goodput_current.json").write_text(damage)
    account = goodput.Ledger(str(tmp_path), process_start=time.time(), start_step=0)
    warnings = [line for line in capsys.readouterr().out.splitlines() if "damaged" in line]
    assert len(warnings) == 2 and all(line.startswith("warning: ") for line in warnings)
    (aside,) = _set_aside(tmp_path, "goodput.jsonl")  # renamed, never deleted
    assert (tmp_path / aside).read_text().endswith(damage + "\n")
    (aside,) = _set_aside(tmp_path, "goodput_current.json")
    assert (tmp_path / aside).read_text() == damage
    account.step(3)
    account.finish()  # the account starts again, and the run ends normally
    (only,) = goodput.read(str(tmp_path))
    assert only["step"] == 3 and only["ended"] == "finished"


def test_reading_a_damaged_ledger_is_one_line(tmp_path, capsys):
    (tmp_path / "goodput.jsonl").write_text(json.dumps(_record()) + "\n[1, 2]\n")
    with pytest.raises(UserError, match=r"goodput\.jsonl: line 2 is not a goodput record"):
        goodput.read(str(tmp_path))
    assert goodput.main(["goodput", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")


# 2. The run's record, and a checkpoint's metadata.

@pytest.fixture(scope="module")
def tiny():
    import experiments

    exp = experiments.BaseExperiment(**TINY)
    return exp, exp.run_config()


@pytest.mark.parametrize("damage", ['{"experiment": "experiments.Ti', '{"experiment": 3}', ""])
def test_damaged_run_record_is_set_aside_and_rewritten_on_resume(tmp_path, capsys, tiny,
                                                                   damage):
    exp, config = tiny
    path = tmp_path / "hyperparameters.json"
    path.write_text(damage)
    record.record_config(str(tmp_path), exp, config, resumed_step=4)
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "damaged" in line]
    assert line.startswith("warning: ") and "hyperparameters.json" in line
    (aside,) = _set_aside(tmp_path, "hyperparameters.json")
    assert (tmp_path / aside).read_text() == damage
    assert json.loads(path.read_text())["hyperparameters"]["NUM_LAYERS"] == TINY["NUM_LAYERS"]


def test_damaged_record_beside_a_recorded_graph_is_one_line(tmp_path, tiny):
    exp, config = tiny
    record.write_config(str(tmp_path), exp, config)
    (tmp_path / "hyperparameters.json").write_text('{"hyperparameters": {}}')
    with pytest.raises(UserError, match=r"hyperparameters\.json is damaged .*; pass "
                                        r"--fdl_config=experiments\.NAME") as info:
        record.recorded_experiment(str(tmp_path / "fiddle_graph.json"))
    assert "\n" not in str(info.value)


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.usefixtures("compilation_cache")
def test_damaged_checkpoint_metadata_is_named_then_skipped(tmp_path):
    import glob

    from paxloom.runner.state import checkpoints
    from tests.test_checkpoints import run_job

    run_job(tmp_path)  # checkpoints at steps 4 and 8
    ckpt = checkpoints.job_checkpoint_dir(str(tmp_path))
    (metadata,) = glob.glob(os.path.join(ckpt, "8", "metadata", "*metadata*"))
    with open(metadata, "w") as f:
        f.write('{"experiment": "runner')
    with pytest.raises(UserError, match=r"checkpoint step 8 in .* is damaged .*"
                                        r"--skip_broken_checkpoints") as info:
        run_job(tmp_path, MAX_STEPS=10)
    assert "\n" not in str(info.value)
    import experiments
    from tests.test_checkpoints import JOB

    job.run(experiments.BaseExperiment(**{**JOB, "MAX_STEPS": 10}),
            job.RunOptions(job_log_dir=str(tmp_path), skip_broken_checkpoints=True))
    assert checkpoints.all_steps(ckpt) == [4, 8, 10]  # 8 trained again from 4


# 3. Flags with a range.

@pytest.mark.process
@pytest.mark.parametrize("flag,message", [
    ("--jax_profiler_port=70000", "--jax_profiler_port=70000: must be a TCP port"),
    ("--plan_mfu=1.5", "--plan_mfu=1.5: must be 0 (the calibrated estimate) or a fraction in (0, 1]"),
    ("--top_p=1.5", "--top_p=1.5: must be in (0, 1]"),
    ("--restore_checkpoint_step=-1", "--restore_checkpoint_step=-1: must be a step >= 0"),
])
def test_flags_out_of_range_are_one_line(tmp_path, flag, message):
    out = run_main("--fdl_config=experiments.Tiny", flag, f"--job_log_dir={tmp_path}")
    assert_one_line(out, message)


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("flag,message", [
    ("--profile_start_step=10", "--profile_start_step=10: the run ends at step 10"),
    ("--profile_num_steps=0", "--profile_num_steps=0: must be at least 1 step"),
    ("--plan_device_memory_gb=-1", "must be GB >= 0"),
    ("--peak_tflops=nan", "--peak_tflops=nan: must be >= 0"),
    ("--num_hosts=0", "--num_hosts=0: must be at least 1"),
    ("--distributed_timeout_s=0", "must be at least 1 second"),
    ("--max_decode_steps=0", "--max_decode_steps=0: must be at least 1"),
    ("--temperature=-1", "--temperature=-1.0: must be >= 0"),
    ("--top_k=-1", "--top_k=-1: must be >= 0"),
    ("--decode_seed=-1", "--decode_seed=-1: must be in 0 .. 2**32 - 1"),
    ("--decode_batch_size=0", "--decode_batch_size=0: must be at least 1"),
])
def test_more_flags_out_of_range_are_one_line(tmp_path, flag, message):
    out = run_main("--fdl_config=experiments.Tiny", *TINY_FLAGS, "--fdl.MAX_STEPS=10", flag,
                   f"--job_log_dir={tmp_path / 'job'}")
    assert_one_line(out, message)
    assert not (tmp_path / "job").exists()


# 4. Dotted graph overrides get the hyperparameters' ranges.

@pytest.mark.parametrize("path,bad,good,message", [
    ("loop.max_steps", "-5", "5", "--fdl.loop.max_steps=-5: must be positive"),
    ("model.lm_tpl.stacked_transformer_tpl.num_layers", "0", "1",
     "num_layers=0: must be positive"),
    ("loop.checkpoint_every_n_steps", "-1", "0", "checkpoint_every_n_steps=-1: must be >= 0"),
    ("mesh.ici_mesh_shape", "[0,8,1]", "[1,8,1]", "a mesh shape needs positive sizes"),
])
def test_graph_overrides_out_of_range_are_one_line(tiny, path, bad, good, message):
    from experiments import overrides

    exp, _ = tiny
    config = exp.run_config()
    with pytest.raises(UserError, match=re.escape(message)):
        overrides.apply_to_graph(config, {path: bad}, exp.hyperparameter_types())
    assert overrides.apply_to_graph(config, {path: good}, exp.hyperparameter_types())


@pytest.mark.process
@pytest.mark.slow
def test_graph_override_out_of_range_from_main_is_one_line(tmp_path):
    out = run_main("--fdl_config=experiments.Tiny", "--fdl.loop.max_steps=-5",
                   f"--job_log_dir={tmp_path}")
    assert_one_line(out, "--fdl.loop.max_steps=-5: must be positive")


# 5. Export paths.

@pytest.mark.process
@pytest.mark.parametrize("where", ["under a file", "unwritable"])
def test_export_output_that_cannot_be_created_is_one_line(tmp_path, tiny, where):
    from paxloom.tools import export_hf

    exp, config = tiny
    run = tmp_path / "run"
    record.write_config(str(run), exp, config)  # no checkpoint: the check comes before reading
    if where == "under a file":
        (tmp_path / "file").write_text("x")
        output, message = tmp_path / "file" / "hf", "is a file, not a directory"
    else:
        if not _can_make_read_only(tmp_path / "ro"):
            pytest.skip("cannot make a directory unwritable here (root without chattr)")
        output, message = tmp_path / "ro" / "hf", "cannot create it in"
    try:
        with pytest.raises(UserError, match=message) as info:
            export_hf.export(str(run), str(output))
    finally:
        subprocess.run(["chattr", "-i", str(tmp_path / "ro")], capture_output=True)
    assert "\n" not in str(info.value) and not output.exists()


def _can_make_read_only(path) -> bool:
    path.mkdir()
    os.chmod(path, 0o555)
    if not os.access(path, os.W_OK):
        return True
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0


# 6. Ctrl-C.

def test_ctrl_c_in_training_saves_like_sigterm_and_a_second_stops_at_once():
    from paxloom.runner.training import preemption

    before = signal.getsignal(signal.SIGINT)
    with preemption.PreemptionWatcher("none") as watcher:
        os.kill(os.getpid(), signal.SIGINT)
        assert watcher.received == "SIGINT"
        request = watcher.after_step(type("Info", (), {"step": 3})())
        assert request.stop and "SIGINT received; saving a checkpoint" in request.reason
        assert signal.getsignal(signal.SIGINT) == signal.SIG_DFL  # the second: at once
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.usefixtures("compilation_cache")
def test_ctrl_c_during_a_run_saves_and_exits_without_a_traceback(tmp_path):
    process = start_main("--fdl_config=experiments.Tiny", *TINY_FLAGS,
                         "--fdl.MAX_STEPS=100000", "--fdl.CHECKPOINT_EVERY_N_STEPS=0",
                         f"--job_log_dir={tmp_path}", unbuffered=False,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in process.stdout:
        if line.startswith("step ") and "|" in line:
            break
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode in (0, 130), err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "SIGINT received" in out and os.listdir(tmp_path / "checkpoints")


# 7. Corrupt data: the error line is the last line printed.

@pytest.mark.process
@pytest.mark.parametrize("damage", ["truncated", pytest.param("corrupt", marks=pytest.mark.slow)])
def test_corrupt_training_data_ends_with_the_error_line(tmp_path, tmp_path_factory, damage):
    data = fx.make_pile_dir(tmp_path / "data", num_train_files=2, docs_per_file=200)
    bad = data / "pile" / "train" / "01.jsonl.zst"
    raw = bytearray(bad.read_bytes())
    if damage == "truncated":
        raw = raw[: len(raw) // 2]
    else:
        raw[len(raw) // 2: len(raw) // 2 + 64] = bytes(64)
    bad.write_bytes(bytes(raw))
    flags = tiny_flags(LAMBADA_EVAL=False, DATASET=None)
    out = run_main("--fdl_config=experiments.Tiny", *flags, "--fdl.DATASET='pile'",
                   "--fdl.LAMBADA_EVAL=False", f"--data_dir={data}",
                   f"--vocab_path={fx.tiny_vocab_path(tmp_path_factory)}",
                   f"--cache_dir={tmp_path / 'cache'}", f"--job_log_dir={tmp_path / 'job'}")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-3000:]
    assert lines[-1].startswith("error: ") and f"01.jsonl.zst is {damage}" in lines[-1], (
        out.stderr[-3000:])
    assert not any(line.startswith("error: ") for line in lines[:-1])
    shutil.rmtree(tmp_path / "data")
