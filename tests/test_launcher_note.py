"""The launcher says what it sets: scripts_gpu/'s scripts pass Pax's flags (the mesh, the
batch size, the precision) whatever the experiment, and the start of the run names each one
that replaces a value the experiment class declares, with the variable that keeps it
(paxloom/launch/launcher.py). A user's own --fdl. flags are not the launcher's."""

import os
import subprocess
import textwrap

import pytest

import experiments
from paxloom.launch import launcher
from tests.support.paths import REPO_ROOT

SUB = REPO_ROOT / "scripts_gpu" / "example_slurm_pile.sub"

MODULE = '''
"""A user's experiment with its own FSDP mesh, batch size and precision."""
import experiments


@experiments.register
class MyFSDP(experiments.BaseExperiment):
    ICI_MESH_SHAPE = [1, 8, 1]
    PERCORE_BATCH_SIZE = 2
    FPROP_DTYPE = "float32"
'''

# Stands in for SLURM's srun (not for Paxloom): one task on this machine, with the variables
# srun sets, running the command it is given.
SRUN = '''#!/usr/bin/env bash
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in -o|-e) shift 2 ;; *) shift ;; esac
done
export SLURM_JOB_NUM_NODES=1 SLURM_NNODES=1 SLURM_NTASKS=1 SLURM_NODEID=0 SLURM_PROCID=0
exec "$@"
'''


class Declared(experiments.BaseExperiment):
    ICI_MESH_SHAPE = [1, 8, 1]
    PERCORE_BATCH_SIZE = 2.0


def _env(ici="[8,1,1]", batch="4") -> dict:
    return {launcher.ENV: f"--fdl.ICI_MESH_SHAPE={ici}\tset ICI_MESH_SHAPE= to keep it\n"
                          f"--fdl.PERCORE_BATCH_SIZE={batch}\tset PERCORE_BATCH_SIZE= to keep it\n"}


def test_the_note_names_each_launcher_value_that_replaces_the_classs():
    argv = ["main.py", "--fdl.ICI_MESH_SHAPE=[8,1,1]", "--fdl.PERCORE_BATCH_SIZE=4"]
    exp = Declared(ICI_MESH_SHAPE=[8, 1, 1], PERCORE_BATCH_SIZE=4)
    assert launcher.note(exp, argv, _env()) == (
        "note: ICI_MESH_SHAPE [8, 1, 1] from the launcher replaces Declared's [1, 8, 1] (set "
        "ICI_MESH_SHAPE= to keep it); PERCORE_BATCH_SIZE 4 from the launcher replaces "
        "Declared's 2 (set PERCORE_BATCH_SIZE= to keep it)")
    # Only where the value differs: the class's own batch size is no news.
    same = ["main.py", "--fdl.ICI_MESH_SHAPE=[8,1,1]", "--fdl.PERCORE_BATCH_SIZE=2"]
    assert launcher.note(Declared(ICI_MESH_SHAPE=[8, 1, 1]), same, _env(batch="2")) == (
        "note: ICI_MESH_SHAPE [8, 1, 1] from the launcher replaces Declared's [1, 8, 1] (set "
        "ICI_MESH_SHAPE= to keep it)")


def test_a_users_own_flags_are_not_the_launchers():
    exp = Declared(ICI_MESH_SHAPE=[8, 1, 1], PERCORE_BATCH_SIZE=8)
    # main.py run by hand: no launcher, no note.
    argv = ["main.py", "--fdl.ICI_MESH_SHAPE=[8,1,1]", "--fdl.PERCORE_BATCH_SIZE=8"]
    assert launcher.note(exp, argv, {}) is None
    # The user's extra flags after the launcher's: the user's value, and so no note for it.
    argv = ["main.py", "--fdl.ICI_MESH_SHAPE=[8,1,1]", "--fdl.PERCORE_BATCH_SIZE=4",
            "--fdl.PERCORE_BATCH_SIZE=8"]
    assert [f.name for f in launcher.launcher_flags(argv, _env())] == ["ICI_MESH_SHAPE"]
    # A listing left in the environment that the command line does not hold: not a launcher's.
    argv = ["main.py", "--fdl.ICI_MESH_SHAPE=[2,4,1]"]
    assert launcher.launcher_flags(argv, _env()) == []


@pytest.fixture
def submit(tmp_path):
    """(environment, run): example_slurm_pile.sub submitted with a stand-in srun on PATH and
    the user's experiment module on PYTHONPATH."""
    (tmp_path / "my_exps.py").write_text(textwrap.dedent(MODULE))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(SRUN)
    (bin_dir / "srun").chmod(0o755)
    data = tmp_path / "data"
    data.mkdir()
    vocab = tmp_path / "spm.model"
    vocab.write_bytes(b"")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") and k not in ("PYTHON", "EXPERIMENT", "ICI_MESH_SHAPE",
                                                      "DCN_MESH_SHAPE", "PREC", "DATA_DIR")}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", PYTHONPATH=str(tmp_path), JAX_PLATFORMS="cpu",
               PAXLOOM_DIR=str(REPO_ROOT), BASE_WORKSPACE_DIR=str(tmp_path / "ws"),
               BASE_VOCAB_PATH=str(vocab), EXPERIMENT="my_exps.MyFSDP", GPUS_PER_NODE="8")

    def run(*args, **extra):
        return subprocess.run(["bash", str(SUB), *args], env={**env, **extra}, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)

    return data, run


@pytest.mark.process
def test_the_slurm_sub_names_what_it_replaces(submit):
    """Pax's variables and defaults, as a Pax user submits them (BASE_TFDS_DATA_DIR; PREC and
    PERCORE_BATCH_SIZE left at the .sub's defaults): the start names the mesh, batch size
    and precision that replace MyFSDP's, each with its variable, and not DCN_MESH_SHAPE,
    which is MyFSDP's own [1, 1, 1] on one node. Emptied, each keeps MyFSDP's own."""
    data, run = submit
    out = run("--print_config", BASE_TFDS_DATA_DIR=str(data))
    assert out.returncode == 0, out.stderr[-3000:]
    (note,) = [line for line in out.stderr.splitlines() if "from the launcher" in line]
    assert note == (
        "note: FPROP_DTYPE 'bfloat16' from the launcher replaces MyFSDP's 'float32' (set PREC= "
        "to keep it); PERCORE_BATCH_SIZE 4 from the launcher replaces MyFSDP's 2 (set "
        "PERCORE_BATCH_SIZE= to keep it); ICI_MESH_SHAPE [8, 1, 1] from the launcher replaces "
        "MyFSDP's [1, 8, 1] (set ICI_MESH_SHAPE= to keep it)")
    assert "ICI_MESH_SHAPE = [8, 1, 1]" in out.stdout  # what runs

    out = run("--print_config", DATA_DIR=str(data), ICI_MESH_SHAPE="", PREC="",
              PERCORE_BATCH_SIZE="")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "from the launcher" not in out.stderr
    for line in ("ICI_MESH_SHAPE = [1, 8, 1]", "PERCORE_BATCH_SIZE = 2\n",
                 "FPROP_DTYPE = 'float32'"):
        assert line in out.stdout, out.stdout[:3000]

    # A user's own flag after the .sub file is the user's: not named.
    out = run("--print_config", "--fdl.PERCORE_BATCH_SIZE=4", DATA_DIR=str(data), PREC="",
              ICI_MESH_SHAPE="")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "from the launcher" not in out.stderr and "PERCORE_BATCH_SIZE = 4.0" in out.stdout


@pytest.mark.process
def test_data_dir_and_paxs_name_for_it(submit, tmp_path):
    data, run = submit
    out = run(DATA_DIR=str(data), BASE_TFDS_DATA_DIR=str(tmp_path))
    assert out.returncode == 2 and "DATA_DIR=" in out.stderr and "differ" in out.stderr
    out = run()
    assert out.returncode == 2
    assert "DATA_DIR (or Pax's BASE_TFDS_DATA_DIR) is not set" in out.stderr
