"""The check before the first train step (paxloom/runner/training/memory_check.py): a step that
cannot fit the memory a device can give stops in one line, exit 2, before anything is
recorded; one that fits trains. On CPU the device's memory is stated (--device_memory_gb);
a GPU's allocator states its own."""

import pytest

from paxloom.core.errors import UserError
from paxloom.runner.training import memory_check
from tests.support.processes import run_main
from tests.support.tiny import tiny_flags


class Analysis:
    output_size_in_bytes, alias_size_in_bytes, temp_size_in_bytes = 3 << 30, 1 << 30, 5 << 30


class Compiled:
    def memory_analysis(self):
        return Analysis()


class Device:
    device_kind = "NVIDIA H200"

    def __init__(self, limit, in_use):
        self.stats = {"bytes_limit": limit, "bytes_in_use": in_use}

    def memory_stats(self):
        return self.stats


def test_a_step_fits_what_the_allocator_has_left():
    # 7 GiB beyond the donated state: 3 of outputs, 1 of them over donated buffers, 5 temps.
    assert memory_check.step_bytes(Compiled()) == 7 << 30
    memory_check.check_fits(Compiled(), [Device(10 << 30, 3 << 30)])  # 7 free: fits
    with pytest.raises(UserError, match=r"needs 7.00 GiB .* NVIDIA H200 has 6.00 GiB free "
                                        r"\(the device's allocator\)"):
        memory_check.check_fits(Compiled(), [Device(10 << 30, 3 << 30), Device(10 << 30, 4 << 30)])
    # A stated memory replaces the allocator's limit; unknown on either side: no check.
    with pytest.raises(UserError, match="--device_memory_gb=5"):
        memory_check.check_fits(Compiled(), [Device(None, 0)], stated_gb=5)
    memory_check.check_fits(Compiled(), [Device(None, 0)])


@pytest.mark.process
@pytest.mark.parametrize("memory_gb,fits", [
    (0.001, False),
    pytest.param(64, True, marks=pytest.mark.slow),  # every other run of main.py fits too
])
def test_main_stops_before_the_first_step_only_when_it_cannot_fit(tmp_path, memory_gb, fits):
    run_dir = tmp_path / "run"
    out = run_main("--fdl_config=experiments.Tiny", *tiny_flags(MAX_STEPS=2, LAMBADA_EVAL=False),
                   f"--job_log_dir={run_dir}",
                   f"--device_memory_gb={memory_gb}")
    if fits:
        assert out.returncode == 0, out.stderr[-2000:]
        assert (run_dir / "checkpoints").exists()
        return
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "the train step needs" in errors[0] and "--fdl.PERCORE_BATCH_SIZE" in errors[0]
    assert "--fdl.MAX_SEGMENTS_PER_SEQ" in errors[0]
    assert not run_dir.exists() or not any(run_dir.iterdir())  # nothing recorded, no step
