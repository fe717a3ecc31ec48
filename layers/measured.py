"""What has been measured on a GPU: the table `gpu_measurements.json` beside this module,
one row per training run of an attention implementation or MoE backend on one GPU, and the
choice ATTENTION_IMPL 'auto' makes from it.

A row: `kind` ("attention" or "moe"), `path` (the ATTENTION_IMPL or MOE_BACKEND value),
`case` (what the run's attention looked like: packed rows, grouped key/value heads, the
compute dtype, a context axis, a Hopper-or-newer GPU), the device, jax version and date,
the experiment and batch, tokens/s, MFU, the ratio to the PyTorch peer where one ran, peak
GiB, `trained` (the run trained: no out-of-memory, a finite loss), `gpu_tests_pass` (the
path's numerical checks passed on a GPU), an optional `note` and the command. The GPU check
(bench/gpu_check.sh) writes its rows in this form; `python bench/gpu_check_figures.py record
DIR` adds them to the table.

'auto' on a GPU picks, among the paths that trained and passed their GPU checks in this
case, the one with the highest MFU on the experiment most of them were measured on (MFU
divides out the device's peak; one experiment keeps the model size out of the comparison).
A run on packed rows also stands for unpacked rows (every implementation treats unpacked
rows as packed rows of one document), not the reverse. With nothing measured for the case,
'auto' takes the portable path, praxis's own layers (plain-JAX flash attention with a
context axis), and says so.
"""

import collections
import dataclasses
import functools
import json
from pathlib import Path

TABLE = Path(__file__).with_name("gpu_measurements.json")
CASE_FIELDS = ("packed", "grouped_kv", "dtype", "context", "hopper")
ROW_FIELDS = ("kind", "path", "case", "device", "jax", "date", "experiment", "batch",
              "trained", "gpu_tests_pass", "command")
KINDS = ("attention", "moe")
# With nothing measured for a case: the path that runs everywhere, by kind and context axis.
PORTABLE = {("attention", False): "praxis", ("attention", True): "flash"}


@dataclasses.dataclass(frozen=True)
class Case:
    """What a run's attention looks like, as far as the choice of kernel goes."""

    packed: bool
    grouped_kv: bool  # fewer key/value heads than query heads
    dtype: str  # FPROP_DTYPE
    context: bool  # a context mesh axis
    hopper: bool  # a GPU of compute capability 9.0 or more

    def describe(self) -> str:
        return ", ".join([
            "packed rows" if self.packed else "unpacked rows",
            "grouped key/value heads" if self.grouped_kv else "multi-head",
            self.dtype, "a context axis" if self.context else "no context axis",
            "Hopper or newer" if self.hopper else "before Hopper"])


def check_row(row: dict, where: str = str(TABLE.name)) -> None:
    """ValueError (one line) for a row that lacks a field or has a malformed case."""
    missing = [f for f in ROW_FIELDS if f not in row]
    if missing:
        raise ValueError(f"{where}: a row lacks {', '.join(missing)}: {row}")
    if row["kind"] not in KINDS:
        raise ValueError(f"{where}: kind {row['kind']!r} is not one of {KINDS}")
    case_missing = [f for f in CASE_FIELDS if f not in row["case"]]
    if case_missing:
        raise ValueError(f"{where}: a row's case lacks {', '.join(case_missing)}: {row}")


@functools.cache
def rows() -> tuple[dict, ...]:
    """The table, checked."""
    table = json.loads(TABLE.read_text())
    for row in table:
        check_row(row)
    return tuple(table)


def fastest_run(experiment: str, gpu: str) -> dict | None:
    """The row of `experiment` (a class name) that trained at the highest MFU on a GPU whose
    name holds `gpu` ("H200", "H100"), or None."""
    found = [row for row in rows() if row["experiment"] == experiment and gpu in row["device"]
             and row["trained"] and row.get("mfu")]
    return max(found, key=lambda row: row["mfu"], default=None)


def _covers(measured: dict, case: Case) -> bool:
    return all(measured[f] == getattr(case, f) for f in CASE_FIELDS if f != "packed") and (
        measured["packed"] or not case.packed)


def working(kind: str, case: Case, table=None) -> list[dict]:
    """The rows of `kind` that cover `case`, trained and passed their GPU checks."""
    return [r for r in (rows() if table is None else table)
            if r["kind"] == kind and r["trained"] and r["gpu_tests_pass"]
            and _covers(r["case"], case)]


def fastest(kind: str, case: Case, table=None) -> str | None:
    """The measured path 'auto' takes for `case` (module docstring); None if none."""
    found = working(kind, case, table)
    if not found:
        return None
    by_experiment = collections.defaultdict(dict)  # experiment -> path -> best MFU
    for r in found:
        paths = by_experiment[r["experiment"]]
        paths[r["path"]] = max(paths.get(r["path"], 0.0), r.get("mfu") or 0.0)
    # The experiment with the most paths measured (ties: the first in the table).
    paths = max(by_experiment.values(), key=len)
    return max(paths, key=paths.get)


def choose(kind: str, case: Case, allowed, table=None) -> str:
    """The path 'auto' takes for `case` among `allowed`: the fastest measured one, else the
    portable one (PORTABLE)."""
    allowed = tuple(allowed)
    candidates = [r for r in working(kind, case, table) if r["path"] in allowed]
    return fastest(kind, case, candidates) or PORTABLE[(kind, case.context)]


def unmeasured_note(kind: str, path: str, case: Case, chosen_by_auto: bool = False,
                    table=None) -> str | None:
    """A line for a path that no GPU has measured working in `case` (None if one has):
    'auto' took it for want of any, or the user named it."""
    if any(r["path"] == path for r in working(kind, case, table)):
        return None
    if chosen_by_auto:
        return (f"note: no GPU has measured a {kind} path working for {case.describe()} "
                f"(layers/{TABLE.name}); 'auto' takes {path!r}, the portable one")
    return (f"note: {path!r} has not been measured training on a GPU for {case.describe()} "
            f"(layers/{TABLE.name}); it runs because it was named")
