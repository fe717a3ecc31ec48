"""Where a job's wall time went, across all its runs (restarts, SLURM requeues).

    python -m paxloom.runner.training.goodput JOB_LOG_DIR

Each training run splits its wall time, from the moment its process started, into
  startup      process start, imports, graph, mesh, initial state or restore
  compile      XLA compilation (the first train step, evaluation steps, ...)
  productive   train steps
  input_wait   the loop waiting for the next batch
  evaluation   in-run evaluations
  checkpoint   the loop held by saves
and counts `lost` work: the steps a run trained after its last checkpoint before it
died, found when the next run restores (their time was productive, but is redone).
goodput = (productive - lost) / wall time, summed over every run of the job.

Process 0 keeps `goodput_current.json`, one fixed-size record rewritten in place
after every step (a few microseconds: no rename, no fsync), so even a run killed
with SIGKILL leaves how far it got; a run that finishes, or the next run after one
that died, appends that run's final record to `goodput.jsonl`.
"""

import json
import os
import sys
import time

from paxloom.core.callbacks import Callback, RunInfo, StepInfo
from paxloom.core.errors import UserError
from paxloom.core.log import format_duration, log
from paxloom.runner.training import compile_log

PHASES = ("startup", "compile", "productive", "input_wait", "evaluation", "checkpoint")
_RECORD_BYTES = 2048


def process_start_time() -> float:
    """When this process started (from Linux's /proc, to the second), else now."""
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()
        start_ticks = int(after_name[19])  # field 22, starttime, in clock ticks after boot
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


class Ledger(Callback):
    """One training run's account, kept as a training-loop callback; `primary` (process 0)
    writes it. Its fractions are published as "train" scalars at every summary step."""

    def __init__(self, job_log_dir: str, *, process_start: float, start_step: int,
                 primary: bool = True):
        self.ledger_path = os.path.join(job_log_dir, "goodput.jsonl")
        self.current_path = os.path.join(job_log_dir, "goodput_current.json")
        self.primary = primary
        self.process_start, self.start_step = process_start, start_step
        self.run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        self.loop_start = self.compile_before_loop = None
        self.waits = {"input_wait": 0.0, "evaluation": 0.0, "checkpoint": 0.0}
        self.step_now = start_step
        self.lost_steps, self.lost_seconds = 0, 0.0
        self._fd = None
        if primary:
            self._account_for_a_dead_run()
            self._fd = os.open(self.current_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def _account_for_a_dead_run(self) -> None:
        """The previous run left its last record behind: it died. Close its account and
        count the steps it trained beyond the step this run restores as lost."""
        check_ledger(self.ledger_path)
        if not os.path.exists(self.current_path):
            return
        with open(self.current_path, errors="replace") as f:
            text = f.read().strip("\0 \t\r\n")
        if not text:  # killed before its very first record
            return
        dead = _parse(text)
        if dead is None:
            set_aside(self.current_path, "not a goodput record")
            return
        dead["ended"] = "died"
        _append(self.ledger_path, dead)
        trained = dead["step"] - dead["start_step"]
        self.lost_steps = max(0, dead["step"] - self.start_step)
        if trained > 0:
            per_step = dead["seconds"]["productive"] / trained
            self.lost_seconds = per_step * min(self.lost_steps, trained)
        if self.lost_steps:
            log(f"goodput: the previous run died at step {dead['step']}; steps "
                f"{self.start_step + 1}..{dead['step']} ({self.lost_steps}) are trained again")

    def on_start(self, run: RunInfo) -> None:
        self.loop_start = time.time()
        self.compile_before_loop = compile_log.total_seconds()

    def on_phase(self, name: str, seconds: float) -> None:
        """`seconds` away from training in `name` (the loop leaves compilation out)."""
        self.waits[name] += seconds

    def after_step(self, info: StepInfo) -> None:
        self.step(info.step)

    def extra_scalars(self, split: str, step: int) -> dict:
        """The fractions so far, with every training summary."""
        return self.scalars() if split == "train" else {}

    def on_end(self, info: StepInfo) -> None:
        self.finish()

    def record(self) -> dict:
        now = time.time()
        compile_total = compile_log.total_seconds()
        loop_start = self.loop_start if self.loop_start is not None else now
        before = self.compile_before_loop if self.compile_before_loop is not None else (
            compile_total)
        seconds = {
            "startup": loop_start - self.process_start - before,
            "compile": compile_total,
            "productive": (now - loop_start) - sum(self.waits.values()) - (
                compile_total - before),
            **self.waits,
        }
        return {"run": self.run_id, "start_step": self.start_step, "step": self.step_now,
                "wall": now - self.process_start, "seconds": seconds,
                "lost_steps": self.lost_steps, "lost_seconds": self.lost_seconds}

    def step(self, step: int) -> None:
        """After every train step: the in-place record a SIGKILL leaves behind."""
        self.step_now = step
        if self._fd is not None:
            data = json.dumps(self.record()).encode().ljust(_RECORD_BYTES)
            os.pwrite(self._fd, data[:_RECORD_BYTES], 0)

    def scalars(self) -> dict[str, float]:
        """This run's split so far, as fractions of its wall time (for TensorBoard)."""
        record = self.record()
        wall = max(record["wall"], 1e-9)
        values = {f"goodput/{name}": seconds / wall
                  for name, seconds in record["seconds"].items()}
        values["goodput/goodput"] = (record["seconds"]["productive"] - self.lost_seconds) / wall
        return values

    def finish(self) -> None:
        """The run ended normally (finished, or preempted after saving)."""
        if self._fd is None:
            return
        record = {**self.record(), "ended": "finished"}
        _append(self.ledger_path, record)
        os.close(self._fd)
        self._fd = None
        os.remove(self.current_path)
        log(summary_line(job_totals(read(os.path.dirname(self.ledger_path)))))


def _parse(text: str) -> dict | None:
    """A run's record from one line of JSON, or None when it is damaged (garbled, cut
    short, or without the keys and numbers a record has)."""
    try:
        record = json.loads(text)
        if not isinstance(record, dict) or not isinstance(record.get("run"), str):
            return None
        numbers = [record[k] for k in ("start_step", "step", "wall", "lost_steps",
                                       "lost_seconds")]
        numbers += [record["seconds"][name] for name in PHASES]
    except (ValueError, KeyError, TypeError):
        return None
    if not all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in numbers):
        return None
    return record


def set_aside(path: str, why: str) -> str:
    """Rename a damaged ledger file beside itself (never delete it), with a one-line
    warning: the account restarts, the run goes on."""
    target = f"{path}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    os.replace(path, target)
    log(f"warning: {path} is damaged ({why}); set aside as {os.path.basename(target)}, "
        f"and the goodput account starts again")
    return target


def _damaged_line(path: str) -> int | None:
    """The number of the first damaged line of a goodput.jsonl, or None if all are sound."""
    with open(path, errors="replace") as f:
        for number, line in enumerate(f, 1):
            if line.strip() and _parse(line) is None:
                return number
    return None


def check_ledger(path: str) -> None:
    """Set a damaged goodput.jsonl aside before this run appends to it."""
    if os.path.exists(path):
        number = _damaged_line(path)
        if number is not None:
            set_aside(path, f"line {number} is not a goodput record")


def _append(path: str, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def read(job_log_dir: str) -> list[dict]:
    """Every run's final record, and the running (or dead, not yet counted) one last."""
    records = []
    path = os.path.join(job_log_dir, "goodput.jsonl")
    if os.path.exists(path):
        with open(path, errors="replace") as f:
            records = [_parse(line) for line in f if line.strip()]
        if None in records:
            raise UserError(f"{path}: line {records.index(None) + 1} is not a goodput "
                            f"record; the next training run sets the file aside")
    current = os.path.join(job_log_dir, "goodput_current.json")
    if os.path.exists(current):
        with open(current, errors="replace") as f:
            text = f.read().strip("\0 \t\r\n")
        record = _parse(text) if text else None
        if record is not None:  # a damaged one is set aside by the next run
            records.append({**record, "ended": "running or died"})
    return records


def job_totals(records: list[dict]) -> dict:
    seconds = {name: sum(r["seconds"][name] for r in records) for name in PHASES}
    wall = sum(r["wall"] for r in records)
    lost = sum(r["lost_seconds"] for r in records)
    return {"runs": len(records), "wall": wall, "seconds": seconds, "lost_seconds": lost,
            "lost_steps": sum(r["lost_steps"] for r in records),
            "goodput": (seconds["productive"] - lost) / wall if wall > 0 else 0.0}


def summary_line(totals: dict) -> str:
    parts = ", ".join(f"{name} {format_duration(totals['seconds'][name])}" for name in PHASES)
    return (f"goodput {totals['goodput']:.1%} of {format_duration(totals['wall'])} over "
            f"{totals['runs']} run(s): {parts}, lost {format_duration(totals['lost_seconds'])} "
            f"({totals['lost_steps']} steps trained again)")


def table(records: list[dict]) -> str:
    """The whole job's ledger: one row per run, then the totals."""
    header = ["run", "steps", "ended", "wall", *PHASES, "lost"]
    rows = []
    for r in records:
        rows.append([r["run"], f"{r['start_step']}->{r['step']}", r.get("ended", "?"),
                     f"{r['wall']:.1f}", *(f"{r['seconds'][p]:.1f}" for p in PHASES),
                     f"{r['lost_seconds']:.1f} ({r['lost_steps']} steps)"])
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True))
             for row in [header, *rows]]
    return "\n".join(lines + ["", summary_line(job_totals(records))])


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m paxloom.runner.training.goodput JOB_LOG_DIR", file=sys.stderr)
        return 2
    try:
        records = read(argv[1])
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not records:
        print(f"error: {argv[1]} has no goodput records (goodput.jsonl); train there first",
              file=sys.stderr)
        return 2
    print(f"seconds of wall time per run ({os.path.join(argv[1], 'goodput.jsonl')}):")
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
