"""bench/ scripts run in their CPU mode (`make test-all`: a minute of make test's budget
for a script that measures GPUs)."""

import json

import pytest

from bench.rows import MOE_CONFIGS
from tests.support.processes import run_python


@pytest.mark.process
@pytest.mark.slow  # 15-25 s on 2 cores: three fresh processes
def test_gpu_benchmark_runs_every_implementation_on_cpu(tmp_path):
    """bench/gpu_bench.py's CPU mode (tiny shapes): a row with figures per implementation."""
    out = run_python("bench/gpu_bench.py", "--configs=Synthetic126M", "--steps=2",
                     "--impls=praxis,xla",  # Pallas runs interpreted in tests/test_attention.py
                     f"--json={tmp_path / 'bench.json'}", timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads((tmp_path / "bench.json").read_text())
    assert [row["attention"] for row in rows] == ["praxis", "xla"]
    for row in rows:
        assert "error" not in row, row
        assert row["tokens_per_s"] > 0 and row["compile_s"] > 0 and row["tiny"] is True
    # The same model, data and step on each implementation: the same first loss.
    assert max(r["loss"] for r in rows) - min(r["loss"] for r in rows) < 1e-4
    assert "Synthetic126M  xla" in out.stdout


@pytest.mark.process
@pytest.mark.slow  # 20-30 s on 2 cores: three fresh processes and the GEMM script
def test_gpu_benchmark_fp8_rows_and_gemm_script_on_cpu(tmp_path):
    """--fp8: each row then its USE_FP8 twin, with the speed ratio and both losses after
    --loss_steps steps; bench/fp8_gemm.py's CPU mode prints every variant."""
    out = run_python("bench/gpu_bench.py", "--configs=Synthetic126M", "--steps=2",
                     "--impls=praxis", "--fp8", "--loss_steps=6",
                     f"--json={tmp_path / 'bench.json'}", timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    base, fp8 = json.loads((tmp_path / "bench.json").read_text())
    assert "error" not in base and "error" not in fp8, (base, fp8)
    assert (base["fp8"], fp8["fp8"]) == (False, True)
    assert base["steps_run"] == fp8["steps_run"] == 6
    assert fp8["vs_bf16"] > 0 and abs(fp8["loss_delta"]) < 0.05
    assert fp8["params"] > base["params"]  # the scaling state is parameters
    assert "FP8 against bfloat16" in out.stdout and "loss after 6 steps" in out.stdout
    gemm = run_python("bench/fp8_gemm.py", "--tiny", timeout=600)
    assert gemm.returncode == 0, gemm.stderr[-2000:]
    assert "failed" not in gemm.stdout
    assert gemm.stdout.count("flax delayed fwd+bwd") == 3  # square + two model shapes


@pytest.mark.process
@pytest.mark.slow  # 30-40 s on 2 cores: five fresh processes
def test_gpu_benchmark_moe_rows_count_active_parameters_on_cpu(tmp_path):
    """bench/gpu_check.sh's moe rows in their CPU mode (tiny shapes): each measures; the
    MoE rows' MFU counts a token's share of the experts, the dense peer's every weight (one
    FFN of k x MOE_HIDDEN_DIMS: the same but for the router); GLaM's auto runs praxis."""
    out = run_python("bench/gpu_bench.py",
                     "--configs=" + ",".join(MOE_CONFIGS),
                     "--impls=auto", "--steps=2", f"--json={tmp_path / 'bench.json'}",
                     timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    moe, dense, tokamax, padded, glam = json.loads((tmp_path / "bench.json").read_text())
    for row in (moe, dense, tokamax, padded, glam):
        assert "error" not in row, row
        assert row["tokens_per_s"] > 0 and row["tiny"] is True
    assert dense["active_params"] == dense["params"]
    router = 2 * 64 * 128  # tiny: 2 layers, 64 wide, 128 experts
    assert moe["active_params"] - router == dense["active_params"] < moe["params"]
    assert padded["active_params"] == tokamax["active_params"] == moe["active_params"]
    assert glam["active_params"] < glam["params"] and glam["resolved"] == "praxis"
    assert "GLaM126M64E    auto>praxis" in out.stdout
