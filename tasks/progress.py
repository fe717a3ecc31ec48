"""Progress of a long data phase (tokenizing, vocabulary training) on stderr.

On a terminal one line is rewritten in place; in a log file (SLURM's output, `tee`)
a complete line is written every few seconds instead, so the log stays readable
line by line. Each line has the amount done, the rate and the time left.
"""

import sys
import time

from paxloom.core.log import format_duration


def _amount(value: float, unit: str) -> str:
    if unit == "B":  # bytes: the unit that keeps 3 significant digits
        for scale, name in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
            if value >= scale:
                return f"{value / scale:,.1f} {name}"
        return f"{value:,.0f} B"
    return f"{value:,.0f} {unit}"


class Progress:
    """`update(done)` as work proceeds; `finish()` at the end. `total` may be None."""

    def __init__(self, what: str, total: float | None, unit: str = "B", stream=None,
                 interval_s: float | None = None):
        self.what, self.total, self.unit = what, total, unit
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.interval_s = interval_s if interval_s is not None else (0.5 if self.live else 5.0)
        self.start = self._last = time.monotonic()
        self.done = 0.0

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.done / elapsed
        text = f"{self.what}: {_amount(self.done, self.unit)}"
        if self.total:
            done = _amount(self.done, "B") if self.unit == "B" else f"{self.done:,.0f}"
            text = (f"{self.what}: {100 * self.done / self.total:5.1f}% {done} of "
                    f"{_amount(self.total, self.unit)}")
        text += f", {_amount(rate, self.unit)}/s"
        if self.total and rate > 0:
            text += f", ETA {format_duration((self.total - self.done) / rate)}"
        return text + f", {format_duration(elapsed)} elapsed"

    def update(self, done: float, force: bool = False) -> None:
        self.done = done
        now = time.monotonic()
        if force or now - self._last >= self.interval_s:
            self._last = now
            self._write(self.line())

    def finish(self) -> None:
        """The final line: the work turned out to be what was done (`total` may have been
        an estimate or an upper bound)."""
        self.total = self.done or self.total
        self.update(self.done, force=True)
        if self.live:
            self.stream.write("\n")
            self.stream.flush()

    def _write(self, text: str) -> None:
        if self.live:
            self.stream.write(f"\r{text} ")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


class Heartbeat:
    """A line every `interval_s` while a call that reports nothing runs (no ETA known)."""

    def __init__(self, what: str, stream=None, interval_s: float = 15.0):
        import threading

        self.what, self.stream, self.interval_s = what, stream or sys.stderr, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        start = time.monotonic()
        while not self._stop.wait(self.interval_s):
            self.stream.write(f"{self.what}: still running, "
                              f"{format_duration(time.monotonic() - start)} elapsed\n")
            self.stream.flush()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
