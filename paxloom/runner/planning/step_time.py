"""How long one train step of a compiled plan might take on its GPUs, term by term.

    compute_s       = model FLOPs / (peak x eff)             eff: efficiency.py, MFU basis
    recompute_s     = kappa x recomputed FLOPs / (peak x eff)  kappa: efficiency.KAPPA_RECOMPUTE
    t(collective)   = bytes sent / bandwidth of its links     links.py (ring factors in the bytes)
    asynchronous collectives run beside compute: what exceeds compute + recompute is exposed;
    synchronous ones (tensor-parallel all-reduces, all-to-alls, pipeline permutes: the next
    op waits for them) are exposed whole
    busy_s          = compute + recompute + exposed sync + exposed async
    bubble_s        = busy_s x b / (1 - b)                    b: the pipeline's idle share
    step_s          = busy_s + bubble_s

Model FLOPs are PaLM's (6N + 12LHQT per token, Plan.flops_per_token), the basis the
efficiency curve was measured on, so a compute-bound step without recomputation reaches
MFU = eff. The compiled program's matmuls (Plan.dot_flops) run more than that: about
`model_flops_ratio` (1.10) times the model's at CHECKPOINT_POLICY=none (the one-hot
embedding matmul, the loss's extra work), and rematerialisation's recomputed forward on
top; what exceeds ratio x model is the recomputation. A pipelined program computes through
its bubble too (the idle iterations run the layers on padding), which the bubble term
already charges: only 1 - b of its matmuls are counted.

Communication bytes are the compiled program's (hlo_text.Traffic); XLA:CPU's plans move
bfloat16 collectives as float32 and gather where XLA:GPU would reduce-scatter, so their
communication terms are about twice a GPU's (noted in the estimate, not corrected).
"""

import dataclasses

from paxloom.runner.planning import efficiency, links
from paxloom.runner.planning import plan as planning

# Compiled matmul FLOPs over model FLOPs at CHECKPOINT_POLICY=none: 1.10 on a tiny bfloat16
# repeated-layer GPT compiled by XLA:GPU (1.29e10 against 1.17e10 per device; design notes of
# issue 42), 1.03 for tests/test_step_time.py's wider one on XLA:CPU.
MODEL_FLOPS_RATIO = 1.10


@dataclasses.dataclass
class Estimate:
    """One step's time on its GPUs, and what it is made of (seconds, per step)."""

    compute_s: float
    recompute_s: float
    comm: list[tuple[str, float, bool]]  # (what and over which links, seconds, asynchronous)
    exposed_sync_s: float  # the synchronous collectives, whole
    exposed_async_s: float  # the asynchronous collectives' time beyond compute + recompute
    hidden_s: float  # the asynchronous collectives' time under compute + recompute
    bubble: float  # the pipeline's idle share of each stage's time
    bubble_s: float
    step_s: float
    tokens_per_s: float
    mfu: float
    dominant: str  # the largest term: compute, recompute, a collective, or the bubble
    # What the terms were computed from, for lines().
    device_key: str = ""
    model_dims: int = 0
    peak_flops: float = 0.0
    efficiency: float = 0.0
    model_flops: float = 0.0  # per device per step, MFU basis
    recompute_flops: float = 0.0  # per device per step, compiled matmuls beyond the model's
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def busy_s(self) -> float:
        """A stage's working time: the step without its pipeline bubble."""
        return self.compute_s + self.recompute_s + self.exposed_sync_s + self.exposed_async_s


def from_terms(*, model_flops: float, recompute_flops: float,
               comm: list[tuple[str, float, bool]], bubble: float, device_key: str,
               model_dims: int, tokens_per_step: float, flops_per_token: float,
               num_devices: int) -> Estimate:
    """The estimate from its inputs: per device per step, model FLOPs (MFU basis) and
    recomputed FLOPs; collectives as (label, seconds, asynchronous); the pipeline's bubble
    fraction b (0 <= b < 1); the whole step's tokens and FLOPs per token over num_devices."""
    if not 0 <= bubble < 1:
        raise ValueError(f"a pipeline bubble is a fraction in [0, 1): {bubble}")
    peak = planning.DEVICE_KINDS[planning.device_key(device_key)].peak_flops
    eff = efficiency.efficiency(device_key, model_dims)
    compute_s = model_flops / (peak * eff)
    recompute_s = efficiency.KAPPA_RECOMPUTE * recompute_flops / (peak * eff)
    asynchronous_s = sum(seconds for _, seconds, asynchronous in comm if asynchronous)
    exposed_sync_s = sum(seconds for _, seconds, asynchronous in comm if not asynchronous)
    exposed_async_s = max(0.0, asynchronous_s - compute_s - recompute_s)
    hidden_s = asynchronous_s - exposed_async_s
    busy_s = compute_s + recompute_s + exposed_sync_s + exposed_async_s
    bubble_s = busy_s * bubble / (1 - bubble)
    step_s = compute_s + recompute_s + exposed_sync_s + exposed_async_s + bubble_s
    tokens_per_s = tokens_per_step / step_s if step_s > 0 else 0.0
    mfu = flops_per_token * tokens_per_s / (num_devices * peak)
    return Estimate(
        compute_s=compute_s, recompute_s=recompute_s, comm=list(comm),
        exposed_sync_s=exposed_sync_s, exposed_async_s=exposed_async_s, hidden_s=hidden_s,
        bubble=bubble, bubble_s=bubble_s, step_s=step_s, tokens_per_s=tokens_per_s, mfu=mfu,
        dominant=_dominant(compute_s, recompute_s, comm, exposed_async_s, bubble_s),
        device_key=device_key, model_dims=model_dims, peak_flops=peak, efficiency=eff,
        model_flops=model_flops, recompute_flops=recompute_flops)


def from_plan(plan: planning.Plan, device_key: str, model_dims: int,
              model_flops_ratio: float = MODEL_FLOPS_RATIO) -> Estimate:
    """The estimate of `plan`'s step on `device_key`'s GPUs (the module docstring's terms),
    for a model `model_dims` wide. Where the plan has no matmul count (dot_flops 0.0), the
    model's FLOPs alone: no recomputation is charged."""
    model_flops = plan.flops_per_token * plan.tokens_per_step / plan.num_devices
    # The pipeline's loop runs its layers through the bubble's iterations too.
    useful_dot_flops = plan.dot_flops * (1 - plan.bubble)
    recompute_flops = (max(0.0, useful_dot_flops - model_flops_ratio * model_flops)
                       if plan.dot_flops > 0 else 0.0)
    ic = links.interconnect(device_key)
    comm = [(traffic_label(t, ic), links.seconds(t, ic), t.asynchronous) for t in plan.traffic]
    estimate = from_terms(
        model_flops=model_flops, recompute_flops=recompute_flops, comm=comm,
        bubble=plan.bubble, device_key=device_key, model_dims=model_dims,
        tokens_per_step=plan.tokens_per_step, flops_per_token=plan.flops_per_token,
        num_devices=plan.num_devices)
    if plan.dot_flops <= 0:
        estimate.notes.append("no compiled matmul count: recomputation not charged")
    if plan.compiler == "cpu":
        estimate.notes.append("collective bytes from XLA:CPU: bfloat16 moved as float32 and no "
                              "reduce-scatters, about twice a GPU's")
    return estimate


def traffic_label(t, ic: links.Interconnect) -> str:
    """One collective row (hlo_text.Traffic) as the estimate prints it: op, mesh axes,
    links and their bandwidth, bytes sent per device per step."""
    axes = "+".join(t.axes) or "(groups unread)"
    return (f"{t.op} {axes} over {t.links} ({t.group_size} devices, {t.per_node} per node): "
            f"{t.sent_bytes / 1e9:.3g} GB sent at "
            f"{links.bandwidth(t.links, t.per_node, ic) / 1e9:.0f} GB/s")


def _dominant(compute_s, recompute_s, comm, exposed_async_s, bubble_s) -> str:
    terms = [("compute", compute_s), ("recompute", recompute_s)]
    terms += [(label, seconds) for label, seconds, asynchronous in comm if not asynchronous]
    if exposed_async_s > 0:
        largest = max((c for c in comm if c[2]), key=lambda c: c[1])[0]
        terms.append((f"asynchronous collectives beyond compute (largest: {largest})",
                      exposed_async_s))
    terms.append(("pipeline bubble", bubble_s))
    return max(terms, key=lambda term: term[1])[0]


def lines(e: Estimate) -> list[str]:
    """The estimate as lines of text, each term with what it assumes."""
    c = efficiency.calibration(e.device_key)
    name = planning.DEVICE_KINDS[planning.device_key(e.device_key)].name
    ic = links.interconnect(e.device_key)
    busy_s = e.busy_s
    out = [
        f"Step time on {name} (estimate): {e.step_s:.4g} s, {e.tokens_per_s:,.0f} tokens/s, "
        f"MFU {e.mfu:.1%}; dominant: {e.dominant}",
        f"  compute    {e.compute_s:10.4g} s = {e.model_flops:.4g} model FLOPs per device / "
        f"({e.peak_flops / 1e12:g} TFLOP/s x eff {e.efficiency:.3f}); eff(D={e.model_dims}) = "
        f"{c.e_max} x D/(D+{c.half_width:g}) x {c.device_scale}",
        f"  recompute  {e.recompute_s:10.4g} s = {efficiency.KAPPA_RECOMPUTE} x "
        f"{e.recompute_flops:.4g} recomputed FLOPs per device / (peak x eff)",
        f"  collectives: ring bytes sent / bandwidth: NVLink {ic.nvlink_bytes_per_s / 1e9:.0f} "
        f"GB/s (ICI), network {ic.network_bytes_per_s_per_gpu / 1e9:.0f} GB/s per GPU (DCN), "
        f"x devices per node for a group over both (ICI+DCN), at most NVLink's",
    ]
    for label, seconds, asynchronous in sorted(e.comm, key=lambda c: -c[1]):
        kind = "async, beside compute" if asynchronous else "sync, exposed"
        out.append(f"    {seconds:10.4g} s {kind:<22} {label}")
    if not e.comm:
        out.append("    none")
    out += [
        f"  overlap: asynchronous collectives hide behind compute + recompute "
        f"({e.compute_s + e.recompute_s:.4g} s): {e.hidden_s:.4g} s hidden, what exceeds "
        f"compute exposed: {e.exposed_async_s:.4g} s",
        f"  exposed synchronous collectives (tensor-parallel all-reduces, all-to-alls, "
        f"pipeline permutes): {e.exposed_sync_s:.4g} s",
        f"  bubble     {e.bubble_s:10.4g} s = busy {busy_s:.4g} s x b/(1-b), b = {e.bubble:.1%}",
        f"  step       {e.step_s:10.4g} s = compute + recompute + exposed sync + exposed "
        f"async + bubble",
    ]
    out += [f"  note: {note}" for note in e.notes]
    out += [f"  efficiency: {c.source}", f"  recompute share: {efficiency.KAPPA_SOURCE}",
            f"  links: {ic.source}"]
    return out
