"""`main.py --mode=plan` for an experiment: the plan of its train step (paxloom/runner/planning/plan.py
compiles and reads it), the verdict per GPU, and, when the run does not fit, the cheapest
single changes of hyperparameters that might, each built as a changed experiment and
re-planned. The runtime plans a run graph; only this module knows hyperparameter names.
"""

import dataclasses
import time

import fiddle as fdl
import jax

from layers import measured
from paxloom.core import batch, mesh_axes
from paxloom.core.errors import UserError
from paxloom.core.log import format_duration, log
from paxloom.runner.planning import links, step_account, step_time
from paxloom.runner.planning import plan as planning
from paxloom.runner.planning.plan import DEVICE_KINDS, Plan, fits, memory_budget, verdict

# Rematerialisation policies from most to least memory (praxis names; "none" = no remat in
# a plain stack, save everything in a repeated one).
REMAT_LADDER = ("none", "save_dot_except_logits_ffn1", "save_dot_with_no_batch_dims",
                "save_qkv_out_proj", "save_nothing")


def start(exp, compiler: str = "auto") -> str:
    """Before jax starts: the compiler to plan `exp` with, made ready (planning.start)."""
    return planning.start(exp.batch_layout().num_devices, compiler)


def plan(exp, config: fdl.Config, **options) -> Plan:
    """The plan of `exp`'s run graph `config`, labelled with the experiment."""
    return planning.plan(config, experiment=f"{type(exp).__module__}.{type(exp).__name__}",
                         hyperparameters=exp.hyperparameters(), **options)


@dataclasses.dataclass(frozen=True)
class Change:
    """One change of hyperparameters and its re-plan (or why it could not be planned)."""

    overrides: dict
    cost: str
    plan: Plan | None = None
    error: str | None = None
    floor: int = 0  # > 0: not compiled, what it must hold at least already over the budget

    @property
    def flags(self) -> str:
        return fdl_flags(self.overrides)


def fdl_flags(overrides: dict) -> str:
    """Hyperparameter overrides as `--fdl.NAME=VALUE` flags, ready to paste after
    --fdl_config (strings quoted, lists without spaces)."""
    return " ".join(f"--fdl.{name}={_literal(value)}" for name, value in overrides.items())


def _literal(value) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value).replace(" ", "")


SEGMENTS = "documents per row (MAX_SEGMENTS_PER_SEQ)"


def candidate_changes(p: Plan) -> dict[str, list[tuple[dict, str]]]:
    """Per kind of change, single changes from the cheapest to the dearest."""
    hp = p.hyperparameters
    policy = hp["CHECKPOINT_POLICY"]
    later = (REMAT_LADDER[REMAT_LADDER.index(policy) + 1:] if policy in REMAT_LADDER
             else ("save_nothing",) if policy != "save_nothing" else ())
    remat = [({"CHECKPOINT_POLICY": name}, "recomputes more of the forward pass in the "
              "backward pass (up to one more forward: about 1/3 more FLOPs)") for name in later]
    steps = p.accumulation_steps
    smaller, size = [], hp["PERCORE_BATCH_SIZE"]
    while True:  # halved while the batch layout (and each sub-batch) still splits
        size /= 2
        try:  # the pipeline's schedule is checked when the change is re-planned
            batch.layout(size, list(p.mesh_shape.values()), steps)
        except UserError:
            break
        smaller.append(({"PERCORE_BATCH_SIZE": int(size) if size == int(size) else size},
                        f"{size * p.num_devices:g} sequences per step instead of "
                        f"{p.global_batch}: a different optimisation (re-tune the learning "
                        f"rate) and less work per device to hide communication behind"))
    accumulate, shards = [], p.batch.batch_shards
    while p.global_batch % (shards * steps * 2) == 0:
        steps *= 2
        accumulate.append(({"GRADIENT_ACCUMULATION_STEPS": steps},
                           f"the same update (global batch {p.global_batch}) run as {steps} "
                           f"sub-batches of {p.global_batch // steps} one after another: less "
                           f"work per pass to hide communication behind" + (
                               ", and a pipeline fill and drain per sub-batch"
                               if p.pipeline is not None else "")))
    fsdp = []
    # Shapes are changed over all five axes and written back as the user wrote them.
    written_ici, written_dcn = hp["ICI_MESH_SHAPE"], hp["DCN_MESH_SHAPE"]
    ici, dcn = mesh_axes.full_shape(written_ici), mesh_axes.full_shape(written_dcn)
    if ici[1] > 1:  # the replica axis's devices within a node shard the weights instead
        ici = [ici[0], 1, ici[1] * ici[2], *ici[3:]]
        fsdp.append(({"ICI_MESH_SHAPE": mesh_axes.written_like(written_ici, ici)},
                     "weights gathered over NVLink for every layer, forward and backward, "
                     "instead of held whole"))
    if dcn[1] > 1:  # ... and across nodes too
        dcn = [dcn[0], 1, dcn[1] * dcn[2], *dcn[3:]]
        fsdp.append(({"ICI_MESH_SHAPE": mesh_axes.written_like(written_ici, ici),
                      "DCN_MESH_SHAPE": mesh_axes.written_like(written_dcn, dcn)},
                     "weights gathered across nodes (the slow network) for every layer"))
    segments = []
    if p.memory.kernel_buffers:  # cuDNN's packed attention sizes its buffers by the bound
        bound = hp["MAX_SEGMENTS_PER_SEQ"]
        segments = [({"MAX_SEGMENTS_PER_SEQ": m}, f"at most {m} documents a row (the padding "
                     f"at a row's end counts as one): a little more padding")
                    for m in (32, 16, 8) if m < bound]
    # The segment bound first where it matters: it costs a little padding, nothing else.
    changes = {SEGMENTS: segments} if segments else {}
    changes |= {"rematerialisation (CHECKPOINT_POLICY)": remat,
                "smaller batch (PERCORE_BATCH_SIZE)": smaller,
                "gradient accumulation (GRADIENT_ACCUMULATION_STEPS)": accumulate,
                "more FSDP (mesh)": fsdp}
    if p.pipeline is not None:
        changes["more, smaller microbatches (pipeline)"] = _more_microbatches(p)
    return changes


def _more_microbatches(p: Plan) -> list[tuple[dict, str]]:
    """NUM_MICROBATCHES doubled (or MICROBATCH_SIZE halved) while the microbatches still
    split over each stage's replica x data shards: less alive per pipeline iteration, and a
    smaller bubble."""
    hp, pipe = p.hyperparameters, p.pipeline
    shards = p.mesh_shape.get("replica", 1) * p.mesh_shape.get("data", 1)
    found, count = [], pipe.num_microbatches
    while p.sub_batch % (count * 2) == 0 and (p.sub_batch // (count * 2)) % shards == 0:
        count *= 2
        bubble = dataclasses.replace(pipe, num_microbatches=count).bubble_fraction()
        change = ({"MICROBATCH_SIZE": p.sub_batch // count} if hp.get("MICROBATCH_SIZE")
                  else {"NUM_MICROBATCHES": count})
        found.append((change, f"{count} microbatches of {p.sub_batch // count} per sub-batch: "
                              f"smaller matmuls per pipeline iteration; the bubble shrinks "
                              f"to {bubble:.1%}"))
    return found


def find_changes(exp, p: Plan, budget: int, variant_graph,
                 device_memory_gb: float = 0.0) -> dict[str, list[Change]]:
    """Per kind, the candidates tried in order, up to and including the first that fits;
    `variant_graph(experiment)` is a changed experiment's run graph, as the command line
    would build it (its graph overrides kept)."""
    found = {}
    for kind, candidates in candidate_changes(p).items():
        if any(c.plan is not None and fits(c.plan, budget) for c in found.get(SEGMENTS, ())):
            break  # a lower segment bound costs a little padding: dearer kinds are not needed
        tried = []
        for changed, cost in candidates:
            floor = kernel_buffer_floor(p, changed)
            if floor > budget:
                tried.append(Change(changed, cost, floor=floor))
                continue
            try:
                variant = type(exp)(**{**exp.hyperparameters(), **changed})
                change = Change(changed, cost, plan=plan(
                    variant, variant_graph(variant), compiler=p.compiler, device=p.device,
                    device_memory_gb=device_memory_gb))
            except UserError as error:
                change = Change(changed, cost, error=str(error))
            tried.append(change)
            if change.plan is not None and fits(change.plan, budget):
                break
        found[kind] = tried
    return found


def kernel_buffer_floor(p: Plan, changed: dict) -> int:
    """Bytes a change's plan holds at least, without compiling it, where that is known: cuDNN's
    packed buffers (p.memory.kernel_buffers) grow with the rows a device runs at once and do
    not shrink with rematerialisation or a mesh that keeps those rows; with its state where the
    change keeps the sharding too. 0 where the change's buffers are not known (another segment
    bound, pipeline microbatches) or the plan has none."""
    kernel = p.memory.kernel_buffers
    if not kernel:
        return 0
    if set(changed) <= {"ICI_MESH_SHAPE", "DCN_MESH_SHAPE"}:  # replica axes made FSDP: same rows
        return kernel
    if len(changed) != 1:
        return 0
    (name, value), = changed.items()
    if name == "CHECKPOINT_POLICY":
        rows = 1.0  # the rows a device runs at once, against the plan's
    elif name == "PERCORE_BATCH_SIZE":
        rows = value / p.hyperparameters["PERCORE_BATCH_SIZE"]
    elif name == "GRADIENT_ACCUMULATION_STEPS":
        rows = p.accumulation_steps / value
    else:
        return 0
    return int(kernel * rows) + p.memory.state


def report(exp, config: fdl.Config, variant_graph, *, compiler: str = "cpu",
           device: str = "h100", mfu: float = 0.0, device_memory_gb: float = 0.0) -> str:
    """The plan of `exp`'s run graph `config` as text: what `main.py --mode=plan` prints.
    `variant_graph(experiment)` builds a changed experiment's graph, as the command line
    built `config`, to re-plan the changes that would fit; `compiler` is start()'s."""
    began = time.perf_counter()
    p = plan(exp, config, compiler=compiler, device=device, device_memory_gb=device_memory_gb)
    first_plan_s = time.perf_counter() - began
    chosen = DEVICE_KINDS[device]
    budget = memory_budget(chosen, device_memory_gb)
    lines = planning.report_lines(p)
    lines.insert(2, f"  CHECKPOINT_POLICY={exp.CHECKPOINT_POLICY}, "
                    f"FPROP_DTYPE={exp.FPROP_DTYPE}")
    compiled_for = f"; the program compiled for {chosen.name}" if compiler == "gpu" else ""
    lines += ["", f"Verdict (XLA may use {planning.memory_fraction():.0%} of a GPU's memory: "
              f"XLA_PYTHON_CLIENT_MEM_FRACTION, as scripts_gpu/common.sh sets it"
              f"{compiled_for})"]
    for key, kind in DEVICE_KINDS.items():
        usable = memory_budget(kind, device_memory_gb if key == device else 0.0)
        name = kind.name + (f" (given {device_memory_gb:g} GB)"
                            if key == device and device_memory_gb > 0 else "")
        lines.append(f"  {name:<26} {planning.format_bytes(usable):>9} usable  "
                     f"{verdict(p, usable)}")
    launch = f"python main.py --fdl_config={p.experiment}"
    if fits(p, budget):
        lines += ["", f"To launch it (with this command line's other flags): {launch} "
                      f"--job_log_dir=runs/NAME"]
    else:
        lines += ["", f"Single changes that would fit {chosen.name}, each re-planned:"]
        # Each re-plan builds and compiles the step again, as long as the first plan took:
        # minutes in all for a large model, which would otherwise pass without a word.
        kinds = candidate_changes(p)
        count = sum(map(len, kinds.values()))
        if count:
            log(f"note: the plan does not fit {chosen.name}; planning up to {count} "
                f"alternative{'s' if count > 1 else ''} now, at most about "
                f"{format_duration(count * first_plan_s)} ({first_plan_s:.0f}s each, as "
                f"long as the first plan took)")
        fitting = []
        found = find_changes(exp, p, budget, variant_graph, device_memory_gb)
        for kind, tried in found.items():
            lines += _describe_changes(kind, tried, budget)
            fitting += [c for c in tried if c.plan is not None and fits(c.plan, budget)]
        if skipped := [kind for kind in kinds if kind not in found]:
            lines.append(f"  not re-planned, since a lower segment bound fits at the cost of a "
                         f"little padding: {', '.join(skipped)}")
        if fitting:  # the first kind's is the cheapest: the kinds are tried in that order
            lines += ["", f"To launch the first that fits (with this command line's other "
                          f"flags): {launch} {fitting[0].flags} --job_log_dir=runs/NAME"]
    lines += ["", *speed_lines(exp, p, device, mfu)]
    if compiler == "gpu":
        lines += ["", *account_lines(p)]
    caveats = (planning.GPU_CAVEATS.format(jax=jax.__version__) if compiler == "gpu"
               else planning.CPU_CAVEATS)
    lines += ["", f"Caveats ({p.compiler_name})", caveats, planning.COMMON_CAVEATS, "",
              f"planned in {time.perf_counter() - began:.1f}s "
              f"(train step compiled by {p.compiler_name} in {p.compile_s:.1f}s)"]
    return "\n".join(lines)


def account_lines(p: Plan, top: int = 0, measured_s: float = 0.0, source: str = "",
                  profile: dict | None = None) -> list[str]:
    """Where the compiled step's time goes on p.device, group by group (step_account). A
    plan (top 0) shows it where the account has been checked: not for a program that loops
    over layers, where it names the tool that shows it with that caveat."""
    account = step_account.account(p.compiled.as_text(), DEVICE_KINDS[p.device], p.traffic,
                                   links.interconnect(p.device), p.fused_attention)
    tool = ("python bench/step_account.py with this command line's flags and --device="
            f"{p.device}")
    if not top and step_account.SCANNED_NOTE in account.notes:
        return [f"Step account: not shown for a program that loops over layers ({tool} "
                f"shows it, with that caveat)"]
    lines = step_account.lines(account, measured_s, source, top, profile)
    return lines + ([f"  ({tool} lists its kernels)"] if not top else [])


def speed_lines(exp, p: Plan, device: str, mfu: float = 0.0) -> list[str]:
    """How fast the planned run might go on `device`: the calibrated step-time estimate
    (paxloom/runner/planning/step_time.py), or with `mfu` > 0 a step at that MFU (a
    pipeline's stages compute at it while busy and wait out the bubble); then the fastest
    run of the experiment measured on that GPU (layers/gpu_measurements.json)."""
    kind = DEVICE_KINDS[device]
    if mfu > 0:
        step_s = (p.flops_per_token * p.tokens_per_step / (p.num_devices * kind.peak_flops * mfu)
                  / (1 - p.bubble))
        bubble = (f", the pipeline bubble ({p.bubble:.1%} idle) included"
                  if p.pipeline is not None else "")
        lines = [f"Speed on {p.num_devices} x {kind.name} at an assumed MFU of {mfu:.0%} "
                 f"(--plan_mfu)",
                 f"  step time {step_s:.3g} s, {p.tokens_per_step / step_s:,.0f} tokens/s, "
                 f"{p.tokens_per_step / step_s / p.num_devices:,.0f} tokens/s per device{bubble}"]
    else:
        estimate = step_time.from_plan(p, device, exp.MODEL_DIMS)
        lines = [f"Speed on {p.num_devices} x {kind.name} (--plan_mfu=0.4 assumes an MFU "
                 f"instead)", *[f"  {line}" for line in step_time.lines(estimate)]]
    name = type(exp).__name__
    gpu = kind.chip
    run = measured.fastest_run(name, gpu)
    lines.append(f"  measured on {gpu}: " + (
        f"MFU {run['mfu']:.1%}, {run['tokens_per_s']:,} tokens/s a GPU at batch {run['batch']} "
        f"({run['date']}, jax {run['jax']}: {run['command']})" if run is not None else
        f"nothing recorded for {name} (bench/gpu_bench.py measures it)"))
    return lines


def _describe_changes(kind: str, tried: list[Change], budget: int) -> list[str]:
    if not tried:
        return [f"  {kind}: none to try"]
    lines = [f"  {kind}:"]
    for change in tried:
        if change.error:
            lines.append(f"    {change.flags}: cannot plan: {change.error}")
            continue
        if change.floor:
            lines.append(f"    {change.flags}: does not fit: cuDNN packed attention's own "
                         f"buffers alone come to {planning.format_bytes(change.floor)} "
                         f"(not compiled)")
            continue
        bubble = (f"; bubble {change.plan.bubble:.1%}" if change.plan.pipeline is not None
                  else "")
        lines.append(f"    {change.flags}: {verdict(change.plan, budget)}{bubble}")
        if fits(change.plan, budget):
            lines.append(f"      cost: {change.cost}")
    if all(c.plan is None or not fits(c.plan, budget) for c in tried):
        lines.append("    (none of these fits alone)")
    return lines
