"""tests/support/crash_rerun.py: a test whose xdist worker dies runs once more; a test that
crashes twice, or fails an assertion, fails as before."""

import pytest

from tests.support.paths import REPO_ROOT
from tests.support.processes import run_python, session_env

ABORTS_ONCE = """
import os, pathlib

def test_aborts_the_first_time():
    marker = pathlib.Path(os.environ["CRASH_MARKER"])
    if not marker.exists():
        marker.write_text("crashed once")
        os.abort()
"""
ABORTS_ALWAYS = "import os\n\ndef test_aborts():\n    os.abort()\n"
FAILS = """
import os

def test_fails_an_assertion():
    with open(os.environ["FAIL_COUNT"], "a") as runs:
        runs.write("run\\n")
    assert False
"""


def pytest_run(tmp_path, name, *plugins):
    """pytest -n 2 on the test files of `name` in tmp_path, with `plugins` (-p)."""
    env = session_env(PYTHONPATH=str(REPO_ROOT), CRASH_MARKER=str(tmp_path / f"{name}.crashed"),
                      FAIL_COUNT=str(tmp_path / f"{name}.count"))
    options = [arg for plugin in plugins for arg in ("-p", plugin)]
    return run_python("-m", "pytest", "-n", "2", "-p", "no:cacheprovider", *options, "-rA",
                      "-q", name, env=env, cwd=tmp_path, timeout=120)


@pytest.mark.process
def test_a_crashed_test_runs_again_once_and_a_failed_assertion_does_not(tmp_path):
    plugin = "tests.support.crash_rerun"
    (tmp_path / "first").mkdir()
    (tmp_path / "first" / "test_aborts_once.py").write_text(ABORTS_ONCE)
    (tmp_path / "first" / "test_fails.py").write_text(FAILS)
    done = pytest_run(tmp_path, "first", plugin)
    assert "1 failed, 1 passed, 1 rerun" in done.stdout, done.stdout
    assert "tests rerun after their worker crashed" in done.stdout
    assert "crashed while running 'first/test_aborts_once.py::" in done.stdout
    assert (tmp_path / "first.count").read_text() == "run\n"  # the assertion ran once

    (tmp_path / "always").mkdir()
    (tmp_path / "always" / "test_aborts.py").write_text(ABORTS_ALWAYS)
    done = pytest_run(tmp_path, "always", plugin)
    assert done.returncode == 1 and "1 failed, 1 rerun" in done.stdout, done.stdout

    # Without the plugin, the first crash is the test's failure.
    (tmp_path / "unguarded").mkdir()
    (tmp_path / "unguarded" / "test_aborts_once.py").write_text(ABORTS_ONCE)
    done = pytest_run(tmp_path, "unguarded")
    assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout
