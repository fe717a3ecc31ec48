"""Where a train step's time goes, from XLA:GPU's compile of it, on a machine without a GPU.

    python bench/step_account.py --fdl_config=experiments.Synthetic126M \\
        --fdl.ICI_MESH_SHAPE=[1,1,1] --fdl.PERCORE_BATCH_SIZE=8 --device=h200

The experiment and its overrides as main.py takes them, and --device (h100, h200, a100-80gb,
a100-40gb): the step is compiled as `main.py --mode=plan --plan_compiler=gpu` compiles it,
with the XLA flags the GPU launchers set, and read kernel by kernel
(paxloom/runner/planning/step_account.py): each group's FLOPs, HBM bytes and roofline
milliseconds, their sum, and the step time measured on that GPU where
layers/gpu_measurements.json has a run of the same experiment, batch and attention path
(--measured_ms gives another). --profile=FILE reads what a GPU measured
kernel by kernel: bench/gpu_bench.py's JSON with `--profile_steps` (the row of this
experiment) or bench/profile_summary.py's output (kernel -> seconds a step), and sets each
group's measured time beside its roofline.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from paxloom.core.errors import UserError  # noqa: E402


def measured_step(exp, p, path: str) -> tuple[float, str]:
    """(seconds, its source) of the newest measured run of this experiment, batch, GPU and
    attention path in the table of GPU measurements; (0, "") without one."""
    from layers import measured
    from paxloom.runner.planning.plan import DEVICE_KINDS

    chip = DEVICE_KINDS[p.device].chip
    batch = f"{p.global_batch}x{p.seq_len}"
    rows = [r for r in measured.rows() if r.get("experiment") == type(exp).__name__
            and r.get("batch") == batch and chip in r.get("device", "")
            and r.get("tokens_per_s") and r.get("trained")
            and r["case"]["packed"] == exp.PACKED_INPUT
            and r.get("path") == path
            and r.get("max_segments", exp.MAX_SEGMENTS_PER_SEQ) == exp.MAX_SEGMENTS_PER_SEQ]
    if not rows:
        return 0.0, ""
    row = max(reversed(rows), key=lambda r: r["date"])  # the newest; of a day's, the last
    tokens = p.global_batch * p.seq_len
    return tokens / row["tokens_per_s"], (f"{row['tokens_per_s']:,} tokens/s on "
                                          f"{row['device']}, jax {row['jax']}, {row['date']}: "
                                          f"{row['command']}")


def read_profile(path: str, experiment: str) -> dict[str, float]:
    """{kernel: seconds a step} from a profile summary or a gpu_bench JSON's row."""
    if not Path(path).is_file():
        raise UserError(f"--profile={path}: no such file (bench/gpu_bench.py --json's file, or "
                        f"bench/profile_summary.py's output)")
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict):
        return data
    for row in data:
        if row.get("experiment") == experiment and "profile" in row:
            return row["profile"]
    raise UserError(f"--profile={path}: no row of {experiment} with a profile "
                    f"(bench/gpu_bench.py --profile_steps N records one)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="h200")
    parser.add_argument("--measured_ms", type=float, default=0.0)
    parser.add_argument("--profile", help="a GPU profile summary (JSON)")
    parser.add_argument("--top", type=int, default=15, help="heaviest kernels to list")
    options, rest = parser.parse_known_args(argv[1:])

    from experiments import overrides
    from paxloom.launch import flags as launch_flags
    from paxloom.launch import plan, resolve
    from paxloom.runner.planning import plan as planning
    from paxloom.runner.planning.plan import target_device

    flags, hyperparameters, graph = overrides.split([argv[0], *rest])
    launch_flags.parse([*flags, f"--plan_device={options.device}"])
    exp, selection = resolve.experiment(resolve.Selection(
        fdl_config=launch_flags.FLAGS.fdl_config, mode="plan"), hyperparameters)
    profile = read_profile(options.profile, type(exp).__name__) if options.profile else None
    target = target_device(options.device)
    compiler = plan.start(exp, "gpu")
    config = resolve.run_graph(exp, selection, graph, target)
    p = plan.plan(exp, config, compiler=compiler, device=options.device)
    template = planning.fused_attention_template(config)
    path = template.attention_impl if template is not None else exp.ATTENTION_IMPL
    measured_s, source = ((options.measured_ms / 1e3, "--measured_ms") if options.measured_ms
                          else measured_step(exp, p, path))
    print(f"{type(exp).__name__}: batch {p.global_batch} x {p.seq_len} tokens, mesh "
          f"{p.mesh_shape}, ATTENTION_IMPL={exp.ATTENTION_IMPL}")
    print("\n".join(plan.account_lines(p, options.top, measured_s, source, profile)))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except UserError as error:
        print(f"step_account: error: {error}", file=sys.stderr)
        sys.exit(2)
