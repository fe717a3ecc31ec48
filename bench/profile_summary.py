"""A compact per-kernel summary of a jax profile: {HLO instruction: seconds a step}.

    python bench/profile_summary.py TRACE_DIR --steps 3 > summary.json

Reads the Perfetto trace that `jax.profiler.trace(DIR, create_perfetto_trace=True)`
writes (DIR/plugins/profile/*/perfetto_trace.json.gz). Each kernel XLA launches is an event
whose `hlo_op` argument names the HLO instruction it runs (on a GPU, on the device's rows;
on a CPU, on the host's); their durations are summed per instruction of the modules whose
name holds `--module` (the train step's) and divided by the steps traced. The result, a few
kB for a whole train step, is what bench/step_account.py --profile sets beside the
roofline of each kernel.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import sys


def summarize(trace_dir: str, steps: int, module: str = "train_step") -> dict[str, float]:
    paths = sorted(glob.glob(os.path.join(trace_dir, "**", "*perfetto_trace.json.gz"),
                             recursive=True))
    if not paths:
        raise FileNotFoundError(f"{trace_dir}: no perfetto_trace.json.gz under it (trace with "
                                f"jax.profiler.trace(DIR, create_perfetto_trace=True))")
    with gzip.open(paths[-1]) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    processes = {e["pid"]: e.get("args", {}).get("name", "") for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    on_device = any(name.startswith("/device:") for name in processes.values())
    seconds = collections.defaultdict(float)
    for e in events:
        args = e.get("args") or {}
        if e.get("ph") != "X" or "hlo_op" not in args or module not in args.get("hlo_module", ""):
            continue
        if on_device and not processes.get(e["pid"], "").startswith("/device:"):
            continue  # the host's launch records of device kernels
        seconds[args["hlo_op"]] += e.get("dur", 0) * 1e-6 / steps  # microseconds
    return dict(sorted(seconds.items(), key=lambda item: -item[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace_dir")
    parser.add_argument("--steps", type=int, required=True, help="steps the trace holds")
    parser.add_argument("--module", default="train_step")
    args = parser.parse_args()
    try:
        print(json.dumps(summarize(args.trace_dir, args.steps, args.module), indent=0))
    except FileNotFoundError as error:
        print(f"profile_summary: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
