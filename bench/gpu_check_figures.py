"""The lines bench/gpu_check.sh prints from what its parts wrote, and the rows they add to
the table of paths measured on a GPU (layers/gpu_measurements.json, which ATTENTION_IMPL
'auto' reads: layers/measured.py).

- `versions`: the install part's lines: first the installed version of each package a GPU
  run needs against the lock (constraints.txt), a line per mismatch (else one line that all
  matched); then jax, jaxlib, cuDNN, driver, devices.
- `pins`: the lock's `name==version` of each wheel bench/gpu_wheels.sh carries.
- `key PART OUT`: a part's key figure for the summary table. It exits 1 where the files
  show a failure that no exit status gave: a benchmark row with an error, a training or
  decode that left no result, a restart that compiled its train step instead of loading it
  from the persistent compilation cache. Targets are printed beside the figures; a missed
  target is a finding to write up, not a failure.
- `rows OUT...`: the check's benchmark rows (every gpu_bench JSON in each OUT) as rows of
  the table, in its format, one JSON object per row; what each row's GPU tests did comes
  from the tests part's tests.xml (JUnit XML; else its tests.log) in any OUT given.
- `record OUT...`: the same rows appended to layers/gpu_measurements.json, each checked
  (layers/measured.py check_row); a row already there (same command, device, date and
  path) is not added again. Then commit the table.

    python3 bench/gpu_check_figures.py versions
    python3 bench/gpu_check_figures.py key speed runs/gpu_check
    python3 bench/gpu_check_figures.py rows runs/gpu_check
    python3 bench/gpu_check_figures.py record runs/gpu_check runs/gpu_check_second

A benchmark row becomes a table row when it ran on a GPU at full size and says what it
ran (gpu_bench records it): not the PyTorch peer, not an FP8 row (the table has no FP8
case), not a row cut off by the check's time limit (that measures nothing about the path),
and not a mixture whose layer is no MOE_BACKEND (GLaM's GShard layers). `trained`: no error
and a finite loss; an error (out of memory, a step that cannot fit) is the row's `note`.
`gpu_tests_pass`: for a path the GPU tests name (an attention implementation among a
test's parameters, e.g. test_x[mha-packed-cudnn-bfloat16]), true when at least one of its
tests ran in the check and none failed, erred or failed as expected (xfail); false
otherwise, the note saying which failed or that none ran (the tests part was not run or
stopped before them). Paths no GPU test names (the MoE backends) are true: they have no GPU
checks, and `trained` is their evidence. `vs_torch`: over the PyTorch peer's tokens/s
measured in the same check, on the same experiment and batch.
"""

import argparse
import importlib.metadata
import json
import math
import pathlib
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
TABLE = REPO_ROOT / "layers" / "gpu_measurements.json"
LOCK = REPO_ROOT / "constraints.txt"
WHEELS = REPO_ROOT / "bench" / "gpu_wheels.sh"  # its CARRIED names: what .whl/ installs
# What a GPU run takes from the machine's own image; the rest comes from .whl/ (WHEELS).
GPU_IMAGE = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml_dtypes",
             "tensorboard", "sentencepiece", "tokenizers", "transformers", "torch", "pyarrow")
TARGET_VS_TORCH = 1.0  # GPT126M with default settings over the PyTorch peer
TARGET_LLAMA_MFU = 0.45
TARGET_FP8_SPEEDUP = 1.2
TARGET_FP8_LOSS = 0.02  # FP8's loss within 2% of bfloat16's after the same steps
# paxloom/runner/training/compile_log.py's line for a train step the restart loaded.
CACHE_LOAD = re.compile(r"compiled jit\(_train_step\) in ([\d.]+)s \(loaded from the "
                        r"persistent compilation cache")
PYTEST_TOTALS = re.compile(r"\d+ (passed|failed|errors?|skipped|deselected|xfailed)")
# pytest -v's line for a test that finished: its id, then its outcome.
PYTEST_RESULT = re.compile(r"^(tests/\S+\.py::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
PYTEST_OUTCOMES = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error",
                   "SKIPPED": "skipped", "XFAIL": "xfailed", "XPASS": "passed"}
NOT_PASSING = ("failed", "error", "xfailed")
TRAINING = re.compile(r"^training (\w+):")
STEP_LOSS = re.compile(r"^step +(\d+) \| loss ([\d.]+)")
# How XLA (and jax's allocator, and the memory check) say that a step does not fit.
OUT_OF_MEMORY = re.compile(r"RESOURCE_EXHAUSTED|out of memory", re.IGNORECASE)
# The attention implementations the GPU tests name among their parameters
# (tests/test_gpu_check.py checks that each is named there).
TESTED_PATHS = ("praxis", "xla", "cudnn", "pallas", "flash")
# The fields of a table row, in the order layers/gpu_measurements.json writes them.
TABLE_ROW_FIELDS = ("kind", "path", "max_segments", "case", "device", "jax", "date",
                    "experiment", "batch", "tokens_per_s", "mfu", "vs_torch", "peak_gib",
                    "trained", "gpu_tests_pass", "note", "command")


class Failed(Exception):
    """The part's files show a failure; the message is its key figure."""


def distribution(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def canonical(name: str) -> str:
    """PEP 503's spelling: case, and runs of - _ . alike."""
    return re.sub(r"[-_.]+", "-", name).lower()


def carried() -> list[str]:
    """The names bench/gpu_wheels.sh downloads (its CARRIED array)."""
    body = re.search(r"^CARRIED=\((.*?)^\)", WHEELS.read_text(), re.MULTILINE | re.DOTALL)
    return [word for line in body.group(1).splitlines() for word in line.split("#")[0].split()]


def locked(lock: str) -> dict[str, tuple[str, str]]:
    """The lock's text (`name==version` lines): (its spelling, version) by canonical name."""
    pins = (line.strip().partition("==") for line in lock.splitlines())
    return {canonical(name): (name, pin) for name, _, pin in pins
            if pin and not name.startswith("#")}


def against_lock(lock: str, names: list[str], version=distribution) -> list[str]:
    """A line for each of `names` not installed at the version that the lock's text `lock`
    gives it, else one line saying how many matched."""
    pins = locked(lock)
    lines = []
    for name in names:
        want, found = pins.get(canonical(name), (name, None))[1], version(name)
        if want is None:
            lines.append(f"lock: {name} is not in constraints.txt")
        elif found == "-":
            lines.append(f"lock: {name} {want}, not installed")
        elif found.split("+")[0] != want:  # a local label (torch's +cu130): the same release
            lines.append(f"lock: {name} {want}, found {found}")
    return lines or [f"lock: all {len(names)} checked packages match constraints.txt"]


def carried_pins(lock: str) -> list[str]:
    """`name==version` of each carried name, as the lock spells it (bench/gpu_wheels.sh
    downloads these); Failed names the ones the lock lacks."""
    pins = locked(lock)
    missing = [name for name in carried() if canonical(name) not in pins]
    if missing:
        raise Failed(f"gpu_wheels.sh: {', '.join(missing)} not in constraints.txt")
    return ["==".join(pins[canonical(name)]) for name in carried()]


def lock_lines() -> list[str]:
    """The machine's packages and the carried ones (installed beside them, on PYTHONPATH)
    against the lock."""
    names = list(GPU_IMAGE) + [n for n in carried() if canonical(n) not in
                               {canonical(m) for m in GPU_IMAGE}]
    return against_lock(LOCK.read_text(), names)


def versions() -> str:
    import jax
    import jaxlib

    try:  # jax has no public cuDNN version; its own cuDNN attention reads this one
        from jax._src.lib import cuda_versions

        cudnn = cuda_versions.cudnn_get_version() if cuda_versions else None
    except Exception:  # a private module: moved or broken in some jax
        cudnn = None
    driver = "-"
    if shutil.which("nvidia-smi"):
        query = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                "--format=csv,noheader"], capture_output=True, text=True)
        driver = (query.stdout.split("\n")[0].strip() or "-") if query.returncode == 0 else "-"
    devices = jax.devices()
    cudnn_text = f"{cudnn // 10000}.{cudnn % 10000 // 100}.{cudnn % 100}" if cudnn else "-"
    return (f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, cuDNN {cudnn_text}, "
            f"driver {driver}, {devices[0].device_kind} x{len(devices)}; "
            f"torch {distribution('torch')}, praxis {distribution('praxis')}, "
            f"pytest-timeout {distribution('pytest-timeout')}")


def read(out: pathlib.Path, name: str) -> str:
    path = out / name
    if not path.exists():
        raise Failed(f"no {name}")
    return path.read_text(errors="replace")


def key_install(out: pathlib.Path) -> str:
    lines = [line for line in read(out, "install.log").splitlines() if line.startswith("jax ")]
    if not lines:
        raise Failed("no versions line: jax did not start")
    return lines[-1]


def test_outcomes(out: pathlib.Path) -> dict[str, str] | None:
    """Each test the tests part finished in `out` -> passed, failed, error, skipped or
    xfailed: from its JUnit XML (tests.xml), else from pytest -v's lines in tests.log (a
    run killed before pytest wrote the XML); None when neither is there."""
    xml = out / "tests.xml"
    if xml.exists():
        try:
            root = ET.parse(xml).getroot()
        except ET.ParseError:  # cut off while written: the log still has what finished
            root = None
        if root is not None:
            outcomes = {}
            for case in root.iter("testcase"):
                if not case.get("name"):  # the test a SIGINT stopped: no outcome
                    continue
                test = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
                found = {child.tag: child for child in case}
                if "failure" in found:
                    outcomes[test] = "failed"
                elif "error" in found:
                    outcomes[test] = "error"
                elif "skipped" in found:
                    xfail = found["skipped"].get("type") == "pytest.xfail"
                    outcomes[test] = "xfailed" if xfail else "skipped"
                else:
                    outcomes[test] = "passed"
            return outcomes
    if (out / "tests.log").exists():
        return {match.group(1): PYTEST_OUTCOMES[match.group(2)]
                for line in read(out, "tests.log").splitlines()
                if (match := PYTEST_RESULT.match(line))}
    return None


def key_tests(out: pathlib.Path) -> str:
    """pytest's totals line, and the tests that did not pass by name (their reasons are in
    tests.log: -rfE --tb=line gives each one line)."""
    totals = [line.strip(" =") for line in read(out, "tests.log").splitlines()
              if PYTEST_TOTALS.search(line)]
    if not totals:
        raise Failed("no pytest totals line")
    failed = [test.split("::", 1)[1] for test, outcome in (test_outcomes(out) or {}).items()
              if outcome in ("failed", "error")]
    key = totals[-1]
    if failed:
        key += f"; failed: {', '.join(failed[:6])}{' ...' if len(failed) > 6 else ''}"
    return key


def key_default(out: pathlib.Path) -> str:
    """Each family's last logged loss, the decodes, and the restart's cache load."""
    losses, family = {}, None
    log = read(out, "default.log")
    for line in log.splitlines():
        if match := TRAINING.match(line):
            family = match.group(1)
        elif (match := STEP_LOSS.match(line)) and family:
            losses[family] = f"{family} loss {float(match.group(2)):.3f} at step {match.group(1)}"
    decodes = log.count("continuation(s) to ")
    load = CACHE_LOAD.search(read(out, "default_restart.log"))
    restart = (f"restart loaded its train step from the cache in {load.group(1)}s" if load
               else "restart did NOT load its train step from the persistent cache")
    key = f"{', '.join(losses.values()) or 'no loss logged'}; {decodes} decode(s); {restart}"
    if len(losses) < 2 or decodes < 2 or not load:
        raise Failed(key)
    return key


def rows(out: pathlib.Path, *names: str) -> list[dict]:
    """The benchmark rows of the files `names` (glob patterns) in `out`."""
    found = [row for name in names for path in sorted(out.glob(name))
             for row in json.loads(path.read_text())]
    if not found:
        raise Failed(f"no rows in {', '.join(names)}")
    return found


def label(row: dict) -> str:
    """A row's name in a key: experiment, implementation, the settings it was given."""
    settings = "".join(f" {k}={v}" for k, v in (row.get("settings") or {}).items())
    return f"{row['experiment']} {row['attention']}{settings}"


def refused(row: dict) -> bool:
    """A row that stopped with a one-line refusal (UserError: a combination that cannot run
    there, or a step that cannot fit the device), not a crash."""
    return row.get("error", "").startswith("UserError:")


def key_speed(out: pathlib.Path) -> str:
    """GPT126M's MFU and its ratio to the PyTorch peer, Llama1B's MFU: any error fails (the
    default path must train)."""
    parts, failed = [], False
    for row in rows(out, "speed.json"):
        name = row["experiment"]
        if "error" in row or "skipped" in row:
            failed = True
            parts.append(f"{name} {row['attention']}: {row.get('error') or row['skipped']}")
        elif row["attention"] != "torch":
            text = f"{name} {row['mfu']:.1%} MFU" if row.get("mfu") else f"{name} no MFU"
            if row.get("resolved"):
                text += f" ({row['resolved']})"
            if row.get("vs_torch"):
                text += f", x{row['vs_torch']:.2f} torch (target {TARGET_VS_TORCH:.1f})"
            elif name == "Synthetic126M":  # the comparison is what this row is for
                failed = True
                text += ", no PyTorch peer row (is torch installed?)"
            if name == "Llama1B":
                text += f" (target {TARGET_LLAMA_MFU:.0%})"
            parts.append(text)
    if failed:
        raise Failed("; ".join(parts))
    return "; ".join(parts)


def summary(row: dict, name: str) -> tuple[str, bool]:
    """A row's key text (its MFU and peak, or its error) and whether it failed: an error
    that is not a refusal in one line."""
    if "error" in row or "skipped" in row:
        return f"{name}: {row.get('error') or row['skipped']}", not refused(row)
    text = f"{name} {row['mfu']:.1%} MFU" if row.get("mfu") else f"{name} no MFU"
    if row.get("peak_memory_gib"):
        text += f", peak {row['peak_memory_gib']:.1f} GiB"
    return text, False


def key_candidates(out: pathlib.Path, pattern: str = "candidates_*.json") -> str:
    """Each candidate row's MFU and peak, or its error. A candidate that is refused (it
    cannot fit the device, or cannot run there) is a finding, recorded in the table as not
    trained; any other error, or no row at all, fails the part."""
    parts, failed = [], False
    for row in rows(out, pattern):
        text, row_failed = summary(row, label(row))
        parts.append(text)
        failed = failed or row_failed
    if failed:
        raise Failed("; ".join(parts))
    return "; ".join(parts)


def key_more(out: pathlib.Path) -> str:
    return key_candidates(out, "more_*.json")


def key_layouts(out: pathlib.Path) -> str:
    return key_candidates(out, "layouts_*.json")


def key_moe(out: pathlib.Path) -> str:
    """Each row's MFU (on a token's active parameters) and peak memory, and each backend's
    Qwen3A3B row's tokens/s over its dense peer's (no target: the first figures are the finding). A row
    refused in one line (tokamax on a jax it does not support, a step that cannot fit the
    device) is reported, not a failure; any other error fails the part."""
    parts, done, failed = [], {}, False
    for row in rows(out, "moe.json"):
        name = row["experiment"]
        text, row_failed = summary(row, name)
        failed = failed or row_failed
        if "error" not in row and "skipped" not in row:
            done[name] = (len(parts), row)
        parts.append(text)
    if "Qwen3A3B_dense" in done:  # each backend of the same MoE against the dense peer
        dense = done["Qwen3A3B_dense"][1]
        for name in ("Qwen3A3B_tokamax", "Qwen3A3B_padded", "Qwen3A3B_moe"):
            if name in done:
                index, moe = done[name]
                parts[index] += (f", x{moe['tokens_per_s'] / dense['tokens_per_s']:.2f} dense "
                                 f"tokens/s")
    if failed:
        raise Failed("; ".join(parts))
    return "; ".join(parts)


def key_fp8(out: pathlib.Path) -> str:
    found = rows(out, "fp8.json")
    errors = [f"{r['experiment']}{' fp8' if r.get('fp8') else ''}: {r['error']}"
              for r in found if "error" in r]
    if errors:
        raise Failed("; ".join(errors))
    base = next((r for r in found if not r.get("fp8")), None)
    fp8 = next((r for r in found if r.get("fp8") and "vs_bf16" in r), None)
    if base is None or fp8 is None:
        raise Failed("no FP8 row after its bfloat16 row")
    loss = fp8["loss_delta"] / base["last_loss"]
    gemms = f"{fp8['fp8_gemms']}/{fp8['cublas_gemms']}" if "cublas_gemms" in fp8 else "-"
    return (f"FP8 x{fp8['vs_bf16']:.2f} bf16 (target {TARGET_FP8_SPEEDUP}); loss after "
            f"{fp8['steps_run']} steps {fp8['last_loss']:.4f} vs {base['last_loss']:.4f} "
            f"({loss:+.2%}, target within {TARGET_FP8_LOSS:.0%}); f8 GEMMs {gemms}")


def key_long(out: pathlib.Path) -> str:
    """The longest sequence that trained, with its speed and memory; the rows after it may
    run out of memory (that ends the search), but any other error fails the part, as does
    no row trained."""
    parts, longest, failed = [], None, False
    for row in rows(out, "long.json"):
        if "error" not in row and "skipped" not in row:
            longest = row
            parts.append(f"{row['seq_len']:,} tokens: {row['tokens_per_s']:,.0f} tokens/s, "
                         f"{row['mfu']:.1%} MFU, peak {row['peak_memory_gib']:.1f} GiB")
        elif longest is not None and OUT_OF_MEMORY.search(row.get("error", "")):
            parts.append(f"{row['experiment']}: out of memory")
        else:
            failed = True
            parts.append(f"{row['experiment']}: {row.get('error') or row['skipped']}")
    key = f"longest {longest['seq_len']:,} tokens; " if longest else "no length trained; "
    if failed or longest is None:
        raise Failed(key + "; ".join(parts))
    return key + "; ".join(parts)


KEYS = {"install": key_install, "speed": key_speed, "candidates": key_candidates,
        "layouts": key_layouts, "tests": key_tests, "moe": key_moe, "fp8": key_fp8, "default": key_default,
        "more": key_more, "long": key_long}


# ----- rows of the table of GPU-measured paths --------------------------------------------


class Skip(Exception):
    """A benchmark row that is no row of the table; the message says why."""


def bench_rows(out: pathlib.Path) -> list[dict]:
    """Every gpu_bench row in `out`: each JSON file that holds a list of them, in the order
    of the parts that write them (by name)."""
    def order(path):
        return (next((i for i, part in enumerate(KEYS) if path.stem.startswith(part)),
                     len(KEYS)), path.name)

    found = []
    for path in sorted(out.glob("*.json"), key=order):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, list) and all(isinstance(r, dict) and "experiment" in r
                                          and "attention" in r for r in data):
            found += data
    return found


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def parameters(test: str) -> list[str]:
    """The parameters of a test's id: test_x[mha-packed-cudnn-bfloat16] -> mha, packed, ..."""
    match = re.search(r"\[(.+)\]$", test)
    return match.group(1).split("-") if match else []


def tests_verdict(kind: str, path: str, outcomes: dict[str, str] | None) -> tuple[bool, str]:
    """(gpu_tests_pass, a note or ''): the module docstring's rule."""
    if kind != "attention" or path not in TESTED_PATHS:
        return True, ""
    if outcomes is None:
        return False, "its GPU tests did not run in this check (no tests.xml or tests.log)"
    mine = {test: outcome for test, outcome in outcomes.items() if path in parameters(test)}
    bad = [f"{test.split('::', 1)[1]} ({outcome})" for test, outcome in mine.items()
           if outcome in NOT_PASSING]
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        return False, f"its GPU tests did not pass: {', '.join(bad[:3])}{more}"
    if "passed" not in mine.values():
        return False, ("none of its GPU tests ran in this check (the tests part stopped "
                       "before them)")
    return True, ""


def table_row(bench: dict, outcomes: dict[str, str] | None, peers: dict) -> dict:
    """The table row of one gpu_bench row (Skip if it is none); fields the benchmark row
    lacks stay out, so that check_row refuses the row."""
    error = bench.get("error", "")
    if bench["attention"] == "torch":
        raise Skip("the PyTorch peer")
    if bench.get("fp8"):
        raise Skip("an FP8 row (the table has no FP8 case)")
    if bench.get("tiny"):
        raise Skip("tiny shapes")
    if "resolved" not in bench:
        raise Skip(f"it says nothing of what it ran ({error or 'an older gpu_bench row'})")
    if bench.get("platform", "gpu") != "gpu":
        raise Skip(f"not on a GPU ({bench.get('platform')})")
    if error.startswith("timed out"):
        raise Skip(f"{error} in the check: it measured nothing of the path")
    if bench.get("num_experts"):
        from layers.moe import BACKENDS

        kind, path = "moe", bench.get("moe_backend")
        if path not in BACKENDS:
            raise Skip(f"its mixture ({path}) is no MOE_BACKEND the table chooses among")
    else:
        kind, path = "attention", bench["resolved"]
    row = {"kind": kind, "path": path}
    if kind == "attention" and path == "cudnn" and bench.get("packed") and bench.get(
            "max_segments"):
        row["max_segments"] = bench["max_segments"]  # the width of cuDNN's packed layout
    row["case"] = {"packed": bench.get("packed"), "grouped_kv": bench.get("grouped_kv"),
                   "dtype": bench.get("fprop_dtype"), "context": bench.get("context"),
                   "hopper": bench.get("hopper")}
    row.update({k: bench[k] for k in ("device", "jax", "date", "experiment") if k in bench})
    if "global_batch" in bench and "seq_len" in bench:
        row["batch"] = f"{bench['global_batch']}x{bench['seq_len']}"
    trained = not error and finite(bench.get("loss")) and finite(bench.get("last_loss"))
    if trained:
        row["tokens_per_s"] = round(bench["tokens_per_s"])
        if bench.get("mfu"):
            row["mfu"] = round(bench["mfu"], 3)
        peer = peers.get((bench["experiment"], bench.get("global_batch"),
                          bench.get("seq_len"), bench.get("device")))
        if bench.get("vs_torch"):
            row["vs_torch"] = round(bench["vs_torch"], 2)
        elif peer:
            row["vs_torch"] = round(bench["tokens_per_s"] / bench.get("devices", 1) / peer, 2)
        if bench.get("peak_memory_gib"):
            row["peak_gib"] = round(bench["peak_memory_gib"], 1)
    row["trained"] = trained
    row["gpu_tests_pass"], tests_note = tests_verdict(kind, path, outcomes)
    notes = [error or ("" if trained else "a non-finite loss"), tests_note]
    if any(notes):
        row["note"] = "; ".join(n for n in notes if n)
    if "command" in bench:
        row["command"] = bench["command"]
    return row


def table_rows(outs: list[pathlib.Path], skipped: list[str] | None = None) -> list[dict]:
    """The table rows of the check's results in `outs` (module docstring); each benchmark
    row that is none goes to `skipped` with the reason."""
    benches, outcomes = [], None
    for out in outs:
        if not out.is_dir():
            raise Failed(f"{out} is not a directory")
        benches += bench_rows(out)
        found = test_outcomes(out)
        if found is not None:
            outcomes = {**(outcomes or {}), **found}
    # The PyTorch peer's tokens/s per (experiment, batch, sequence, device).
    peers = {(b["experiment"], b.get("global_batch"), b.get("seq_len"), b.get("device")):
             b["tokens_per_s"] for b in benches
             if b["attention"] == "torch" and "error" not in b and b.get("tokens_per_s")}
    found = []
    for bench in benches:
        try:
            found.append(table_row(bench, outcomes, peers))
        except Skip as reason:
            if skipped is not None:
                skipped.append(f"{label(bench)}: {reason}")
    return found


def check_table_row(row: dict) -> None:
    """ValueError (one line) for a row the table must not take: layers/measured.py's check,
    then its fields' values."""
    from layers import attention, measured, moe

    measured.check_row(row, "a new row")
    paths = {"attention": attention.IMPLS, "moe": moe.BACKENDS}[row["kind"]]
    if row["path"] not in paths or row["path"] == "auto":
        raise ValueError(f"a new row: path {row['path']!r} is not a {row['kind']} path: {row}")
    unknown = [k for k in row if k not in TABLE_ROW_FIELDS]
    if unknown:
        raise ValueError(f"a new row: unknown field {unknown[0]!r}: {row}")
    wrong = [f"case.{k}" for k, v in row["case"].items()
             if not isinstance(v, str if k == "dtype" else bool)]
    wrong += [k for k in ("trained", "gpu_tests_pass") if not isinstance(row[k], bool)]
    wrong += [k for k in ("device", "jax", "date", "experiment", "batch", "command")
              if not isinstance(row[k], str) or not row[k]]
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(row["date"])):
        wrong.append("date")
    if wrong:
        raise ValueError(f"a new row: malformed {', '.join(wrong)}: {row}")


def format_row(row: dict) -> str:
    """One row as layers/gpu_measurements.json writes them: what it is, its case, where and
    when, its figures, then its note and command, each on a line of its own."""
    def fields(*names):
        return ", ".join(f"{json.dumps(k)}: {json.dumps(row[k])}" for k in names if k in row)

    lines = [fields("kind", "path", "max_segments"), fields("case"),
             fields("device", "jax", "date"),
             fields("experiment", "batch", "tokens_per_s", "mfu", "vs_torch", "peak_gib",
                    "trained", "gpu_tests_pass"),
             fields("note"), fields("command")]
    lines = [line for line in lines if line]
    return "  {" + ",\n   ".join(lines) + "}"


def record(outs: list[pathlib.Path], table: pathlib.Path = TABLE,
           skipped: list[str] | None = None) -> str:
    """Append the check's rows to `table`, keeping its text; ValueError (nothing written)
    when a row is malformed. Returns what it did, in one line; the benchmark rows that are
    no table rows go to `skipped`, with the reason."""
    skipped = [] if skipped is None else skipped
    new = table_rows(outs, skipped)
    for row in new:
        check_table_row(row)
    text = table.read_text()
    existing = json.loads(text)

    def key(row):
        return row.get("command"), row.get("device"), row.get("date"), row.get("path")

    seen = {key(row) for row in existing}
    added = []
    for row in new:
        if key(row) not in seen:
            seen.add(key(row))
            added.append(row)
    if added:
        body = text.rstrip()
        if not body.endswith("]"):
            raise ValueError(f"{table}: does not end with ']'")
        body = body[:-1].rstrip()
        separator = "\n" if body.endswith("[") else ",\n"
        text = body + separator + ",\n".join(format_row(row) for row in added) + "\n]\n"
        from layers import measured

        for row in json.loads(text):  # the whole table, as layers/measured.py will read it
            measured.check_row(row, str(table))
        table.write_text(text)
    return (f"added {len(added)} row(s) to {table}; {len(new) - len(added)} already there; "
            f"{len(skipped)} benchmark row(s) are no table rows")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("versions", help="the packages against the lock; jax, jaxlib, cuDNN, "
                        "driver, devices")
    commands.add_parser("pins", help="name==version of each wheel bench/gpu_wheels.sh carries")
    key = commands.add_parser("key", help="a part's key figure from its files in OUT")
    key.add_argument("part", choices=KEYS)
    key.add_argument("out", type=pathlib.Path)
    for name, text in (("rows", "the check's rows of layers/gpu_measurements.json"),
                       ("record", "append the check's rows to layers/gpu_measurements.json")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("outs", type=pathlib.Path, nargs="+", metavar="OUT",
                         help="the check's $OUT folders (runs/gpu_check unless $OUT was set)")
        if name == "record":
            sub.add_argument("--table", type=pathlib.Path, default=TABLE,
                             help="the table to append to (default: %(default)s)")
    args = parser.parse_args()
    if args.command == "versions":
        # The lock first: it needs no jax, so it is there even where jax does not start.
        print("\n".join(lock_lines()), flush=True)
        print(versions())
        return 0
    skipped: list[str] = []
    try:
        if args.command == "rows":
            found = table_rows(args.outs, skipped)
            if found:  # as record appends them: pasted before the table's "]", they fit
                print(",\n".join(format_row(row) for row in found))
        elif args.command == "record":
            print(record(args.outs, args.table, skipped))
        elif args.command == "pins":
            print(" ".join(carried_pins(LOCK.read_text())))
        else:
            print(KEYS[args.part](args.out))
    except Failed as failure:
        print(failure)
        return 1
    except ValueError as e:  # a malformed row: nothing was written
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        for line in skipped:
            print(f"not a table row: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
