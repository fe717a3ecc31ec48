"""A test whose pytest-xdist worker process dies runs once more, on a fresh worker.

Why: twice in about eight full runs (2026-11-25/26) a worker died with "Fatal Python error:
Aborted" inside XLA:CPU while a pipelined Llama test (tests/test_pipeline.py) waited for
its step's result, and the same test passed when run again, alone or beside others (24
targeted runs). The abort's own message is lost with the worker (pytest's fd capture holds
it), so its cause is still open. A failed assertion is never rerun: only a crash, which no
assertion of the test saw, and only once; a test that crashes twice fails as before. Each
crash is named in a section of the summary ("tests rerun after their worker crashed"), and
the totals count it ("1 rerun"), so a crash is never silent.

tests/conftest.py imports these hooks; `pytest -p tests.support.crash_rerun` loads them
elsewhere (tests/test_crash_rerun.py).
"""

import pytest

_crashed: dict[str, str] = {}  # test id -> the crash report's message, on the controller


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """pytest-xdist's hook for a test whose worker died: schedule it again, once."""
    if crashitem in _crashed:
        return
    _crashed[crashitem] = str(report.longrepr)
    sched.mark_test_pending(crashitem)
    report.outcome = "rerun"


def pytest_report_teststatus(report):
    if report.outcome == "rerun":
        return "rerun", "R", "RERUN"
    return None


def pytest_terminal_summary(terminalreporter):
    if _crashed:
        terminalreporter.section("tests rerun after their worker crashed")
        for message in _crashed.values():
            terminalreporter.line(message)
