"""bench/gpu_check.sh, the GPU check, on CPU: its dry run passes, names the parts of the
first run with budgets that fit 540 s and those of the second run with budgets that fit 4
minutes, and fails (naming the part) when a command line is broken; its real run reports a
part cut off at its limit; the key figures of its summary table say when a part's files show
a failure; bench/gpu_check_figures.py turns a check's results into rows of the table of
GPU-measured paths (layers/gpu_measurements.json), records them once, and refuses a
malformed one; a benchmark row that cannot fit the device is a one-line error row."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from bench import gpu_check_figures as figures
from bench.rows import experiment
from layers import measured

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO_ROOT, "bench", "gpu_check.sh")
FIRST_RUN = ["install", "speed", "moe", "fp8"]  # those a plain run runs
SECOND_RUN = ["tests"]  # --parts tests on the warm machine
ALL_PARTS = ["install", "speed", "moe", "fp8", "candidates", "layouts", "tests", "default",
             "more", "long"]  # the order they run in
ENV = {**os.environ, "PYTHON": sys.executable}  # conftest's CPU settings, this Python


def check(*args, prelude=":", out=None):
    """bash bench/gpu_check.sh ARGS, or, after `prelude`, main ARGS of the sourced script."""
    command = f"source {SCRIPT}; {prelude}; main {' '.join(args)}"
    env = {**ENV, "OUT": str(out)} if out else ENV
    return subprocess.run(["bash", "-c", command], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def part_body(name: str) -> str:
    script = open(SCRIPT).read()
    return re.search(rf"^part_{name}\(\) \{{.*?^\}}", script, re.MULTILINE | re.DOTALL).group(0)


@pytest.mark.process
def test_the_dry_run_checks_both_runs_within_their_budgets():
    """Without --parts the dry run checks the first run (540 s at most) and the second (4
    minutes of device time: 225 s of budgets); every part between is one of theirs."""
    done = subprocess.run(["bash", SCRIPT, "--dry-run"], cwd=REPO_ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    first, second = done.stdout.split("the second run (--parts tests)")
    for text, parts, limit in ((first, FIRST_RUN, 540), (second, SECOND_RUN, 225)):
        budgets = {name: int(seconds) for name, seconds in
                   re.findall(r"^(\w+) +budget +(\d+) s  ok$", text, re.MULTILINE)}
        assert list(budgets) == parts, done.stdout
        total = re.search(r"^total +budget +(\d+) s  \(at most (\d+) s\)", text, re.MULTILINE)
        assert int(total.group(2)) == limit, done.stdout
        assert int(total.group(1)) == sum(budgets.values()) <= limit


@pytest.mark.process
@pytest.mark.parametrize("part, prelude, bad", [
    ("default", "MAIN_FLAGS+=(--fdl.NO_SUCH_HYPERPARAMETER=1)", "--fdl.NO_SUCH_HYPERPARAMETER"),
    ("speed", "BENCH_STEPS+=(--no_such_option)", "--no_such_option"),
    ("candidates", "FEW_STEPS+=(--set NO_SUCH_HYPERPARAMETER=1)", "NO_SUCH_HYPERPARAMETER"),
    ("moe", "FEW_STEPS+=(--no_such_option)", "--no_such_option"),
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
        [part, "TIMEOUT" if part == "default" else "skipped"] for part in ALL_PARTS]
    assert done.stdout.splitlines()[-len(table):] == table


def test_the_first_run_measures_speed_moe_and_fp8_and_the_second_runs_the_tests():
    """The first run measures the default path against its PyTorch peer and profiles it,
    then the MoE backends against their dense peer, then FP8; the tests part (the second
    run) stops in time to write its report (pytest's session limit, then SIGINT), each
    test by name; candidates (the grouped-query Llama1B with cuDNN's packed layout at the
    bounds 8 and 16, a few steps each) and layouts (the planner's single-device choices)
    run when named."""
    script = open(SCRIPT).read()
    first = re.search(r"^FIRST_RUN=\(([^)]*)\)", script, re.MULTILINE).group(1).split()
    assert first == FIRST_RUN
    speed = part_body("speed")
    assert re.search(r"--configs Synthetic126M --impls auto --torch\s+\\?\s*"
                     r"--percore_batch_size 8", speed), speed
    assert "--profile_steps 3" in speed
    moe = part_body("moe")
    assert "--configs Qwen3A3B_dense,Qwen3A3B_tokamax,Qwen3A3B_padded," in moe
    candidates = part_body("candidates")
    assert "--configs Llama1B --impls cudnn" in candidates
    assert "--sweep MAX_SEGMENTS_PER_SEQ=8,16" in candidates
    assert "EMBEDDING_LOOKUP_STYLE=index" in candidates
    assert '"${FEW_STEPS[@]}"' in candidates
    assert re.search(r"^FEW_STEPS=\(--steps 6 --warmup 1\)", script, re.MULTILINE)
    layouts = part_body("layouts")
    assert "--sweep PERCORE_BATCH_SIZE=4,8,16" in layouts and "--impls auto" in layouts
    assert "--sweep CHECKPOINT_POLICY=save_nothing,none,save_dot_with_no_batch_dims" in layouts
    tests = part_body("tests")
    for flag in ("-v", "-rfE", "--tb=line", "--junitxml=", "--session-timeout=", "RUN_SIGNAL=INT"):
        assert flag in tests, flag
    assert re.search(r"^TEST_LIMIT_S=30\b", script, re.MULTILINE)


def test_every_gpu_only_test_file_is_in_the_tests_part():
    listed = re.search(r"^GPU_TESTS=\(([^)]*)\)", open(SCRIPT).read(), re.MULTILINE).group(1)
    gpu_only = []
    for name in sorted(os.listdir(os.path.join(REPO_ROOT, "tests"))):
        if name.startswith("test_") and name.endswith(".py") and name != "test_gpu_check.py":
            text = open(os.path.join(REPO_ROOT, "tests", name)).read()
            if 'default_backend() != "gpu"' in text or "ON_GPU" in text:
                gpu_only.append(f"tests/{name}")
    assert gpu_only and set(gpu_only) <= set(listed.split())


@pytest.mark.process
def test_every_path_the_table_rows_ask_tests_of_is_named_by_a_gpu_test():
    """gpu_tests_pass looks for each attention path among the GPU tests' parameters: every
    path it asks tests of must be named there (cuDNN's cases are collected on GPUs only,
    so its name is looked up in the test files' text)."""
    listed = re.search(r"^GPU_TESTS=\(([^)]*)\)", open(SCRIPT).read(), re.MULTILINE).group(1)
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *listed.split()], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    named = {p for line in done.stdout.splitlines() for p in figures.parameters(line)}
    text = "".join(open(os.path.join(REPO_ROOT, f)).read() for f in listed.split())
    for path in figures.TESTED_PATHS:
        assert path in named or f'"{path}"' in text, path


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
    row = {"experiment": "Synthetic126M", "attention": "auto", "mfu": 0.42, "vs_torch": 1.05,
           "resolved": "cudnn"}
    llama = {"experiment": "Llama1B", "attention": "auto", "mfu": 0.3}
    (tmp_path / "speed.json").write_text(json.dumps([peer, row, llama]))
    assert_key("speed", tmp_path, 0, "Synthetic126M 42.0% MFU (cudnn), x1.05 torch (target "
               "1.0); Llama1B 30.0% MFU (target 45%)")
    # The default path must train: even a one-line refusal fails the part.
    refusal = ("UserError: the train step needs 81.20 GiB per device beyond the state it "
               "holds, and NVIDIA H100 80GB HBM3 has 66.10 GiB free")
    (tmp_path / "speed.json").write_text(json.dumps([peer, row, {**llama, "error": refusal}]))
    assert_key("speed", tmp_path, 1, "Synthetic126M 42.0% MFU (cudnn), x1.05 torch (target "
               f"1.0); Llama1B auto: {refusal}")
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
    configs = re.search(r"--configs (\S+)", part_body("moe")).group(1).split(",")
    assert configs == ["Qwen3A3B_dense", "Qwen3A3B_tokamax", "Qwen3A3B_padded", "Qwen3A3B_moe",
                       "GLaM126M64E"]
    built = {name: experiment(name, "auto", tiny=False, devices=1) for name in configs}
    dense, tokamax, padded, moe, glam = built.values()
    assert padded.MOE_BACKEND == "padded" and padded.CAPACITY_FACTOR > 0
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
    # tokamax refused in one line on a jax it does not support: reported, not a failure.
    rows = json.loads((tmp_path / "moe.json").read_text())[:2] + [
        {"experiment": "Qwen3A3B_tokamax", "attention": "auto",
         "error": "UserError: MOE_BACKEND='tokamax': tokamax 0.0.12 does not support jax 0.11.2"}]
    (tmp_path / "moe.json").write_text(json.dumps(rows))
    assert_key("moe", tmp_path, 0, "Qwen3A3B_moe 5.0% MFU, peak 61.0 GiB, x0.07 dense "
               "tokens/s; Qwen3A3B_dense 40.0% MFU, peak 13.4 GiB; Qwen3A3B_tokamax: "
               "UserError: MOE_BACKEND='tokamax': tokamax 0.0.12 does not support jax 0.11.2")
    # Every backend of the MoE against the dense peer, whatever the order.
    (tmp_path / "moe.json").write_text(json.dumps([
        {"experiment": "Qwen3A3B_dense", "attention": "auto", "mfu": 0.4,
         "tokens_per_s": 40000.0, "peak_memory_gib": 13.4},
        {"experiment": "Qwen3A3B_padded", "attention": "auto", "mfu": 0.3,
         "tokens_per_s": 30000.0, "peak_memory_gib": 20.0}]))
    assert_key("moe", tmp_path, 0, "Qwen3A3B_dense 40.0% MFU, peak 13.4 GiB; Qwen3A3B_padded "
               "30.0% MFU, peak 20.0 GiB, x0.75 dense tokens/s")


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
    configs = re.search(r"--configs (\S+)", part_body("long")).group(1).split(",")
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


@pytest.mark.process
def test_the_candidates_key_reports_refusals_and_the_tests_key_names_failures(tmp_path):
    """A candidate that cannot fit is a finding (a table row that did not train), not the
    part's failure; a crash is. The tests key names the tests that did not pass."""
    fits = {"experiment": "Synthetic126M", "attention": "cudnn", "mfu": 0.35,
            "peak_memory_gib": 9.5, "settings": {"MAX_SEGMENTS_PER_SEQ": 16}}
    refused = {"experiment": "Synthetic126M", "attention": "cudnn",
               "settings": {"MAX_SEGMENTS_PER_SEQ": 8},
               "error": "UserError: the train step needs 90.00 GiB per device"}
    (tmp_path / "candidates_cudnn.json").write_text(json.dumps([refused, fits]))
    (tmp_path / "candidates_pallas.json").write_text(json.dumps([
        {"experiment": "Synthetic126M", "attention": "pallas", "mfu": 0.3}]))
    expected = ("Synthetic126M cudnn MAX_SEGMENTS_PER_SEQ=8: UserError: the train step needs "
                "90.00 GiB per device; Synthetic126M cudnn MAX_SEGMENTS_PER_SEQ=16 35.0% MFU, "
                "peak 9.5 GiB; Synthetic126M pallas 30.0% MFU")
    assert_key("candidates", tmp_path, 0, expected)
    crash = {**refused, "error": "exit status -11: Segmentation fault"}
    (tmp_path / "candidates_cudnn.json").write_text(json.dumps([crash, fits]))
    assert key("candidates", tmp_path).returncode == 1

    (tmp_path / "tests.log").write_text(
        "tests/test_attention.py::test_a[mha-packed-cudnn-bfloat16] PASSED [ 50%]\n"
        "tests/test_attention.py::test_a[mha-packed-xla-bfloat16] FAILED [100%]\n"
        "FAILED tests/test_attention.py::test_a[mha-packed-xla-bfloat16] - assert 1 == 2\n"
        "!!!!!!! session-timeout: 120.0 sec exceeded !!!!!!!\n"
        "==================== 1 failed, 1 passed in 125.00s ====================\n")
    assert_key("tests", tmp_path, 0, "1 failed, 1 passed in 125.00s; failed: "
               "test_a[mha-packed-xla-bfloat16]")


def bench_row(experiment="Synthetic126M", attention="auto", **fields):
    """A gpu_bench row from one H200, as the check's JSON holds it."""
    row = {"experiment": experiment, "attention": attention, "resolved": "cudnn",
           "packed": True, "grouped_kv": False, "fprop_dtype": "bfloat16", "context": False,
           "hopper": True, "platform": "gpu", "compute_capability": "9.0",
           "max_segments": 32, "num_experts": 0, "moe_backend": None, "global_batch": 8,
           "seq_len": 2048, "device": "NVIDIA H200", "devices": 1, "jax": "0.11.2",
           "date": "2026-11-28", "tiny": False, "fp8": False, "loss": 10.9, "last_loss": 7.5,
           "tokens_per_s": 330123.4, "mfu": 0.32145, "peak_memory_gib": 11.14,
           "command": f"bench/gpu_bench.py --configs {experiment} --impls {attention} "
                      "--percore_batch_size 8 --steps 6 --warmup 1"}
    return {**row, **fields}


def junit(cases: dict) -> str:
    """A JUnit XML report as pytest writes it: test name -> passed, failed, xfailed."""
    body = {"passed": "", "failed": '<failure message="assert 1 == 2">E</failure>',
            "xfailed": '<skipped type="pytest.xfail" message="known" />'}
    return ('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
            + "".join(f'<testcase classname="tests.test_attention" name="{name}" time="1">'
                      f"{body[outcome]}</testcase>" for name, outcome in cases.items())
            + '<testcase time="0.000" /></testsuite></testsuites>')


def run_figures(*args):
    return subprocess.run([sys.executable, "bench/gpu_check_figures.py", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.process
def test_the_checks_rows_become_table_rows_recorded_once(tmp_path):
    """`rows` prints the table rows of a made-up check (the peer, an FP8 row, a row cut off
    by the time limit and GLaM's GShard mixture are none); each path's gpu_tests_pass
    comes from tests.xml, else tests.log; `record` appends them to a copy of the table,
    whose text it keeps, once, and the table still reads."""
    out = tmp_path / "out"
    out.mkdir()
    peer = {"experiment": "Synthetic126M", "attention": "torch", "tokens_per_s": 450000.0,
            "global_batch": 8, "seq_len": 2048, "device": "NVIDIA H200", "tiny": False}
    auto = bench_row(vs_torch=0.7336,
                     command="bench/gpu_bench.py --configs Synthetic126M,Llama1B --impls auto "
                             "--torch --percore_batch_size 8 --steps 10 --warmup 2")
    llama = bench_row("Llama1B", grouped_kv=True, tokens_per_s=56150.2, mfu=0.4381)
    (out / "speed.json").write_text(json.dumps([peer, auto, llama]))
    sweep = ("bench/gpu_bench.py --configs Synthetic126M --impls cudnn --percore_batch_size 8 "
             "--set MAX_SEGMENTS_PER_SEQ={} --steps 6 --warmup 1")
    refused = bench_row(attention="cudnn", max_segments=8, command=sweep.format(8), error=(
        "UserError: the train step needs 70.00 GiB per device beyond the state it holds, and "
        "NVIDIA H200 has 60.00 GiB free (the device's allocator): it would run out of memory"))
    bound16 = bench_row(attention="cudnn", max_segments=16, mfu=0.351, command=sweep.format(16))
    pallas = bench_row(attention="pallas", resolved="pallas", tokens_per_s=300000.0, mfu=0.29)
    cut = bench_row(attention="pallas", resolved="pallas", error="timed out after 90s")
    (out / "candidates_cudnn.json").write_text(json.dumps([refused, bound16]))
    (out / "candidates_pallas.json").write_text(json.dumps([pallas, cut]))
    moe = bench_row("Qwen3A3B_moe", grouped_kv=True, num_experts=128, moe_backend="ragged_dot",
                    global_batch=1)
    glam = bench_row("GLaM126M64E", resolved="praxis", num_experts=64, moe_backend="gshard")
    fp8 = bench_row("Synthetic5B", fp8=True)
    (out / "moe.json").write_text(json.dumps([moe, glam]))
    (out / "fp8.json").write_text(json.dumps([fp8]))
    (out / "tests.xml").write_text(junit({
        "test_f[mha-packed-cudnn-bfloat16]": "passed", "test_f[gqa-packed-cudnn-bfloat16]": "passed",
        "test_f[mha-packed-pallas-bfloat16]": "xfailed", "test_f[mha-packed-xla-bfloat16]": "failed"}))

    done = run_figures("rows", str(out))
    assert done.returncode == 0, done.stderr
    rows = json.loads(f"[{done.stdout}]")
    assert [(r["experiment"], r["path"], r.get("max_segments")) for r in rows] == [
        ("Synthetic126M", "cudnn", 32), ("Llama1B", "cudnn", 32), ("Synthetic126M", "cudnn", 8),
        ("Synthetic126M", "cudnn", 16), ("Synthetic126M", "pallas", None),
        ("Qwen3A3B_moe", "ragged_dot", None)]
    first, llama_row, refused_row, _, pallas_row, moe_row = rows
    assert list(first) == ["kind", "path", "max_segments", "case", "device", "jax", "date",
                           "experiment", "batch", "tokens_per_s", "mfu", "vs_torch", "peak_gib",
                           "trained", "gpu_tests_pass", "command"]
    assert first["case"] == {"packed": True, "grouped_kv": False, "dtype": "bfloat16",
                             "context": False, "hopper": True}
    assert (first["batch"], first["tokens_per_s"], first["mfu"], first["vs_torch"],
            first["peak_gib"], first["trained"], first["gpu_tests_pass"]) == (
        "8x2048", 330123, 0.321, 0.73, 11.1, True, True)
    assert first["command"] == auto["command"] and first["date"] == "2026-11-28"
    assert llama_row["case"]["grouped_kv"] and "vs_torch" not in llama_row
    assert not refused_row["trained"] and "tokens_per_s" not in refused_row
    assert refused_row["note"].startswith("UserError: the train step needs 70.00 GiB")
    # No --torch in its command: its ratio is over the speed part's peer.
    assert pallas_row["vs_torch"] == round(300000 / 450000, 2)
    assert not pallas_row["gpu_tests_pass"] and "(xfailed)" in pallas_row["note"]
    assert (moe_row["kind"], moe_row["gpu_tests_pass"], moe_row["batch"]) == ("moe", True, "1x2048")
    for reason in ("the PyTorch peer", "timed out after 90s", "(gshard) is no MOE_BACKEND",
                   "an FP8 row"):
        assert reason in done.stderr, done.stderr

    # Without tests.xml, tests.log's -v lines; without either, no path with tests passes.
    (out / "tests.xml").unlink()
    (out / "tests.log").write_text(
        "tests/test_attention.py::test_f[mha-packed-cudnn-bfloat16] PASSED [ 50%]\n"
        "tests/test_attention.py::test_f[mha-packed-pallas-bfloat16] XFAIL (known) [100%]\n")
    by_log = figures.table_rows([out])
    assert [r["gpu_tests_pass"] for r in by_log] == [True, True, True, True, False, True]
    (out / "tests.log").unlink()
    untested = figures.table_rows([out])
    assert [r["gpu_tests_pass"] for r in untested] == [False] * 5 + [True]
    assert "did not run in this check" in untested[0]["note"]
    (out / "tests.xml").write_text(junit({"test_f[mha-packed-cudnn-bfloat16]": "passed"}))

    table = tmp_path / "gpu_measurements.json"
    shutil.copy(measured.TABLE, table)
    before = table.read_text()
    done = run_figures("record", str(out), "--table", str(table))
    assert done.returncode == 0, done.stderr
    assert "added 6 row(s)" in done.stdout and "0 already there" in done.stdout
    text = table.read_text()
    assert text.startswith(before.rstrip()[:-1].rstrip()) and text.endswith("}\n]\n")
    recorded = json.loads(text)
    assert recorded[:len(json.loads(before))] == json.loads(before)
    assert recorded[-6:] == figures.table_rows([out])
    for row in recorded:
        measured.check_row(row)
    done = run_figures("record", str(out), "--table", str(table))
    assert done.returncode == 0 and "added 0 row(s)" in done.stdout, done.stdout + done.stderr
    assert table.read_text() == text
    # A malformed row: one line, exit 1, nothing written (not even the well-formed rows).
    bad = bench_row(attention="xla", resolved="xla")
    del bad["command"]
    (out / "more_bad.json").write_text(json.dumps([bad]))
    done = run_figures("record", str(out), "--table", str(table))
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 1 and len(errors) == 1 and "lacks command" in errors[0], done.stderr
    assert "Traceback" not in done.stderr and table.read_text() == text


def test_the_install_part_compares_the_versions_with_the_lock():
    """The machine's packages and every carried one against constraints.txt: a line per
    package off the lock, else one line; every name gpu_wheels.sh carries is in the
    lock."""
    lock = figures.LOCK.read_text()
    carried = figures.carried()
    assert {"praxis", "tokamax", "xprof", "pytest-timeout"} <= set(carried)
    lines = figures.lock_lines()
    assert not [line for line in lines if "not in constraints.txt" in line], lines
    # This environment's jax: the lock's (no line), or the newest (make test-newest) named.
    locked_jax = figures.locked(lock)["jax"][1]
    found_jax = figures.distribution("jax")
    assert [line for line in lines if line.startswith("lock: jax ")] == (
        [] if found_jax == locked_jax else [f"lock: jax {locked_jax}, found {found_jax}"])
    installed = "".join(f"{name}=={figures.distribution(name)}\n" for name in ("jax", "jaxlib"))
    assert figures.against_lock(installed, ["jax", "jaxlib"]) == [
        "lock: all 2 checked packages match constraints.txt"]
    # Another jax, a package not installed (spelled otherwise than the lock: PEP 503), a
    # name the lock lacks.
    doctored = re.sub(r"^jax==.*$", "jax==0.0.1", lock, flags=re.MULTILINE)
    doctored += "no_such.Package==1.0\n"
    assert figures.against_lock(doctored, ["jax", "no-such-package", "nor-this"]) == [
        f"lock: jax 0.0.1, found {figures.distribution('jax')}",
        "lock: no-such-package 1.0, not installed", "lock: nor-this is not in constraints.txt"]
    # What gpu_wheels.sh downloads: the lock's versions, and one line for a name it lacks.
    assert "praxis==1.4.0" in figures.carried_pins(lock)
    with pytest.raises(figures.Failed, match=r"^gpu_wheels.sh: tokamax not in constraints"):
        figures.carried_pins(re.sub(r"^tokamax==.*$", "", lock, flags=re.MULTILINE))
    # A CUDA build's local label is the lock's release.
    assert figures.against_lock("torch==2.11.0\n", ["torch"], lambda name: "2.11.0+cu130") == [
        "lock: all 1 checked packages match constraints.txt"]


@pytest.mark.process
def test_the_versions_command_prints_the_lock_lines_first():
    done = run_figures("versions")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("lock: ") and lines[-1].startswith("jax "), done.stdout


def test_record_refuses_a_malformed_row_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    table = tmp_path / "gpu_measurements.json"
    shutil.copy(measured.TABLE, table)
    before = table.read_text()
    row = bench_row()
    del row["command"]  # a row that does not say how to measure it again
    (out / "speed.json").write_text(json.dumps([row]))
    with pytest.raises(ValueError, match="lacks command"):
        figures.record([out], table)
    (out / "speed.json").write_text(json.dumps([bench_row(fprop_dtype=None)]))
    with pytest.raises(ValueError, match=r"malformed case\.dtype"):
        figures.record([out], table)
    (out / "speed.json").write_text(json.dumps([bench_row(date="28/11/2026")]))
    with pytest.raises(ValueError, match="malformed date"):
        figures.record([out], table)
    assert table.read_text() == before


@pytest.mark.process
@pytest.mark.slow  # two benchmark rows in fresh processes: 20 s
def test_a_row_that_cannot_fit_is_an_error_row_and_the_next_row_runs(tmp_path):
    """gpu_bench compiles each row's step, then compares its memory with the device's
    (on CPU: --device_memory_gb): a row that cannot fit is one error line, no traceback,
    with what the table needs of it; the row after it still runs, and the JSON holds both."""
    done = subprocess.run(
        [sys.executable, "bench/gpu_bench.py", "--configs", "Synthetic126M", "--impls", "praxis",
         "--sweep", "MAX_SEGMENTS_PER_SEQ=8,16", "--steps", "1", "--warmup", "0",
         "--device_memory_gb", "0.0001", "--json", str(tmp_path / "rows.json")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r["max_segments"] for r in rows] == [8, 16]
    for row in rows:
        assert row["error"].startswith("UserError: the train step needs "), row
        assert "GiB free (--device_memory_gb=0.0001)" in row["error"]
        assert (row["resolved"], row["packed"], row["platform"]) == ("praxis", True, "cpu")
        assert row["command"].startswith("bench/gpu_bench.py --configs Synthetic126M --impls "
                                         "praxis --set MAX_SEGMENTS_PER_SEQ=")
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stdout.count("error: UserError: the train step needs") == 2
