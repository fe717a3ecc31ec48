"""The GPU launch scripts: lint, usage, the main.py command they build, the XLA flags, and
one real CPU run through run_pile_singlenode.sh."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.support.paths import MAIN_PY, REPO_ROOT

SCRIPTS = REPO_ROOT / "scripts_gpu"
LAUNCHERS = ["run_pile_singlenode.sh", "run_pile_multinode.sh", "run_lambada_singlenode.sh"]
ALL_SCRIPTS = sorted(SCRIPTS.glob("*.sh")) + sorted(SCRIPTS.glob("*.sub"))
# paxml's own scripts, kept as paxml wrote them but for their module paths
# (tests/test_llama_boolq_script.py runs it): not linted as Paxloom's.
PAXML_VERBATIM = {"run_llama_boolq.sh"}


# Settings the scripts read; tests start without the caller's (and conftest's 8-device XLA_FLAGS).
SCRIPT_VARS = {
    "XLA_FLAGS",
    "BASE_XLA_FLAGS",
    "PYTHON",
    "EXPERIMENT",
    "ICI_MESH_SHAPE",
    "DCN_MESH_SHAPE",
    "NUM_NODES",
    "JAX_LOCAL_DEVICE_IDS",
    "CONTAINER",
    "PAXLOOM_DIR",
}


def clean_env(**extra):
    env = {
        k: v for k, v in os.environ.items() if k not in SCRIPT_VARS and not k.startswith("SLURM_")
    }
    env.update(JAX_PLATFORMS="cpu", **extra)
    return env


def run(cmd, env, cwd=REPO_ROOT, timeout=60):
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def singlenode(*args) -> list[str]:
    """run_pile_singlenode.sh TFDS_DATA_DIR VOCAB_PATH DTYPE NUM_GPUS PERCORE_BATCH_SIZE LOG_DIR
    [FLAGS...] as a command."""
    return ["bash", str(SCRIPTS / "run_pile_singlenode.sh"), *map(str, args)]


@pytest.fixture
def stub_python(tmp_path):
    """A PYTHON that records its argv and the environment the script set, instead of training."""
    out = tmp_path / "stub.json"
    stub = tmp_path / "python"
    stub.write_text(
        textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, sys
        keys = ("XLA_FLAGS", "VOCAB_PATH", "JAX_LOCAL_DEVICE_IDS")
        json.dump({{"argv": sys.argv[1:], "env": {{k: os.environ.get(k) for k in keys}}}},
                  open({str(out)!r}, "w"))
    """)
    )
    stub.chmod(0o755)
    return stub, out


@pytest.fixture
def inputs(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    vocab = tmp_path / "spm.model"
    vocab.write_bytes(b"")
    return data, vocab


@pytest.mark.process
def test_shellcheck():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed")
    res = run(["shellcheck", "-x", *(str(s) for s in ALL_SCRIPTS if s.name not in PAXML_VERBATIM)],
              env=clean_env())
    assert res.returncode == 0, res.stdout + res.stderr


def test_scripts_are_executable():
    for script in ALL_SCRIPTS:
        if script.name != "common.sh":  # sourced, not run
            assert os.access(script, os.X_OK), script


@pytest.mark.process
@pytest.mark.parametrize("name", LAUNCHERS)
def test_usage(name):
    script = str(SCRIPTS / name)
    res = run(["bash", script, "--help"], env=clean_env())
    assert res.returncode == 0 and "Usage:" in res.stdout
    res = run(["bash", script, "only", "three", "args"], env=clean_env())
    assert res.returncode == 2 and "Usage:" in res.stderr


@pytest.mark.process
def test_singlenode_builds_main_command(stub_python, inputs, tmp_path):
    stub, out = stub_python
    data, vocab = inputs
    logdir = tmp_path / "logs"
    res = run(
        singlenode(data, vocab, "bfloat16", 2, 0.5, logdir, "--fdl.MAX_STEPS=5"),
        env=clean_env(PYTHON=str(stub), XLA_FLAGS="--xla_dump_to=/tmp/x"),
    )
    assert res.returncode == 0, res.stderr
    rec = json.loads(out.read_text())
    assert rec["argv"][:2] == ["-u", str(MAIN_PY)]
    assert rec["argv"][2:] == [
        "--fdl_config=experiments.GPT126M",
        f"--job_log_dir={logdir}",
        f"--data_dir={data}",
        f"--vocab_path={vocab}",
        '--fdl.FPROP_DTYPE="bfloat16"',
        "--fdl.PERCORE_BATCH_SIZE=0.5",
        "--fdl.ICI_MESH_SHAPE=[2,1,1]",
        "--fdl.MAX_STEPS=5",
    ]
    assert rec["env"]["VOCAB_PATH"] == str(vocab)
    flags = rec["env"]["XLA_FLAGS"].split()
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in flags
    # The user's flags come after the recommended ones, so they win.
    assert flags.index("--xla_dump_to=/tmp/x") > flags.index("--xla_gpu_enable_triton_gemm=false")
    assert "--xla_force_host_platform_device_count=2" in flags  # CPU: NUM_GPUS fake devices
    assert logdir.is_dir()


@pytest.mark.process
def test_singlenode_rejects_bad_arguments(stub_python, inputs, tmp_path):
    stub, _ = stub_python
    data, vocab = inputs
    script = str(SCRIPTS / "run_pile_singlenode.sh")
    env = clean_env(PYTHON=str(stub))
    for args, message in [
        ([str(data), str(vocab), "float32", "0", "1"], "NUM_GPUS must be a positive integer"),
        ([str(data), str(vocab), "float32", "1", "x"], "PERCORE_BATCH_SIZE must be a number"),
        ([str(tmp_path / "nope"), str(vocab), "float32", "1", "1"], "TFDS_DATA_DIR"),
    ]:
        res = run(["bash", script, *args, str(tmp_path / "logs")], env=env)
        assert res.returncode == 2 and message in res.stderr, res.stderr


@pytest.mark.process
def test_lambada_needs_pretraining_logdir(stub_python, inputs, tmp_path):
    stub, out = stub_python
    data, vocab = inputs
    script = str(SCRIPTS / "run_lambada_singlenode.sh")
    args = [str(data), str(vocab), "float32", "1", "4"]
    res = run(["bash", script, *args, str(tmp_path / "missing")], env=clean_env(PYTHON=str(stub)))
    assert res.returncode == 2 and "LOGDIR" in res.stderr
    res = run(["bash", script, *args, str(tmp_path)], env=clean_env(PYTHON=str(stub)))
    assert res.returncode == 0, res.stderr
    argv = json.loads(out.read_text())["argv"]
    assert "--fdl_config=experiments.Lambada126M" in argv and "--mode=eval" in argv


@pytest.mark.process
def test_multinode_under_slurm(stub_python, inputs, tmp_path):
    stub, out = stub_python
    data, vocab = inputs
    script = str(SCRIPTS / "run_pile_multinode.sh")
    args = [str(data), str(vocab), "bfloat16", "8", "4", str(tmp_path / "logs")]
    slurm = dict(SLURM_JOB_NUM_NODES="2", SLURM_NTASKS="2", SLURM_NODEID="1")
    res = run(
        ["bash", script, *args],
        env=clean_env(PYTHON=str(stub), EXPERIMENT="GPT5B", ICI_MESH_SHAPE="", **slurm),
    )
    assert res.returncode == 0, res.stderr
    rec = json.loads(out.read_text())
    assert "--fdl_config=experiments.GPT5B" in rec["argv"] and "--multiprocess_gpu" in rec["argv"]
    assert "--fdl.DCN_MESH_SHAPE=[2,1,1]" in rec["argv"]
    assert not any(a.startswith("--fdl.ICI_MESH_SHAPE") for a in rec["argv"])  # emptied
    assert rec["env"]["JAX_LOCAL_DEVICE_IDS"] == "0,1,2,3,4,5,6,7"  # one process, all 8 GPUs

    res = run(["bash", script, *args], env=clean_env(PYTHON=str(stub)))
    assert res.returncode == 2 and "not inside a SLURM job" in res.stderr
    res = run(
        ["bash", script, *args],
        env=clean_env(PYTHON=str(stub), SLURM_JOB_NUM_NODES="2", SLURM_NTASKS="16"),
    )
    assert res.returncode == 2 and "one task per node" in res.stderr


@pytest.mark.process
def test_slurm_sub(inputs, tmp_path):
    data, vocab = inputs
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    srun_log = tmp_path / "srun.txt"
    (fakebin / "srun").write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > {srun_log}\n')
    (fakebin / "srun").chmod(0o755)
    clone = tmp_path / "clone"  # a clone with main.py, whether or not this one has it yet
    clone.mkdir()
    (clone / "main.py").write_text("")
    (clone / "scripts_gpu").symlink_to(SCRIPTS)
    sub = str(SCRIPTS / "example_slurm_pile.sub")
    env = clean_env(PATH=f"{fakebin}:{os.environ['PATH']}", SLURM_SUBMIT_DIR=str(clone))

    res = run(["bash", sub], env=env)
    assert res.returncode == 2 and "BASE_WORKSPACE_DIR is not set" in res.stderr

    ws = tmp_path / "ws"
    env.update(
        BASE_WORKSPACE_DIR=str(ws),
        BASE_TFDS_DATA_DIR=str(data),
        BASE_VOCAB_PATH=str(vocab),
        LOG_DIR_LOCAL="pile",
        GPUS_PER_NODE="4",
    )
    res = run(["bash", sub, "--fdl.MAX_STEPS=3"], env=env)
    assert res.returncode == 0, res.stderr
    srun_args = srun_log.read_text().splitlines()
    assert "--ntasks-per-node=1" in srun_args
    i = srun_args.index("bash")
    assert srun_args[i + 1 :] == [
        str(clone / "scripts_gpu" / "run_pile_multinode.sh"),
        str(data),
        str(vocab),
        "bfloat16",
        "4",
        "4",
        str(ws / "pile"),
        "--fdl.MAX_STEPS=3",
    ]
    assert (ws / "outputs").is_dir()

    # A bare BASE_SCRIPT is the user's own launcher in BASE_WORKSPACE_DIR, as the Pax GPU
    # README has it (run_my_model_multinode.sh), before Paxloom's scripts_gpu/.
    (ws / "run_my_model_multinode.sh").write_text("echo mine\n")
    res = run(["bash", sub], env={**env, "BASE_SCRIPT": "run_my_model_multinode.sh"})
    assert res.returncode == 0, res.stderr
    srun_args = srun_log.read_text().splitlines()
    assert srun_args[srun_args.index("bash") + 1] == str(ws / "run_my_model_multinode.sh")
    res = run(["bash", sub], env={**env, "BASE_SCRIPT": "no_such_launcher.sh"})
    assert res.returncode != 0 and "looked up in BASE_WORKSPACE_DIR" in res.stderr


@pytest.mark.process
def test_recommended_xla_flags_are_known_to_this_xla():
    """XLA aborts on an unknown flag; common.sh's flags must parse with the installed jaxlib."""
    src = (
        f'source "{SCRIPTS / "common.sh"}"; exec "{sys.executable}" -c "import jax; jax.devices()"'
    )
    res = run(["bash", "-c", src], env=clean_env())
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.process
def test_singlenode_trains_tiny_on_cpu(tmp_path):
    """End to end: the script drives the real main.py for two steps of the Tiny experiment."""
    if not MAIN_PY.exists():
        pytest.skip("main.py not written yet")
    sample_corpus = pytest.importorskip("tasks.sample_corpus")
    data_dir, vocab_path = sample_corpus.ensure_sample_data()
    logdir = tmp_path / "logs"
    res = run(
        singlenode(data_dir, vocab_path, "float32", 2, 1, logdir, "--fdl.MAX_STEPS=2"),
        env=clean_env(EXPERIMENT="Tiny", PYTHON=sys.executable),
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert logdir.is_dir() and any(logdir.iterdir())


def test_plans_compile_with_the_flags_the_launchers_set():
    """A plan (paxloom/runner/cluster/xla_flags.py use_gpu_defaults) compiles with
    common.sh's flag block, and a user's own XLA_FLAGS still come last."""
    from paxloom.runner.cluster import xla_flags

    block = re.search(r'BASE_XLA_FLAGS=\$\{BASE_XLA_FLAGS-"([^"]*)"\}',
                      (SCRIPTS / "common.sh").read_text()).group(1)
    assert block == xla_flags.GPU_DEFAULTS
    environ = {"XLA_FLAGS": "--xla_gpu_enable_triton_gemm=true"}
    xla_flags.use_gpu_defaults(environ)
    assert environ["XLA_FLAGS"] == f"{block} --xla_gpu_enable_triton_gemm=true"
    environ = {"BASE_XLA_FLAGS": ""}
    xla_flags.use_gpu_defaults(environ)
    assert environ["XLA_FLAGS"] == ""
