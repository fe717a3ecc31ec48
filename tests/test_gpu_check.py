"""bench/gpu_check.sh, the 9-minute GPU check, on CPU: its dry run passes, names every part
with a budget that fits 540 s, and fails (naming the part) when a command line is broken;
its real run reports a part cut off at its limit; the key figures of its summary table say
when a part's files show a failure."""

import json
import os
import re
import subprocess
import sys

import pytest

from bench.rows import experiment

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO_ROOT, "bench", "gpu_check.sh")
PARTS = ["install", "tests", "default", "speed", "moe", "fp8"]  # those a plain run runs
ENV = {**os.environ, "PYTHON": sys.executable}  # conftest's CPU settings, this Python


def check(*args, prelude=":", out=None):
    """bash bench/gpu_check.sh ARGS, or, after `prelude`, main ARGS of the sourced script."""
    command = f"source {SCRIPT}; {prelude}; main {' '.join(args)}"
    env = {**ENV, "OUT": str(out)} if out else ENV
    return subprocess.run(["bash", "-c", command], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.process
def test_the_dry_run_checks_every_part_within_540_seconds():
    done = subprocess.run(["bash", SCRIPT, "--dry-run"], cwd=REPO_ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    budgets = {name: int(seconds) for name, seconds in
               re.findall(r"^(\w+) +budget +(\d+) s  ok$", done.stdout, re.MULTILINE)}
    assert list(budgets) == PARTS, done.stdout
    total = int(re.search(r"^total +budget +(\d+) s", done.stdout, re.MULTILINE).group(1))
    assert total == sum(budgets.values()) <= 540


@pytest.mark.process
@pytest.mark.parametrize("part, prelude, bad", [
    ("default", "MAIN_FLAGS+=(--fdl.NO_SUCH_HYPERPARAMETER=1)", "--fdl.NO_SUCH_HYPERPARAMETER"),
    ("speed", "BENCH_STEPS+=(--no_such_option)", "--no_such_option"),
    ("moe", "BENCH_STEPS+=(--no_such_option)", "--no_such_option"),
])
def test_a_broken_command_line_fails_the_dry_run_naming_its_part(part, prelude, bad):
    done = check("--dry-run", f"--parts {part}", prelude=prelude)
    assert done.returncode != 0
    assert re.search(rf"^{part} +budget +\d+ s  FAILED$", done.stdout, re.MULTILINE), done.stdout
    assert re.search(rf"invalid: python3 .*{bad}", done.stdout), done.stdout


@pytest.mark.process
def test_budgets_over_540_seconds_fail_the_dry_run():
    done = check("--dry-run", "--parts install", "--budget install=600")
    assert done.returncode != 0 and "over 540 s" in done.stdout, done.stdout


@pytest.mark.process
def test_an_unknown_part_is_refused():
    done = check("--dry-run", "--parts speed,sped")
    assert done.returncode == 2 and "unknown part 'sped'" in done.stderr


@pytest.mark.process
def test_a_part_cut_off_at_its_limit_is_a_timeout_in_the_summary(tmp_path):
    """A real run (on CPU) whose part runs out of time: TIMEOUT in the table printed last
    and in $OUT/summary.txt, the other parts skipped, a non-zero exit."""
    done = check("--parts default", "--budget default=1", out=tmp_path)
    assert done.returncode != 0
    table = (tmp_path / "summary.txt").read_text().splitlines()
    assert [line.split()[:2] for line in table[1:]] == [
        ["install", "skipped"], ["tests", "skipped"], ["default", "TIMEOUT"],
        ["speed", "skipped"], ["moe", "skipped"], ["fp8", "skipped"], ["long", "skipped"]]
    assert done.stdout.splitlines()[-len(table):] == table


def test_every_gpu_only_test_file_is_in_the_tests_part():
    listed = re.search(r"^GPU_TESTS=\(([^)]*)\)", open(SCRIPT).read(), re.MULTILINE).group(1)
    gpu_only = []
    for name in sorted(os.listdir(os.path.join(REPO_ROOT, "tests"))):
        if name.startswith("test_") and name.endswith(".py") and name != "test_gpu_check.py":
            text = open(os.path.join(REPO_ROOT, "tests", name)).read()
            if 'default_backend() != "gpu"' in text or "ON_GPU" in text:
                gpu_only.append(f"tests/{name}")
    assert gpu_only and set(gpu_only) <= set(listed.split())


def key(part, out):
    return subprocess.run([sys.executable, "bench/gpu_check_figures.py", "key", part, str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)


def assert_key(part, out, status: int, figures: str) -> None:
    """The summary table's key figure of `part` from the results in `out`, and its status."""
    done = key(part, out)
    assert (done.returncode, done.stdout.strip()) == (status, figures), done.stderr


@pytest.mark.process
def test_the_default_part_fails_when_the_restart_compiled_its_train_step(tmp_path):
    log = ("training Tiny: 1 parameters\nstep     30 | loss 6.5329 | lr 3e-3\n"
           "wrote 1 continuation(s) to x\ntraining LlamaTiny: 1 parameters\n"
           "step     30 | loss 6.1000 | lr 3e-3\nwrote 1 continuation(s) to y\n")
    (tmp_path / "default.log").write_text(log)
    (tmp_path / "default_restart.log").write_text(
        "compiled jit(_train_step) in 3.6s (saved to the persistent compilation cache /c)\n")
    done = key("default", tmp_path)
    assert done.returncode == 1 and "did NOT load" in done.stdout, done.stdout
    (tmp_path / "default_restart.log").write_text(
        "compiled jit(_train_step) in 0.2s (loaded from the persistent compilation cache /c)\n")
    assert_key("default", tmp_path, 0, "Tiny loss 6.533 at step 30, LlamaTiny loss 6.100 at "
               "step 30; 2 decode(s); restart loaded its train step from the cache in 0.2s")


@pytest.mark.process
def test_the_speed_and_fp8_keys_report_rows_and_fail_on_an_error_row(tmp_path):
    peer = {"experiment": "Synthetic126M", "attention": "torch", "mfu": 0.4}
    row = {"experiment": "Synthetic126M", "attention": "auto", "mfu": 0.42, "vs_torch": 1.05}
    (tmp_path / "speed_gpt126m.json").write_text(json.dumps([peer, row]))
    (tmp_path / "speed_large.json").write_text(json.dumps([
        {"experiment": "Llama1B", "attention": "auto", "mfu": 0.3},
        {"experiment": "GPT1_3B", "attention": "auto", "error": "timed out after 120s"}]))
    assert_key("speed", tmp_path, 1, "Synthetic126M 42.0% MFU, x1.05 torch (target 1.0); "
               "Llama1B 30.0% MFU (target 45%); GPT1_3B auto: timed out after 120s")
    base = {"experiment": "Synthetic5B", "fp8": False, "last_loss": 7.0}
    fp8 = {"experiment": "Synthetic5B", "fp8": True, "vs_bf16": 1.25, "last_loss": 7.07,
           "loss_delta": 0.07, "steps_run": 30, "fp8_gemms": 48, "cublas_gemms": 60}
    (tmp_path / "fp8.json").write_text(json.dumps([base, fp8]))
    assert_key("fp8", tmp_path, 0, "FP8 x1.25 bf16 (target 1.2); loss after 30 steps 7.0700 "
               "vs 7.0000 (+1.00%, target within 2%); f8 GEMMs 48/60")


@pytest.mark.process
def test_the_moe_part_runs_each_row_on_one_gpu_and_its_key_compares_moe_with_dense(tmp_path):
    """The moe part's rows build on CPU as they run there (one device: GLaM's NUM_GPUS=1,
    its attention praxis's under --impls auto); its key gives each row's MFU and peak
    memory, the MoE row's tokens/s over the dense peer's, and fails on an error row."""
    script = open(SCRIPT).read()
    command = re.search(r"^part_moe\(\) \{.*?^\}", script, re.MULTILINE | re.DOTALL).group(0)
    configs = re.search(r"--configs (\S+)", command).group(1).split(",")
    assert configs == ["Qwen3A3B_moe", "Qwen3A3B_dense", "Qwen3A3B_tokamax", "Qwen3A3B_padded",
                       "GLaM126M64E"]
    built = {name: experiment(name, "auto", tiny=False, devices=1) for name in configs}
    moe, dense, tokamax, padded, glam = built.values()
    assert (padded.MOE_BACKEND, padded.CAPACITY_FACTOR) == ("padded", 1.25)
    assert (tokamax.MOE_BACKEND, tokamax.CAPACITY_FACTOR) == ("tokamax", 0.0)
    assert (moe.NUM_LAYERS, moe.NUM_EXPERTS, moe.NUM_EXPERTS_PER_TOKEN) == (4, 128, 8)
    assert moe.ICI_MESH_SHAPE == dense.ICI_MESH_SHAPE == glam.ICI_MESH_SHAPE == [1, 1, 1]
    assert moe.expert_shards() == 1 and moe.MAX_SEQ_LEN == dense.MAX_SEQ_LEN
    assert dense.NUM_EXPERTS == 0
    assert dense.HIDDEN_DIMS == moe.NUM_EXPERTS_PER_TOKEN * moe.MOE_HIDDEN_DIMS
    assert (glam.NUM_GPUS, glam.NUM_EXPERTS, glam.ATTENTION_IMPL) == (1, 64, "praxis")

    (tmp_path / "moe.json").write_text(json.dumps([
        {"experiment": "Qwen3A3B_moe", "attention": "auto", "mfu": 0.05, "tokens_per_s": 3000.0,
         "peak_memory_gib": 61.0},
        {"experiment": "Qwen3A3B_dense", "attention": "auto", "mfu": 0.4,
         "tokens_per_s": 40000.0, "peak_memory_gib": 13.4},
        {"experiment": "GLaM126M64E", "attention": "auto", "error": "timed out after 100s"}]))
    assert_key("moe", tmp_path, 1, "Qwen3A3B_moe 5.0% MFU, peak 61.0 GiB, x0.07 dense "
               "tokens/s; Qwen3A3B_dense 40.0% MFU, peak 13.4 GiB; GLaM126M64E: timed out "
               "after 100s")


@pytest.mark.process
def test_the_long_part_runs_only_when_named_and_its_key_is_the_longest_length_that_trained(
        tmp_path):
    """The long part is outside the 9 minutes: its dry run passes when named, with its
    own budget; its rows are the 8B shape cut to 4 layers on one GPU, shortest first; its
    key is the longest row that trained, an out-of-memory row after it ends the search, and
    any other error, or no row trained, fails it."""
    done = check("--dry-run", "--parts long")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^long +budget +\d+ s  ok$", done.stdout, re.MULTILINE), done.stdout
    script = open(SCRIPT).read()
    command = re.search(r"^part_long\(\) \{.*?^\}", script, re.MULTILINE | re.DOTALL).group(0)
    configs = re.search(r"--configs (\S+)", command).group(1).split(",")
    built = [experiment(name, "auto", tiny=False, devices=1) for name in configs]
    assert [e.MAX_SEQ_LEN for e in built] == [65536, 131072]
    for row in built:
        assert (row.NUM_LAYERS, row.MODEL_DIMS, row.NUM_KV_HEADS, row.ICI_MESH_SHAPE) == (
            4, 4096, 8, [1, 1, 1])
    assert built[1].CHECKPOINT_POLICY == "save_nothing"

    short = {"experiment": "Llama8B_64K", "attention": "auto", "seq_len": 65536,
             "tokens_per_s": 15000.0, "mfu": 0.41, "peak_memory_gib": 60.2}
    oom = {"experiment": "Llama8B_128K", "attention": "auto",
           "error": "XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory allocating 93 GiB"}
    (tmp_path / "long.json").write_text(json.dumps([short, oom]))
    assert_key("long", tmp_path, 0, "longest 65,536 tokens; 65,536 tokens: 15,000 tokens/s, "
               "41.0% MFU, peak 60.2 GiB; Llama8B_128K: out of memory")
    (tmp_path / "long.json").write_text(json.dumps([short, {**oom, "error": "timed out"}]))
    assert_key("long", tmp_path, 1, "longest 65,536 tokens; 65,536 tokens: 15,000 tokens/s, "
               "41.0% MFU, peak 60.2 GiB; Llama8B_128K: timed out")
    (tmp_path / "long.json").write_text(json.dumps([{**short, "error": oom["error"]}]))
    assert_key("long", tmp_path, 1, "no length trained; Llama8B_64K: " + oom["error"])
