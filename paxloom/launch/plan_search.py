"""`main.py --mode=plan --plan_search`: the layouts of an experiment on N nodes, ranked.

1. Every layout paxloom/launch/layouts.py enumerates gets an analytic estimate (memory per
   device, step time), from hyperparameters alone; those whose state and half their
   activations already exceed the GPU's memory are left out, with the reason counted.
2. The best `top_k` by that estimate are picked, diverse: the best pipelined, expert-parallel
   and tensor-parallel layouts and the best of each remat policy among them, where the
   experiment allows them.
3. Each is compiled by the planner (paxloom/runner/planning/plan.py), in a pool of
   `workers` processes (in this process with 1), or read from the cache of earlier
   searches (paxloom/launch/plan_cache.py).
4. Each compiled plan gets the time model's estimate (paxloom/runner/planning/step_time.py):
   layouts that fit first, fastest first; then those that do not fit; then those that
   could not be planned.
"""

import concurrent.futures
import dataclasses
import math
import multiprocessing
import os
import time

from paxloom.core.errors import UserError
from paxloom.launch import layouts as layouts_lib
from paxloom.launch import plan_cache
from paxloom.runner.planning import efficiency, links, step_time
from paxloom.runner.planning import plan as planning
from paxloom.runner.planning.plan import DEVICE_KINDS, GiB, memory_budget

# Of each layout's analytic activations, the share the pruning rule counts: the compile is
# the judge, so only layouts far over the budget are left out before it.
PRUNE_ACTIVATION_SHARE = 0.5


@dataclasses.dataclass
class Row:
    """One layout: its analytic estimate, and once compiled its plan and estimate (or why it
    could not be planned)."""

    layout: layouts_lib.Layout
    analytic_bytes: float
    analytic: step_time.Estimate
    plan: planning.Plan | None = None
    estimate: step_time.Estimate | None = None
    error: str | None = None
    cached: bool = False
    fits: bool = False

    @property
    def peak(self) -> float | None:
        return None if self.plan is None else self.plan.memory.peak


@dataclasses.dataclass
class SearchResult:
    experiment: str
    device: str
    compiler: str
    nodes: int
    gpus_per_node: int
    global_batch: int
    seq_len: int
    budget: int
    rows: list[Row]  # the compiled layouts, ranked
    enumerated: int
    pruned: dict[str, int]
    analytic_fits: int  # layouts whose analytic memory fits
    seconds: float
    compile_seconds: float

    @property
    def best(self) -> Row | None:
        return self.rows[0] if self.rows and self.rows[0].plan is not None else None


def _sort_key(row: Row):
    if row.plan is None:
        return (2, 0.0)
    return (0 if row.fits else 1, row.estimate.step_s)


def _analytic_key(row: Row, budget: int):
    return (0 if row.analytic_bytes <= budget else 1, row.analytic.step_s)


def pick(rows: list[Row], top_k: int) -> list[Row]:
    """The `top_k` rows to compile, from rows ranked by the analytic estimate: the best,
    then the best pipelined, expert-parallel, tensor-parallel and plain data-parallel ones,
    the best of each remat policy, the best of each mesh, then the rest in order."""
    L = layouts_lib
    buckets = [
        lambda r: True,
        lambda r: r.layout.size(L.STAGE) > 1,
        lambda r: r.layout.expert_axis in ("data", "replica"),
        lambda r: r.layout.size(L.MDL) > 1,
        lambda r: r.layout.size(L.STAGE) == 1 and r.layout.size(L.MDL) == 1,
    ]
    chosen: list[Row] = []
    seen = set()

    def take(row: Row) -> None:
        if len(chosen) < top_k and id(row) not in seen:
            chosen.append(row)
            seen.add(id(row))

    for test in buckets:
        found = next((r for r in rows if test(r)), None)
        if found is not None:
            take(found)
    # Each policy's best: the analytic memory is rough, and the compile may find that only
    # a stronger policy fits.
    for policy in layouts_lib.REMAT_LADDER:
        found = next((r for r in rows if r.layout.checkpoint_policy == policy), None)
        if found is not None:
            take(found)
    meshes = set()
    for row in rows:
        mesh = (row.layout.ici, row.layout.dcn)
        if mesh not in meshes:
            meshes.add(mesh)
            take(row)
    for row in rows:
        take(row)
    order = {id(r): i for i, r in enumerate(rows)}
    return sorted(chosen, key=lambda r: order[id(r)])


# ----- Compiling, in this process or in a pool -----------------------------------------------


def _start_worker(num_devices: int, compiler: str) -> None:
    planning.start(num_devices, compiler)


def plan_one(experiment: type, hyperparameters: dict, selection, graph_overrides: dict,
              target, device: str, compiler: str, device_memory_gb: float):
    """The portable plan of the experiment class with these hyperparameters, or the
    one-line reason it could not be planned."""
    from paxloom.launch import plan as launch_plan
    from paxloom.launch import resolve

    try:
        variant = experiment(**hyperparameters)
        config = resolve.experiment_graph(variant, selection, graph_overrides, target)
        return launch_plan.plan(variant, config, compiler=compiler, device=device,
                                device_memory_gb=device_memory_gb).portable()
    except UserError as error:
        return str(error)
    except Exception as error:  # one layout XLA cannot compile does not end the search
        first = (str(error).strip().splitlines() or [""])[0]
        return f"{type(error).__name__}: {first}"[:300]


def cache_key(exp, hyperparameters, graph_overrides, device, device_memory_gb, compiler):
    """The plan cache's key of one plan_one() call."""
    # Either compiler compiles with XLA_FLAGS' settings (a GPU plan's include the launchers'
    # defaults); XLA:CPU the same program whatever the GPU's memory, XLA:GPU for the GPU's
    # description, memory included.
    if compiler == "cpu":
        device_memory_gb = 0.0
    compiler = f"{compiler} {os.environ.get('XLA_FLAGS', '')}"
    return plan_cache.key(type(exp), hyperparameters, graph_overrides, device=device,
                          device_memory_gb=device_memory_gb, compiler=compiler)


def compile_rows(exp, rows: list[Row], selection, graph_overrides: dict, target, *,
                 device: str, compiler: str, device_memory_gb: float, workers: int,
                 cache: bool = True) -> None:
    """Plan each row's layout (cache, then this process or a pool), setting row.plan or
    row.error."""
    todo = []
    for row in rows:
        hyperparameters = {**exp.hyperparameters(), **row.layout.overrides()}
        key = cache_key(exp, hyperparameters, graph_overrides, device, device_memory_gb,
                        compiler)
        found = plan_cache.get(key) if cache else None
        if found is not None:
            row.plan, row.cached = found, True
        else:
            todo.append((row, hyperparameters, key))
    args = [(type(exp), hp, selection, graph_overrides, target, device, compiler,
             device_memory_gb) for _, hp, _ in todo]
    if workers <= 1 or len(todo) <= 1:
        results = [plan_one(*a) for a in args]
    else:
        num_devices = rows[0].layout.num_devices
        with concurrent.futures.ProcessPoolExecutor(
                min(workers, len(todo)), mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker, initargs=(num_devices, compiler)) as pool:
            results = list(pool.map(plan_one, *zip(*args, strict=True)))
    for (row, _, key), result in zip(todo, results, strict=True):
        if isinstance(result, str):
            row.error = result
        else:
            row.plan = result
            if cache:
                plan_cache.put(key, result)


# ----- The search ----------------------------------------------------------------------------


def search(exp, selection, graph_overrides: dict, target, *, nodes: int, device: str,
           compiler: str, global_batch: int, top_k: int = 8, workers: int = 2,
           device_memory_gb: float = 0.0, cache: bool = True,
           gpus_per_node: int | None = None) -> SearchResult:
    """Rank `exp`'s layouts on `nodes` nodes of `device` GPUs (module docstring).
    `compiler` is planning.start()'s; `selection`, `graph_overrides` and `target` build
    each variant's run graph as the command line built the experiment's. `gpus_per_node`
    overrides the device's (8): small searches on few fake devices."""
    began = time.perf_counter()
    device = planning.device_key(device)
    gpus_per_node = gpus_per_node or links.interconnect(device).gpus_per_node
    budget = memory_budget(DEVICE_KINDS[device], device_memory_gb)
    candidates, pruned = layouts_lib.enumerate_layouts(exp, nodes, gpus_per_node, global_batch)
    enumerated = len(candidates) + sum(pruned.values())
    rows = []
    for layout in candidates:
        state, activations = layouts_lib.memory_bound(exp, layout, device)
        if state + PRUNE_ACTIVATION_SHARE * activations > budget:
            pruned["memory: the state and half the activations exceed the budget"] = \
                pruned.get("memory: the state and half the activations exceed the budget",
                           0) + 1
            continue
        analytic_bytes, estimate = layouts_lib.analytic(exp, layout, device)
        rows.append(Row(layout, analytic_bytes, estimate))
    if not rows:
        raise UserError(f"no layout of {type(exp).__name__} on {nodes} x {gpus_per_node} "
                        f"{DEVICE_KINDS[device].name} with a global batch of {global_batch} "
                        f"passes the experiment's checks and the memory bound: "
                        + "; ".join(f"{why} ({n})" for why, n in pruned.items()))
    rows.sort(key=lambda r: _analytic_key(r, budget))
    chosen = pick(rows, top_k)
    compile_began = time.perf_counter()
    compile_rows(exp, chosen, selection, graph_overrides, target, device=device,
                 compiler=compiler, device_memory_gb=device_memory_gb, workers=workers,
                 cache=cache)
    compile_seconds = time.perf_counter() - compile_began
    for row in chosen:
        if row.plan is not None:
            row.fits = row.plan.memory.peak <= budget
            row.estimate = step_time.from_plan(row.plan, device, exp.MODEL_DIMS)
    chosen.sort(key=_sort_key)
    return SearchResult(
        experiment=f"{type(exp).__module__}.{type(exp).__name__}", device=device,
        compiler=compiler, nodes=nodes, gpus_per_node=gpus_per_node,
        global_batch=global_batch, seq_len=exp.MAX_SEQ_LEN, budget=budget, rows=chosen,
        enumerated=enumerated, pruned=pruned,
        analytic_fits=sum(r.analytic_bytes <= budget for r in rows),
        seconds=time.perf_counter() - began, compile_seconds=compile_seconds)


def run(exp, selection, graph_overrides: dict, *, device: str, compiler: str, nodes: int,
        global_batch: int, top_k: int, workers: int, device_memory_gb: float) -> str:
    """`--plan_search` from main.py, before jax has started: the compiler made ready for the
    searched mesh, the search, its report."""
    if selection.fdl_config_file:
        raise UserError("--plan_search searches an experiment's layouts; name it with "
                        "--fdl_config (a recorded graph has its layout)")
    device = planning.device_key(device)
    target = planning.target_device(device)
    nodes = nodes or math.prod(exp.DCN_MESH_SHAPE)
    gpus_per_node = links.interconnect(device).gpus_per_node
    global_batch = global_batch or round(exp.PERCORE_BATCH_SIZE * nodes * gpus_per_node)
    compiler = planning.start(nodes * gpus_per_node, compiler)
    return report(search(exp, selection, graph_overrides, target, nodes=nodes, device=device,
                         compiler=compiler, global_batch=global_batch, top_k=top_k,
                         workers=workers, device_memory_gb=device_memory_gb))


# ----- The report ----------------------------------------------------------------------------


def report(result: SearchResult) -> str:
    """The search as text: the ranked table, the best layout's terms, the calibration's
    sources, the counts and the best's command line."""
    kind = DEVICE_KINDS[result.device]
    devices = result.nodes * result.gpus_per_node
    compiler = "XLA:GPU" if result.compiler == "gpu" else "XLA:CPU"
    cached = sum(r.cached for r in result.rows)
    lines = [
        f"Layout search: {result.experiment} on {result.nodes} nodes x {result.gpus_per_node} "
        f"{kind.name} ({devices} devices), global batch {result.global_batch} x "
        f"{result.seq_len} tokens",
        f"  {result.enumerated} layouts enumerated, {sum(result.pruned.values())} left out, "
        f"{result.analytic_fits} fit by the analytic estimate; {len(result.rows)} compiled by "
        f"{compiler} ({cached} from the cache) in {result.compile_seconds:.0f} s; "
        f"{result.seconds:.0f} s in all",
        f"  memory budget {result.budget / GiB:.1f} GiB per device "
        f"(XLA_PYTHON_CLIENT_MEM_FRACTION={planning.memory_fraction():g})",
    ]
    width = max([len(row.layout.label) for row in result.rows] + [6])
    lines += ["", f"{'rank':>4}  {'layout':<{width}} {'peak GiB':>8} {'fits':>4} {'step s':>8} "
                  f"{'tokens/s':>10} {'MFU':>6}  dominant"]
    for rank, row in enumerate(result.rows, 1):
        label = row.layout.label
        if row.plan is None:
            lines.append(f"{rank:>4}  {label:<{width}} cannot plan: {row.error}")
            continue
        e = row.estimate
        lines.append(f"{rank:>4}  {label:<{width}} {row.peak / GiB:>8.2f} "
                     f"{'yes' if row.fits else 'no':>4} {e.step_s:>8.3g} "
                     f"{e.tokens_per_s:>10,.0f} {e.mfu:>6.1%}  {e.dominant}")
    lines += ["", "Flags of each row (after --fdl_config):"]
    lines += [f"{rank:>4}  {row.layout.flags}" for rank, row in enumerate(result.rows, 1)]
    best = result.best
    if best is not None:
        lines += ["", f"Best: {best.layout.label} ({'fits' if best.fits else 'does not fit'}: "
                      f"{best.peak / GiB:.1f} GiB planned of {result.budget / GiB:.1f} GiB)"]
        lines += [f"  {line}" for line in step_time.lines(best.estimate)]
    if best is None:  # else the estimate's lines name their sources
        lines += ["", "Calibration", *[f"  {line}" for line in calibration_lines(result.device)]]
    if result.pruned:
        lines += ["", "Left out before compiling (layouts per reason)"]
        lines += [f"  {n:>6}  {why}" for why, n in
                  sorted(result.pruned.items(), key=lambda item: -item[1])]
    lines += ["", "The estimate: compute at the calibrated efficiency, recomputation, the "
                  "saved activations' memory traffic, each collective's bytes over its links "
                  "(async ones hidden behind the GPU's work), the pipeline bubble. Not in it: "
                  "the data pipeline, kernel launch gaps, NCCL's own algorithms, stragglers, "
                  "checkpoints and evaluations."]
    if best is not None:
        lines += ["", "To launch the best (with this command line's other flags):",
                  f"  python main.py --fdl_config={result.experiment} {best.layout.flags} "
                  f"--job_log_dir=runs/NAME"]
        if not best.fits:
            lines.append("  (no compiled layout fits: try a larger --plan_top_k, a smaller "
                         "--plan_global_batch or more --plan_nodes)")
    return "\n".join(lines)


def calibration_lines(device: str) -> list[str]:
    """Where the time model's constants come from, for `device`."""
    ic = links.interconnect(device)
    return [
        f"efficiency and recomputation: {efficiency.calibration(device).source}",
        f"links: NVLink {ic.nvlink_bytes_per_s / 1e9:g} GB/s, network "
        f"{ic.network_bytes_per_s_per_gpu / 1e9:g} GB/s per GPU, {ic.gpus_per_node} GPUs a "
        f"node ({ic.source})",
    ]

