"""main.py end to end in subprocesses: the command line a user types."""

import configparser
import json
import os
import re
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT
from tests.support.processes import (
    PYTHON,
    assert_one_line,
    run_command,
    run_main,
    run_python,
    session_env,
)
from tests.support.tiny import model_flags

# The tiny model's shapes with 16-wide heads, in the experiment's own dtype, data and schedule.
TINY_FLAGS = model_flags(NUM_HEADS=4, DIMS_PER_HEAD=16)


@pytest.mark.process
@pytest.mark.parametrize("args,message", [
    (["--fdl_config=experiments.Synthetic5B", "--fdl.ICI_MESH_SHAPE=[3,1,1]",
      "--job_log_dir=/tmp/unused"], "covers 3 devices, but this job has 8"),
    (["--fdl_config=experiments.Synthetic5B", "--fdl.NUM_LAYRES=2"],
     "no hyperparameter NUM_LAYRES (did you mean NUM_LAYERS"),
    (["--fdl_config=experiments.GPT5X"], "no experiment named GPT5X (did you mean GPT5B"),
    (["--fdl_config=experiments.Tiny", "--fdl.NUM_LAYERS=2.5"], "NUM_LAYERS is int"),
    (["--fdl_config=experiments.Tiny", "--no_such_flag=1"], "no_such_flag"),
    (["--fdl_config=experiments.Tiny"], "--job_log_dir is required"),
    (["--fdl_config=experiments.Synthetic126M", *TINY_FLAGS, "--fdl.VOCAB_SIZE=1026",
      "--fdl.ICI_MESH_SHAPE=[1,2,4]", "--job_log_dir=/tmp/paxloom-test-unused"],
     "logits_ffn/linear/w (64, 1026): dimension 1 (1026) does not split over mesh axes mdl"),
    (["--fdl_config=experiments.Synthetic126M", *TINY_FLAGS, "--fdl.NUM_HEADS=6",
      "--fdl.ICI_MESH_SHAPE=[1,2,4]", "--job_log_dir=/tmp/paxloom-test-unused"],
     "combined_qkv/b (3, 6, 16): dimension 1 (6) does not split over mesh axes mdl (4 devices)"),
])
def test_user_errors_exit_2_with_one_line(args, message):
    out = run_main(*args)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.process
def test_list_experiments_of_a_users_module(tmp_path):
    (tmp_path / "my_exps.py").write_text(
        "from experiments.gpt import GPT126M\n\n\n"
        "class GPT350M(GPT126M):\n    \"\"\"GPT-3 Medium.\"\"\"\n\n    NUM_LAYERS = 24\n")
    env = session_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO_ROOT}")
    listed = run_main("--list_experiments", "--fdl_config=my_exps", env=env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == ["my_exps.GPT350M", "GPT-3", "Medium."]
    assert_one_line(run_main("--list_experiments", "--fdl_config=no_such_exps", env=env),
                    "--fdl_config=no_such_exps: cannot import no_such_exps")


@pytest.mark.process
def test_list_experiments_and_print_config():
    listed = run_main("--list_experiments")
    assert listed.returncode == 0
    for name in ("GPT126M", "GPT5B", "GPT175B", "Synthetic5B", "Lambada126M", "Tiny"):
        assert f"experiments.{name}" in listed.stdout
    shown = run_main("--fdl_config=experiments.GPT5B", "--fdl.PERCORE_BATCH_SIZE=4",
                     "--print_config")
    assert shown.returncode == 0, shown.stderr
    assert "PERCORE_BATCH_SIZE = 4" in shown.stdout
    assert "ICI_MESH_SHAPE = [1, 8, 1]" in shown.stdout
    assert "model.lm_tpl.stacked_transformer_tpl" in shown.stdout  # the Fiddle graph
    # Printed, not run: a setting only a GPU runs is shown on this CPU.
    shown = run_main("--fdl_config=experiments.GPT126M", '--fdl.ATTENTION_IMPL="cudnn"',
                     "--print_config")
    assert shown.returncode == 0, shown.stderr
    assert "ATTENTION_IMPL = 'cudnn'" in shown.stdout


def entry_point_command(*args: str) -> list[str]:
    """The installed `paxloom` command, as pip's console script runs it: setup.cfg's
    [options.entry_points] function called from a __main__ that is not main.py."""
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "setup.cfg")
    scripts = {name.strip(): target.strip() for name, _, target in
               (line.partition("=") for line in
                config["options.entry_points"]["console_scripts"].splitlines() if line)}
    module, function = scripts["paxloom"].split(":")
    return [PYTHON, "-c", f"import sys; from {module} import {function}; "
            f"sys.argv[0] = 'paxloom'; sys.exit({function}())", *args]


@pytest.mark.process
@pytest.mark.parametrize("how", ["main.py", "paxloom"])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_paxlooms_flags_by_group(how, flag):
    out = (run_main(flag) if how == "main.py" else
           run_command(entry_point_command(flag)))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) < 80, out.stdout
    assert all(len(line) <= 100 for line in lines), out.stdout
    for text in ("--fdl_config", "--fdl.NAME=VALUE", "--mode", "--job_log_dir",
                 "--print_config", "--plan_device", "--device_memory_gb", "--helpfull",
                 "What to run:", "Where to write:", "Data:", "Planning (--mode=plan):",
                 "Decoding (--mode=decode):", "Several processes:"):
        assert text in out.stdout, text
    # One line a flag: its name, then what it does.
    (mode,) = [line for line in lines if line.lstrip().startswith("--mode ")]
    assert "train, eval" in mode and "(default: train)" in mode
    assert "Other:" not in out.stdout  # every flag has a group


@pytest.mark.process
@pytest.mark.parametrize("how", ["main.py", "paxloom"])
def test_helpfull_keeps_absls_full_listing(how):
    out = (run_main("--helpfull") if how == "main.py" else
           run_command(entry_point_command("--helpfull")))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "python main.py --fdl_config=experiments.GPT126M" in out.stdout
    for text in ("paxloom.launch.flags:", "absl.logging:", "--[no]alsologtostderr", "--job_log_dir: "
                 "Directory for the resolved config", "--[no]helpfull"):
        assert text in out.stdout, text


@pytest.mark.process
def test_a_flag_without_a_group_is_found_and_still_listed():
    """The check tests/test_docs.py makes of every flag is not vacuous: a flag defined in
    paxloom/launch/flags.py and left out of GROUPS is reported, and --help lists it under Other."""
    out = run_python("-c", "\n".join([
        "from absl import flags",
        "from paxloom.launch import flags as launch_flags",
        "assert launch_flags.ungrouped() == [], launch_flags.ungrouped()",
        "flags.DEFINE_integer('new_flag', 3, 'Something new. More.', module_name='paxloom.launch.flags')",
        "print(launch_flags.ungrouped())",
        "print(launch_flags.help_text())",
    ]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("['new_flag']\n"), out.stdout
    assert "Other:\n  --new_flag" in out.stdout and "Something new (default: 3)" in out.stdout


@pytest.mark.process
def test_absl_logging_flags_and_pax_config_names_of_the_pax_scripts_are_accepted():
    out = run_main("--alsologtostderr", "--fdl_config=paxml.contrib.gpu.scripts_gpu.configs.GPT5B",
                   "--print_config")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("# experiments.gpt.GPT5B\n")
    assert ("note: --fdl_config=paxml.contrib.gpu.scripts_gpu.configs.GPT5B runs Paxloom's "
            "experiments.GPT5B") in out.stderr


def orbax_info_lines(stderr: str) -> list[str]:
    """absl's INFO lines (`I1127 22:19:27.361772 1405 checkpoint_manager.py:557] ...`) that
    name a module of orbax and none of Paxloom's (absl names the file only: orbax has a
    prepare.py too, and Paxloom's tokenizing line comes from tasks/prepare.py)."""
    import orbax.checkpoint

    ours = {path.name for package in ("paxloom", "experiments", "layers", "tasks")
            for path in (REPO_ROOT / package).rglob("*.py")}
    modules = {path.name for path in Path(orbax.checkpoint.__file__).parent.rglob("*.py")
               } - ours
    return [line for line in stderr.splitlines()
            if (found := re.match(r"I\d{4} [\d:.]+ +\d+ (\w+\.py):\d+\] ", line))
            and found[1] in modules]


@pytest.mark.process
def test_alsologtostderr_leaves_orbax_info_lines_out_unless_verbosity_asks(tmp_path):
    """Pax's scripts pass --alsologtostderr, which shows libraries' INFO lines; orbax's, a
    dozen for each checkpoint saved or read, stay out of them. An explicit --verbosity=0
    shows them too."""
    job = tmp_path / "job"
    run = ("--fdl_config=experiments.Tiny", "--fdl.SUMMARY_INTERVAL_STEPS=1",
           "--fdl.EVAL_INTERVAL_STEPS=0", f"--job_log_dir={job}", "--alsologtostderr")
    quiet = run_main(*run, "--fdl.MAX_STEPS=2")
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert f"checkpoint {job}/checkpoints/2 complete" in quiet.stdout
    assert not orbax_info_lines(quiet.stderr), quiet.stderr[-3000:]
    # Asked for: the same run continued (a restore and a save), every INFO line shown.
    asked = run_main(*run, "--fdl.MAX_STEPS=3", "--verbosity=0")
    assert asked.returncode == 0, asked.stderr[-3000:]
    assert len(orbax_info_lines(asked.stderr)) > 5, asked.stderr[-3000:]


@pytest.mark.process
def test_synthetic5b_tiny_run_writes_events_and_reloadable_config(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    job = tmp_path / "job"
    out = run_main("--fdl_config=experiments.Synthetic5B", *TINY_FLAGS,
                   "--fdl.ICI_MESH_SHAPE=[1,8,1]", "--fdl.DCN_MESH_SHAPE=[1,1,1]",
                   "--fdl.PERCORE_BATCH_SIZE=1", "--fdl.MAX_STEPS=5", f"--job_log_dir={job}",
                   without_tensorflow=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step      5 | loss" in out.stdout
    # Scalars TensorBoard's own reader sees as scalars, and the same in metrics.jsonl.
    events = EventAccumulator(str(job / "tb" / "train"))
    events.Reload()
    (loss,) = events.Scalars("loss")
    assert loss.step == 5 and "tokens_per_sec" in events.Tags()["scalars"]
    lines = [json.loads(line) for line in (job / "tb" / "train" / "metrics.jsonl").open()]
    (summary,) = [line for line in lines if "loss" in line]
    assert summary["step"] == 5 and abs(summary["loss"] - loss.value) < 1e-6

    record = json.loads((job / "hyperparameters.json").read_text())
    assert record["experiment"] == "experiments.gpt.Synthetic5B"
    assert record["hyperparameters"]["ICI_MESH_SHAPE"] == [1, 8, 1]
    import experiments

    reloaded = experiments.resolve("experiments.Synthetic5B")(**record["hyperparameters"])
    assert reloaded.MAX_STEPS == 5 and reloaded.NUM_LAYERS == 2

    from fiddle.experimental import serialization

    graph = serialization.load_json((job / "fiddle_graph.json").read_text())
    assert graph.loop.max_steps == 5
    assert graph.model.lm_tpl.model_dims == 64
    assert "model.lm_tpl.model_dims" in (job / "fiddle_graph.txt").read_text()


@pytest.mark.process
@pytest.mark.slow  # 18 s: a profiled run and its rerun
def test_pax_flags_profile_and_a_rerun_from_the_recorded_graph(tmp_path):
    """--exp, a dotted graph override, --noeval_on_test, --enable_checkpoint_saving=false and
    a profile of steps 2-3; then --fdl_config_file reruns the recorded graph to the same
    losses."""
    first, again = tmp_path / "first", tmp_path / "again"
    flags = model_flags(NUM_HEADS=4, DIMS_PER_HEAD=16, DATASET="synthetic", EVAL_BATCHES=1,
                        EVAL_INTERVAL_STEPS=2, MAX_STEPS=4)
    out = run_main("--exp=experiments.base.BaseExperiment", *flags,
                   "--fdl.loop.summary_interval_steps=1", "--noeval_on_test",
                   "--enable_checkpoint_saving=false", "--profile_start_step=1",
                   "--profile_num_steps=2", f"--log_dir={tmp_path / 'absl'}",
                   f"--job_log_dir={first}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert list((tmp_path / "absl").glob("paxloom*INFO*"))  # absl's log file
    assert "compiling the train step" in out.stdout and "eval " not in out.stdout
    assert not (first / "checkpoints").exists()
    (trace,) = (first / "tb" / "plugins" / "profile").glob("*/*.xplane.pb")
    assert trace.stat().st_size > 0 and list(trace.parent.glob("*.json.gz"))  # Perfetto
    losses = [json.loads(line) for line in (first / "tb" / "train" / "metrics.jsonl").open()]
    assert [r["step"] for r in losses] == [1, 2, 3, 4]  # the dotted override took effect

    out = run_main(f"--fdl_config_file={first / 'fiddle_graph.json'}", f"--job_log_dir={again}")
    assert out.returncode == 0, out.stderr[-3000:]
    rerun = [json.loads(line) for line in (again / "tb" / "train" / "metrics.jsonl").open()]
    assert [r["loss"] for r in rerun if "loss" in r] == [r["loss"] for r in losses]
    record = json.loads((again / "hyperparameters.json").read_text())
    assert record["experiment"] == "experiments.base.BaseExperiment"
    assert (again / "checkpoints").is_dir()  # the flags of the first run are not in the graph


@pytest.mark.process
@pytest.mark.slow  # 15 s: two main.py runs
def test_hparams_tab_and_weights_and_biases_offline(tmp_path):
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    job = tmp_path / "job"
    args = ["--fdl_config=experiments.Synthetic126M", *TINY_FLAGS, "--fdl.MAX_STEPS=2",
            "--fdl.ICI_MESH_SHAPE=[8,1,1]", "--fdl.PERCORE_BATCH_SIZE=1",
            "--wandb_project=paxloom-test", f"--job_log_dir={job}"]
    env = session_env(WANDB_MODE="offline", WANDB_SILENT="true")
    out = run_main(*args, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    events = EventAccumulator(str(job / "tb" / "train"))
    events.Reload()
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert start.hparams["NUM_LAYERS"].number_value == 2
    assert start.hparams["ICI_MESH_SHAPE"].string_value == "[8, 1, 1]"
    run_id = (job / "wandb_run_id").read_text().strip()
    (run_dir,) = (job / "wandb").glob(f"offline-run-*-{run_id}")
    assert list(run_dir.glob("*.wandb"))
    # A resumed job logs into the same W&B run.
    out = run_main(*args[:-2], "--fdl.MAX_STEPS=3", *args[-2:], env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (job / "wandb_run_id").read_text().strip() == run_id
