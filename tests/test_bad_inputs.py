"""Bad input never loses data or prints a traceback: the catalogue of issue 10.

Each case ends with one line naming the problem and the fix (exit status 2 from
main.py), or with the right behaviour. Saves that fail (immutable directory, full
disk) use `chattr +i` and a small tmpfs, which need root; they are skipped elsewhere.
"""

import contextlib
import os
import shutil
import subprocess
import time

import pytest

from paxloom.core.errors import UserError
from paxloom.launch import job
from paxloom.runner.state import checkpoints
from tests.support.processes import assert_one_line, run_main, session_env
from tests.support.tiny import tiny_flags
from tests.test_checkpoints import JOB, run_job

pytestmark = pytest.mark.usefixtures("compilation_cache")

# tests/test_checkpoints.py's JOB, shorter.
TINY_FLAGS = tiny_flags(ICI_MESH_SHAPE=[1, 8, 1], SUMMARY_INTERVAL_STEPS=2, MAX_STEPS=4,
                        CHECKPOINT_EVERY_N_STEPS=2)


@contextlib.contextmanager
def immutable(path):
    """`chattr +i`: even root cannot create files in `path`."""
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@contextlib.contextmanager
def small_disk(path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_job_log_dir_that_is_a_file_or_under_one(tmp_path):
    (tmp_path / "file").touch()
    for job_dir, message in [(tmp_path / "file", "is a file, not a directory"),
                             (tmp_path / "file" / "sub", "a part of the path is a file")]:
        with pytest.raises(UserError, match=message) as info:
            job.check_writable(str(job_dir))
        assert "\n" not in str(info.value)


@pytest.mark.process
def test_unwritable_and_full_job_log_dir(tmp_path):
    (tmp_path / "locked").mkdir()
    with immutable(tmp_path / "locked"):
        with pytest.raises(UserError, match=r"locked/job: cannot create it \(Operation not "
                                            r"permitted\)"):
            job.check_writable(str(tmp_path / "locked" / "job"))
    with small_disk(tmp_path / "disk", "32k") as disk:
        with pytest.raises(UserError, match=r"is not writable \(No space left on device\)"):
            job.check_writable(str(disk / "job"))


@pytest.mark.slow  # 24 s
@pytest.mark.process
def test_failed_saves_stop_in_one_line_and_keep_the_last_checkpoint(tmp_path):
    """Immutable checkpoint directory, then a full disk: exit 2 within seconds, one line,
    and the previous checkpoint still restores."""
    job_dir = tmp_path / "job"
    assert run_main("--fdl_config=experiments.base.BaseExperiment", *TINY_FLAGS,
                    "--fdl.MAX_STEPS=2", f"--job_log_dir={job_dir}").returncode == 0
    ckpt = checkpoints.job_checkpoint_dir(str(job_dir))
    with immutable(ckpt):
        start = time.monotonic()
        out = run_main("--fdl_config=experiments.base.BaseExperiment", *TINY_FLAGS,
                       "--fdl.MAX_STEPS=40", f"--job_log_dir={job_dir}")
        assert time.monotonic() - start < 120
    assert_one_line(out, "could not write checkpoint step 4")
    assert "the last complete checkpoint, step 2, is intact" in out.stderr
    assert "step     40" not in out.stdout  # stopped at the failure, not at the next save
    assert checkpoints.all_steps(ckpt) == [2]
    with small_disk(tmp_path / "disk", "1m") as disk:
        out = run_main("--fdl_config=experiments.base.BaseExperiment", *TINY_FLAGS,
                       f"--job_log_dir={disk / 'job'}")
    assert_one_line(out, "No space left on device")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A job with checkpoints at steps 4 and 8."""
    job_dir = tmp_path_factory.mktemp("trained") / "job"
    run_job(job_dir)
    return job_dir


def _damage(job_dir, how: str):
    state = os.path.join(checkpoints.job_checkpoint_dir(str(job_dir)), "8", "state")
    if how == "missing data":
        shutil.rmtree(os.path.join(state, "d"))
    elif how == "garbled metadata":
        with open(os.path.join(state, "_METADATA"), "w") as f:
            f.write("not json")
    else:
        os.remove(os.path.join(state, "_METADATA"))


@pytest.mark.process
@pytest.mark.parametrize("how", ["missing data", "garbled metadata", "missing metadata"])
def test_broken_latest_checkpoint_is_named_then_skipped_on_request(tmp_path, trained, how):
    job_dir = tmp_path / "job"
    shutil.copytree(trained, job_dir)
    _damage(job_dir, how)
    ckpt = checkpoints.job_checkpoint_dir(str(job_dir))
    with pytest.raises(UserError, match=r"checkpoint step 8 in .* is damaged .*; "
                                        r"--skip_broken_checkpoints sets it aside") as info:
        job.run(_exp(MAX_STEPS=10), job.RunOptions(mode="train", job_log_dir=str(job_dir)))
    assert "\n" not in str(info.value)
    assert checkpoints.all_steps(ckpt) == [4, 8]  # nothing touched without the flag
    job.run(_exp(MAX_STEPS=10), job.RunOptions(mode="train", job_log_dir=str(job_dir), skip_broken_checkpoints=True))
    assert checkpoints.all_steps(ckpt) == [4, 8, 10]  # 8 trained again from 4
    (aside,) = os.listdir(ckpt + "-broken")
    assert aside.startswith("8-")


@pytest.mark.process
def test_restore_step_that_does_not_exist_lists_the_steps(trained):
    with pytest.raises(UserError, match=r"--restore_checkpoint_step=99: .* has no such "
                                        r"checkpoint; it has steps \[4, 8\]"):
        job.run(_exp(), job.RunOptions(mode="train", job_log_dir=str(trained), restore_checkpoint_step=99))


def _exp(**overrides):
    import experiments

    return experiments.BaseExperiment(**{**JOB, **overrides})


@pytest.mark.process
@pytest.mark.parametrize("args,message", [
    (["--fdl.DATASET='pile'"], "DATASET='pile' needs --data_dir"),
    (["--fdl.DATASET='pile'", "--data_dir=/tmp", "--vocab_path=/no/such.model"],
     "/no/such.model does not exist"),
    (["--fdl.DATASET='pile'", "--data_dir=/tmp", "--vocab_path=/tmp"],
     "tokenizer directory /tmp holds no tokenizer.json"),
    (["--fdl.DATASET='pile'", "--data_dir=/tmp", f"--vocab_path={__file__}"],
     "is not a SentencePiece .model file or a Hugging Face tokenizer.json"),
    (["--fdl.DATASET='sampel'"], "DATASET='sampel' is not a registered dataset"),
    (["--fdl.learning_rate=0.1"], "did you mean LEARNING_RATE?"),
    (["--fdl.loop.max_step=3"], "LoopSpec) has no field max_step (did you mean max_steps"),
    (["--fdl.DATASET='synthetic'", "--fdl.LAMBADA_EVAL=False",
      "--fdl.CHECKPOINT_RESTORE_PATH=/no/such/run"],
     "CHECKPOINT_RESTORE_PATH=/no/such/run: no such file or directory"),
    (["--fdl.DATASET='synthetic'", "--fdl.LAMBADA_EVAL=False",
      f"--fdl.CHECKPOINT_RESTORE_PATH={os.path.dirname(__file__)}"],
     "is neither a Paxloom run or checkpoint, a Hugging Face model directory"),
])
def test_config_and_data_mistakes_are_one_line(tmp_path, args, message):
    flags = tiny_flags(DATASET=None)
    out = run_main("--fdl_config=experiments.Tiny", *flags, *args,
                   f"--job_log_dir={tmp_path / 'job'}")
    assert_one_line(out, message)
    assert "Fiddle context" not in out.stderr


@pytest.mark.process
def test_missing_config_file_is_one_line(tmp_path):
    out = run_main("--fdl_config_file=/no/such/fiddle_graph.json",
                   f"--job_log_dir={tmp_path / 'job'}")
    assert_one_line(out, "--fdl_config_file=/no/such/fiddle_graph.json: No such file")


@pytest.mark.process
def test_zero_host_devices_is_one_line(tmp_path):
    out = run_main("--fdl_config=experiments.Tiny", f"--job_log_dir={tmp_path / 'job'}",
                   env=session_env(XLA_FLAGS="--xla_force_host_platform_device_count=0"))
    assert_one_line(out, "XLA_FLAGS has --xla_force_host_platform_device_count=0: the number "
                         "of CPU devices must be at least 1")
    assert not (tmp_path / "job").exists()
