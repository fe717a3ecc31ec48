"""bench/ scripts run in their CPU mode (`make test-all`: a minute of make test's budget
for a script that measures GPUs)."""

import json
import os
import subprocess
import sys

import pytest

from tests.data_fixtures import REPO_ROOT


@pytest.mark.slow  # 15-25 s on 2 cores: three fresh processes
def test_gpu_benchmark_runs_every_implementation_on_cpu(tmp_path):
    """bench/gpu_bench.py's CPU mode (tiny shapes): a row with figures per implementation."""
    out = subprocess.run(
        [sys.executable, "bench/gpu_bench.py", "--configs=Synthetic126M", "--steps=2",
         "--impls=praxis,xla",  # Pallas runs interpreted in tests/test_attention.py
         f"--json={tmp_path / 'bench.json'}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
        env=dict(os.environ))  # conftest: 8 CPU devices
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads((tmp_path / "bench.json").read_text())
    assert [row["attention"] for row in rows] == ["praxis", "xla"]
    for row in rows:
        assert "error" not in row, row
        assert row["tokens_per_s"] > 0 and row["compile_s"] > 0 and row["tiny"] is True
    # The same model, data and step on each implementation: the same first loss.
    assert max(r["loss"] for r in rows) - min(r["loss"] for r in rows) < 1e-4
    assert "Synthetic126M  xla" in out.stdout
