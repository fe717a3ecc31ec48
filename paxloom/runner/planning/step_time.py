"""How long one train step of a compiled plan might take on its GPUs, term by term.

    compute_s       = model FLOPs / (peak x eff)              eff(D/t, M): efficiency.py, MFU basis
    recompute_s     = share x recomputed FLOPs / (peak x eff)   share: Calibration.recompute_share
    activations_s   = 2 x saved activation bytes / HBM bandwidth  (written forward, read back)
    t(collective)   = bytes sent / bandwidth of its links      links.py (ring factors in the bytes)
    asynchronous collectives run beside the GPU's work (compute + recompute + activations):
    what exceeds it is exposed; synchronous ones (tensor-parallel all-reduces, all-to-alls,
    pipeline permutes: the next op waits for them) are exposed whole
    busy_s          = compute + recompute + activations + exposed sync + exposed async
    bubble_s        = busy_s x b / (1 - b)                     b: the pipeline's idle share
    step_s          = busy_s + bubble_s

eff reads the model's width D over its t tensor-parallel devices and the tokens M a
device's matmuls take at a time (Plan.tokens_per_pass).

Model FLOPs are PaLM's (6N + 12LHQT per token, Plan.flops_per_token), the basis the
efficiency curve was fitted on; the compiled program's other matmuls (the one-hot
embedding's, flash attention's backward) are inside that efficiency. Recomputed FLOPs are
the compiled program's matmuls that jax traced again for a backward pass
(hlo_text.dot_flops: CHECKPOINT_POLICY's rematerialisation, the chunked loss's logits). A
pipelined program computes through its bubble too (the idle iterations run the layers on
padding), which the bubble term already charges: only 1 - b of its recomputation counts.

What a policy saves for the backward pass costs memory traffic the recomputation does not:
each saved byte is written to HBM in the forward pass and read in the backward, once per
sub-batch; the compiled plan's temporaries less its gradients stand for those bytes.

Communication bytes are the compiled program's (hlo_text.Traffic); XLA:CPU's plans move
bfloat16 collectives as float32 and gather where XLA:GPU would reduce-scatter, so their
communication terms are about twice a GPU's (noted in the estimate, not corrected).
"""

import dataclasses

from paxloom.runner.planning import efficiency, links
from paxloom.runner.planning import plan as planning


@dataclasses.dataclass
class Estimate:
    """One step's time on its GPUs, and what it is made of (seconds, per step)."""

    compute_s: float
    recompute_s: float
    activations_s: float
    comm: list[tuple[str, float, bool]]  # (what and over which links, seconds, asynchronous)
    exposed_sync_s: float  # the synchronous collectives, whole
    exposed_async_s: float  # the asynchronous collectives' time beyond the GPU's work
    hidden_s: float  # the asynchronous collectives' time under the GPU's work
    bubble: float  # the pipeline's idle share of each stage's time
    bubble_s: float
    step_s: float
    tokens_per_s: float
    mfu: float
    dominant: str  # the largest term: compute, recompute, a collective, or the bubble
    # What the terms were computed from, for lines().
    calibration: efficiency.Calibration
    device_key: str = ""
    width: float = 0.0  # the width eff reads: the model's over the tensor-parallel devices
    tokens_per_pass: float = 0.0
    peak_flops: float = 0.0
    memory_bytes_per_s: float = 0.0
    efficiency: float = 0.0
    model_flops: float = 0.0  # per device per step, MFU basis
    recompute_flops: float = 0.0  # per device per step, compiled matmuls traced again
    activation_bytes: float = 0.0  # per device per step, saved for the backward pass
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def work_s(self) -> float:
        """The GPU's own work, which asynchronous collectives overlap."""
        return self.compute_s + self.recompute_s + self.activations_s

    @property
    def busy_s(self) -> float:
        """A stage's working time: the step without its pipeline bubble."""
        return self.work_s + self.exposed_sync_s + self.exposed_async_s


def from_terms(*, model_flops: float, recompute_flops: float, activation_bytes: float,
               comm: list[tuple[str, float, bool]], bubble: float, device_key: str,
               model_dims: int, tokens_per_pass: float, tokens_per_step: float,
               flops_per_token: float, num_devices: int, tensor_parallel: int = 1,
               calibration: efficiency.Calibration | None = None) -> Estimate:
    """The estimate from its inputs: per device per step, model FLOPs (MFU basis),
    recomputed FLOPs and the bytes saved for the backward pass; collectives as (label,
    seconds, asynchronous); the pipeline's bubble fraction b (0 <= b < 1); the tokens a
    device's matmuls take at once; the whole step's tokens and FLOPs per token over
    num_devices. `calibration`: the device's own (efficiency.py) unless given."""
    if not 0 <= bubble < 1:
        raise ValueError(f"a pipeline bubble is a fraction in [0, 1): {bubble}")
    kind = planning.DEVICE_KINDS[planning.device_key(device_key)]
    c = calibration or efficiency.calibration(device_key)
    # A tensor-parallel device multiplies 1/t of each matmul's columns but normalises and
    # adds the whole width: its matmul share is that of a model D/t wide.
    width = model_dims / tensor_parallel
    eff = c.efficiency(width, tokens_per_pass)
    compute_s = model_flops / (kind.peak_flops * eff)
    recompute_s = c.recompute_share * recompute_flops / (kind.peak_flops * eff)
    activations_s = 2 * activation_bytes / kind.memory_bytes_per_s
    work_s = compute_s + recompute_s + activations_s
    asynchronous_s = sum(seconds for _, seconds, asynchronous in comm if asynchronous)
    exposed_sync_s = sum(seconds for _, seconds, asynchronous in comm if not asynchronous)
    exposed_async_s = max(0.0, asynchronous_s - work_s)
    hidden_s = asynchronous_s - exposed_async_s
    busy_s = work_s + exposed_sync_s + exposed_async_s
    bubble_s = busy_s * bubble / (1 - bubble)
    step_s = (compute_s + recompute_s + activations_s + exposed_sync_s + exposed_async_s
              + bubble_s)
    tokens_per_s = tokens_per_step / step_s if step_s > 0 else 0.0
    mfu = flops_per_token * tokens_per_s / (num_devices * kind.peak_flops)
    return Estimate(
        compute_s=compute_s, recompute_s=recompute_s, activations_s=activations_s,
        comm=list(comm), exposed_sync_s=exposed_sync_s, exposed_async_s=exposed_async_s,
        hidden_s=hidden_s, bubble=bubble, bubble_s=bubble_s, step_s=step_s,
        tokens_per_s=tokens_per_s, mfu=mfu,
        dominant=_dominant(compute_s, recompute_s, activations_s, comm, exposed_async_s,
                           bubble_s),
        calibration=c, device_key=device_key, width=width,
        tokens_per_pass=tokens_per_pass, peak_flops=kind.peak_flops,
        memory_bytes_per_s=kind.memory_bytes_per_s, efficiency=eff, model_flops=model_flops,
        recompute_flops=recompute_flops, activation_bytes=activation_bytes)


def from_plan(plan: planning.Plan, device_key: str, model_dims: int,
              calibration: efficiency.Calibration | None = None) -> Estimate:
    """The estimate of `plan`'s step on `device_key`'s GPUs (the module docstring's terms),
    for a model `model_dims` wide. Where the plan has no matmul count (dot_flops 0.0), no
    recomputation is charged."""
    ic = links.interconnect(device_key)
    comm = [(traffic_label(t, ic), links.seconds(t, ic), t.asynchronous) for t in plan.traffic]
    estimate = from_terms(
        model_flops=plan.flops_per_token * plan.tokens_per_step / plan.num_devices,
        # The pipeline's loop runs its layers through the bubble's iterations too.
        recompute_flops=plan.recomputed_flops * (1 - plan.bubble),
        activation_bytes=plan.memory.activations * plan.accumulation_steps,
        comm=comm, bubble=plan.bubble, device_key=device_key, model_dims=model_dims,
        tokens_per_pass=plan.tokens_per_pass, tokens_per_step=plan.tokens_per_step,
        flops_per_token=plan.flops_per_token, num_devices=plan.num_devices,
        tensor_parallel=plan.mesh_shape.get("mdl", 1), calibration=calibration)
    if plan.dot_flops <= 0:
        estimate.notes.append("no compiled matmul count: recomputation not charged")
    if plan.compiler == "cpu":
        estimate.notes.append("collective bytes from XLA:CPU: bfloat16 moved as float32 and no "
                              "reduce-scatters, about twice a GPU's; activations from XLA:CPU's "
                              "temporaries, up to twice a GPU's")
    return estimate


def traffic_label(t, ic: links.Interconnect) -> str:
    """One collective row (hlo_text.Traffic) as the estimate prints it: op, mesh axes,
    links and their bandwidth, bytes sent per device per step."""
    axes = "+".join(t.axes) or "(groups unread)"
    return (f"{t.op} {axes} over {t.links} ({t.group_size} devices, {t.per_node} per node): "
            f"{t.sent_bytes / 1e9:.3g} GB sent at "
            f"{links.bandwidth(t.links, t.per_node, ic) / 1e9:.0f} GB/s")


def _dominant(compute_s, recompute_s, activations_s, comm, exposed_async_s, bubble_s) -> str:
    terms = [("compute", compute_s), ("recompute", recompute_s),
             ("saved activations' memory traffic", activations_s)]
    terms += [(label, seconds) for label, seconds, asynchronous in comm if not asynchronous]
    if exposed_async_s > 0:
        largest = max((c for c in comm if c[2]), key=lambda c: c[1])[0]
        terms.append((f"asynchronous collectives beyond compute (largest: {largest})",
                      exposed_async_s))
    terms.append(("pipeline bubble", bubble_s))
    return max(terms, key=lambda term: term[1])[0]


def lines(e: Estimate) -> list[str]:
    """The estimate as lines of text, each term with what it assumes."""
    c = e.calibration
    name = planning.DEVICE_KINDS[planning.device_key(e.device_key)].name
    ic = links.interconnect(e.device_key)
    out = [
        f"Step time on {name} (estimate): {e.step_s:.4g} s, {e.tokens_per_s:,.0f} tokens/s, "
        f"MFU {e.mfu:.1%}; dominant: {e.dominant}",
        f"  compute     {e.compute_s:10.4g} s = {e.model_flops:.4g} model FLOPs per device / "
        f"({e.peak_flops / 1e12:g} TFLOP/s x eff {e.efficiency:.3f}); eff(D={e.width:g}, "
        f"M={e.tokens_per_pass:g} tokens a pass) = {c.e_max} x D/(D+{c.half_width:g}) x "
        f"M/(M+{c.half_rows:g}) x {c.device_scale}",
        f"  recompute   {e.recompute_s:10.4g} s = {c.recompute_share:g} x "
        f"{e.recompute_flops:.4g} recomputed FLOPs per device / (peak x eff)",
        f"  activations {e.activations_s:10.4g} s = 2 x {e.activation_bytes / 2**30:.3g} GiB "
        f"saved for the backward pass / {e.memory_bytes_per_s / 1e12:g} TB/s HBM",
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
        f"  overlap: asynchronous collectives hide behind the GPU's work, compute + recompute "
        f"+ activations ({e.work_s:.4g} s): {e.hidden_s:.4g} s hidden, what exceeds it "
        f"exposed: {e.exposed_async_s:.4g} s",
        f"  exposed synchronous collectives (tensor-parallel all-reduces, all-to-alls, "
        f"pipeline permutes): {e.exposed_sync_s:.4g} s",
        f"  bubble      {e.bubble_s:10.4g} s = busy {e.busy_s:.4g} s x b/(1-b), "
        f"b = {e.bubble:.1%}",
        f"  step        {e.step_s:10.4g} s = compute + recompute + activations + exposed sync "
        f"+ exposed async + bubble",
    ]
    out += [f"  note: {note}" for note in e.notes]
    out += [f"  calibration: {c.source}", f"  links: {ic.source}"]
    return out
