"""Fit the step-time estimate's constants on runs measured on a GPU, and check them.

    python -m paxloom.tools.fit_step_time            # plan, fit, print the comparison
    python -m paxloom.tools.fit_step_time --check    # and exit 1 where the check fails

Each run of RUNS is read from layers/gpu_measurements.json (its tokens/s, by experiment,
batch, device, date and a piece of its bench/gpu_bench.py command), planned by XLA:GPU for
one GPU of its kind, as `--mode=plan` would (paxloom/runner/planning/plan.py), and estimated
with every term of paxloom/runner/planning/step_time.py. The constants of the efficiency
curve eff(D, M) (e_max, h, m) and the share of recomputed FLOPs' time a step pays are
solved so that the runs marked "fit" come out as measured: three step times, and the
difference between two remat policies of one model (recomputed FLOPs against saved
activations). The runs marked "check" are held out. The A100's scale is then solved so that
the analytic estimate of Pax's published GPT126M run (efficiency.PAX_A100_RUNS) matches it.

Prints each run, measured against estimated by the constants efficiency.py records and by
the fit, the measured and estimated order within each group (one model, one device, one
thing varied), and the recorded constants beside the fit. `--check` exits 1 when a recorded
constant is off the fit by more than its rounding, when an estimated order differs from
the measured, when the estimate of a group's fastest run is more than 20% off its measured
step time, or when a published Pax run is estimated more than 25% off. To calibrate for your
own GPU: record its runs (bench/gpu_check_figures.py record), add them to RUNS, and write
the printed constants into efficiency.py.
"""

import dataclasses
import math
import sys

from absl import flags

import experiments
from layers import measured as measured_table
from paxloom.core.errors import UserError
from paxloom.launch import layouts, plan_cache, plan_search, resolve
from paxloom.runner.planning import efficiency, gpu_target, step_time
from paxloom.runner.planning import plan as planning
from paxloom.tools import cli

FLAGS = flags.FLAGS
flags.DEFINE_bool("check", False, "Exit 1 when the recorded constants fail the check.")


@dataclasses.dataclass(frozen=True)
class Run:
    """One measured run: which row of the table, how to plan it, and its part in the fit."""

    group: str  # runs of one group differ in one thing; their order is checked
    experiment: str
    batch: int  # PERCORE_BATCH_SIZE, one device
    command: str  # a piece of the row's bench/gpu_bench.py command that picks it
    role: str  # "fit" or "check"
    overrides: tuple[tuple[str, object], ...] = ()
    device: str = "h200"
    date: str = "2026-11-27"

    @property
    def label(self) -> str:
        varied = " ".join(f"{k}={v}" for k, v in self.overrides) or "defaults"
        return f"{self.experiment} batch {self.batch} {varied}"


_BY_BATCH = "Synthetic126M by batch"
_BY_POLICY = "Llama1B by CHECKPOINT_POLICY"
RUNS = (
    Run(_BY_BATCH, "Synthetic126M", 4, "--set PERCORE_BATCH_SIZE=4", "fit"),
    Run(_BY_BATCH, "Synthetic126M", 8, "--set PERCORE_BATCH_SIZE=8", "check"),
    Run(_BY_BATCH, "Synthetic126M", 16, "--set PERCORE_BATCH_SIZE=16", "fit"),
    Run("GPT1_3B", "GPT1_3B", 4, "--set MAX_SEGMENTS_PER_SEQ=32", "fit"),
    Run(_BY_POLICY, "Llama1B", 8, "--set CHECKPOINT_POLICY=save_nothing", "fit",
        (("CHECKPOINT_POLICY", "save_nothing"),)),
    Run(_BY_POLICY, "Llama1B", 8, "--set CHECKPOINT_POLICY=none", "check",
        (("CHECKPOINT_POLICY", "none"),)),
    Run(_BY_POLICY, "Llama1B", 8, "--set CHECKPOINT_POLICY=save_dot_with_no_batch_dims", "fit",
        (("CHECKPOINT_POLICY", "save_dot_with_no_batch_dims"),)),
)
# The two runs whose difference fits the recomputation share.
POLICY_PAIR = (RUNS[4], RUNS[6])
TABLE = "layers/gpu_measurements.json"
BEST_WITHIN = 0.20
PUBLISHED_WITHIN = 0.25


def measured_tokens_per_s(run: Run, table) -> float:
    """The run's tokens/s, from the one row of the table that matches it."""
    gpu = planning.DEVICE_KINDS[run.device].chip
    found = [row for row in table
             if row.get("experiment") == run.experiment and row.get("batch") == f"{run.batch}x2048"
             and gpu in row.get("device", "") and row.get("date") == run.date
             and run.command in row.get("command", "") and row.get("tokens_per_s")]
    if len(found) != 1:
        raise UserError(f"{TABLE}: {len(found)} rows match {run.label} on {run.date} "
                        f"(command with {run.command!r}); one is needed")
    return float(found[0]["tokens_per_s"])


def plan_run(run: Run) -> tuple[planning.Plan, int]:
    """(the run's plan, compiled by XLA:GPU for one GPU of its kind, the model's width);
    from the plan cache when compiled before."""
    cls = experiments.resolve(f"experiments.{run.experiment}")
    hyperparameters = {**cls().hyperparameters(), "ICI_MESH_SHAPE": [1, 1, 1],
                       "DCN_MESH_SHAPE": [1, 1, 1], "PERCORE_BATCH_SIZE": run.batch,
                       **dict(run.overrides)}
    exp = cls(**hyperparameters)
    key = plan_search.cache_key(exp, hyperparameters, {}, run.device, 0.0, "gpu")
    found = plan_cache.get(key)
    if found is None:
        found = plan_search.plan_one(cls, hyperparameters, resolve.Selection(), {},
                                     planning.target_device(run.device), run.device, "gpu", 0.0)
        if isinstance(found, str):
            raise UserError(f"{run.label}: {found}")
        plan_cache.put(key, found)
    return found, exp.MODEL_DIMS


def with_constants(c: efficiency.Calibration, e_max, half_width, half_rows, share,
                   scale=None) -> efficiency.Calibration:
    return dataclasses.replace(c, e_max=e_max, half_width=half_width, half_rows=half_rows,
                               recompute_share=share,
                               device_scale=c.device_scale if scale is None else scale)


def fit(planned: dict[Run, tuple], measured: dict[Run, float]) -> tuple[float, ...]:
    """(e_max, h, m, recompute share) that reproduce the fit runs (module docstring)."""
    from scipy.optimize import least_squares

    base = efficiency.calibration("h200")

    def step(run, x):
        p, dims = planned[run]
        return step_time.from_plan(p, run.device, dims, with_constants(base, *x)).step_s

    def measured_step(run):
        p, _ = planned[run]
        return p.tokens_per_step / measured[run]

    times = [r for r in RUNS if r.role == "fit" and r not in POLICY_PAIR]
    first, second = POLICY_PAIR

    def residuals(x):
        found = [math.log(step(r, x) / measured_step(r)) for r in times]
        difference = step(first, x) - step(second, x)
        found.append((difference - (measured_step(first) - measured_step(second)))
                     / measured_step(second))
        return found

    start = (base.e_max, base.half_width, base.half_rows, base.recompute_share)
    solution = least_squares(residuals, start, bounds=([0.1, 0, 0, 0], [2, 1e5, 1e5, 2]))
    return tuple(float(v) for v in solution.x)


def published_sequences_per_s(run: efficiency.PublishedRun,
                              calibration: efficiency.Calibration) -> float:
    """The analytic estimate of a published run's layout (paxloom/launch/layouts.py)."""
    layout = layouts.Layout(run.ici, run.dcn, run.checkpoint_policy,
                            percore_batch_size=run.percore_batch_size)
    exp = experiments.resolve(run.experiment)(**layout.overrides())
    _, estimate = layouts.analytic(exp, layout, "a100-80gb", calibration)
    return estimate.tokens_per_s / exp.MAX_SEQ_LEN


def a100_scale(calibration: efficiency.Calibration) -> float:
    """The scale at which Pax's GPT126M run is estimated as published (bisection: the
    estimate rises with the scale)."""
    fitted = efficiency.PAX_A100_RUNS[0]
    low, high = 0.1, 2.0
    for _ in range(60):
        middle = (low + high) / 2
        c = dataclasses.replace(calibration, device_scale=middle)
        if published_sequences_per_s(fitted, c) < fitted.sequences_per_s:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def report(planned, measured, fitted: tuple[float, ...], scale: float) -> tuple[list[str], bool]:
    """The comparison as lines, and whether the recorded constants pass the check."""
    recorded = efficiency.calibration("h200")
    fitted_calibration = with_constants(recorded, *fitted)
    passed = True
    lines = [f"Runs ({TABLE}), planned by XLA:GPU for one GPU, estimated by step_time.py",
             f"  {'run':<58} {'role':<5} {'measured':>9} {'recorded':>9} {'fit':>9}  tokens/s"]
    steps = {}
    for run in RUNS:
        p, dims = planned[run]
        recorded_estimate = step_time.from_plan(p, run.device, dims)
        fit_estimate = step_time.from_plan(p, run.device, dims, fitted_calibration)
        steps[run] = recorded_estimate.step_s
        lines.append(f"  {run.label:<58} {run.role:<5} {measured[run]:>9,.0f} "
                     f"{recorded_estimate.tokens_per_s:>9,.0f} {fit_estimate.tokens_per_s:>9,.0f}"
                     f"  ({recorded_estimate.tokens_per_s / measured[run] - 1:+.1%})")
    lines += ["", "Order within each group, fastest first (recorded constants)"]
    for group in dict.fromkeys(r.group for r in RUNS):
        runs = [r for r in RUNS if r.group == group]
        if len(runs) < 2:
            continue
        by_measured = sorted(runs, key=lambda r: -measured[r])
        by_estimate = sorted(runs, key=lambda r: -planned[r][0].tokens_per_step / steps[r])
        same = by_measured == by_estimate
        best = by_measured[0]
        measured_step = planned[best][0].tokens_per_step / measured[best]
        off = steps[best] / measured_step - 1
        passed &= same and abs(off) <= BEST_WITHIN
        lines += [f"  {group}:",
                  f"    measured  {' > '.join(short(r) for r in by_measured)}",
                  f"    estimated {' > '.join(short(r) for r in by_estimate)}"
                  f"  {'the same' if same else 'DIFFERENT'}",
                  f"    the fastest's step time: estimated {steps[best]:.4g} s, measured "
                  f"{measured_step:.4g} s ({off:+.1%}; within {BEST_WITHIN:.0%}: "
                  f"{'yes' if abs(off) <= BEST_WITHIN else 'NO'})"]
    names = ("e_max", "h", "m", "recompute share")
    tolerances = (0.005, 0.01, 0.01, 0.05)  # relative: the rounding efficiency.py records
    values = (recorded.e_max, recorded.half_width, recorded.half_rows, recorded.recompute_share)
    lines += ["", "Constants (efficiency.py against the fit)"]
    for name, value, found, tolerance in zip(names, values, fitted, tolerances, strict=True):
        ok = abs(value / found - 1) <= tolerance
        passed &= ok
        lines.append(f"  {name:<16} {value:>10.4g} {found:>10.4g}  {'' if ok else 'DIFFERENT'}")
    a100 = efficiency.calibration("a100-80gb")
    ok = abs(a100.device_scale - scale) <= 0.01
    passed &= ok
    lines.append(f"  {'A100 scale':<16} {a100.device_scale:>10.4g} {scale:>10.4g}  "
                 f"{'' if ok else 'DIFFERENT'}")
    lines += ["", f"Pax's published A100 runs ({efficiency.PAX_A100_SOURCE}), sequences/s, "
                  f"analytic estimate with the recorded constants"]
    for run in efficiency.PAX_A100_RUNS:
        estimated = published_sequences_per_s(run, a100)
        off = estimated / run.sequences_per_s - 1
        passed &= abs(off) <= PUBLISHED_WITHIN
        lines.append(f"  {run.name:<5} published {run.sequences_per_s:>8.1f} estimated "
                     f"{estimated:>8.1f} ({off:+.1%})")
    lines += ["", f"check: {'passed' if passed else 'FAILED'}"]
    return lines, passed


def short(run: Run) -> str:
    return " ".join(f"{v}" for _, v in run.overrides) or f"batch {run.batch}"


def main(argv: list[str]) -> None:
    cli.parse_flags(argv)
    if not gpu_target.installed():
        raise UserError(f"XLA:GPU's plugin is not installed (`make install` puts it in "
                        f"{gpu_target.plugin_dir()}); the runs are planned with it")
    planning.start(1, "gpu")
    table = measured_table.rows()  # read and checked once, as 'auto' reads it
    measured = {run: measured_tokens_per_s(run, table) for run in RUNS}
    planned = {}
    for run in RUNS:
        print(f"planning {run.label} ...", file=sys.stderr, flush=True)
        planned[run] = plan_run(run)
    fitted = fit(planned, measured)
    scale = a100_scale(with_constants(efficiency.calibration("a100-80gb"), *fitted))
    lines, passed = report(planned, measured, fitted, scale)
    print("\n".join(lines))
    if FLAGS.check and not passed:
        sys.exit(1)


if __name__ == "__main__":
    cli.run(main)
