"""Progress lines for long data phases: whole lines in a log file, one rewritten line on a
terminal, with rate and time left."""

import io
import time

from tasks.progress import Heartbeat, Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_log_file_gets_whole_lines_with_rate_and_eta():
    log = io.StringIO()
    progress = Progress("tokenizing 2 file(s)", 4_000_000, stream=log, interval_s=0)
    progress.update(1_000_000)
    progress.update(3_000_000)
    progress.finish()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 3
    assert lines[0].startswith("tokenizing 2 file(s):  25.0% 1.0 MB of 4.0 MB, ")
    assert "B/s, ETA " in lines[0] and lines[0].endswith("elapsed")
    assert lines[2].startswith("tokenizing 2 file(s): 100.0% 3.0 MB of 3.0 MB")  # what it was


def test_log_file_lines_are_spaced_out_and_a_terminal_line_is_rewritten():
    log = io.StringIO()
    progress = Progress("reading", 100, unit="sentences", stream=log, interval_s=3600)
    for done in range(1, 51):
        progress.update(done)
    assert log.getvalue() == ""  # nothing before the interval
    progress.finish()
    assert log.getvalue().startswith("reading: 100.0% 50 of 50 sentences")
    terminal = Terminal()
    progress = Progress("reading", 100, unit="sentences", stream=terminal, interval_s=0)
    progress.update(10)
    progress.finish()
    assert terminal.getvalue().startswith("\rreading:  10.0% 10 of 100 sentences")
    assert terminal.getvalue().endswith("\n") and terminal.getvalue().count("\n") == 1


def test_heartbeat_says_a_silent_phase_is_alive():
    log = io.StringIO()
    beat = Heartbeat("vocabulary: training 32000 BPE pieces", stream=log, interval_s=0.05)
    beat.start()
    time.sleep(0.3)
    beat.stop()
    assert "vocabulary: training 32000 BPE pieces: still running, 0m00s elapsed" in log.getvalue()
