"""Where a compiled train step spends its time, kernel by kernel, without running it.

The planner's XLA:GPU compile (paxloom/runner/planning/plan.py) is the program a GPU runs:
each instruction of its entry computation (and of the loops that computation runs) that
is not a tuple, bitcast, parameter or constant is a kernel launch (a fusion, a cuBLAS or
cuDNN custom call, a copy, a collective). For each, the account reads from the HLO text
the FLOPs it computes and the HBM bytes it moves, and takes its roofline time on the
planned GPU: the longer of FLOPs at the peak bfloat16 rate and bytes at the HBM bandwidth
(DEVICE_KINDS). A kernel runs at best in its roofline time, so the account's total is a
lower bound of the step; what the measured step spends beyond it is launch gaps,
kernels below their roofline (small matmuls, reductions), and what the compile-only
program does not show (autotuning's choices).

XLA's own per-instruction cost analysis is not reachable for a program compiled without a
GPU (`compiled.cost_analysis()` is None there), so the counts follow its rules here:

- A matmul computes 2 x its result's elements x the contracted elements (dot_flops); an
  elementwise instruction one FLOP per element of its result, a reduction one per element
  of its input.
- A kernel reads its operands and writes its result, except where a fusion reads only a
  slice of an operand (a loop reading one layer's weights: the slice's bytes) or updates a
  buffer in place (dynamic-update-slice: the update's bytes, read of the buffer not counted).

Each kernel falls in one group, by what it is and where jax's name scope (`op_name`) says
it came from: collectives; attention (praxis's `_dot_atten` scope, the fused kernels'
`_fused_context`); matmuls; the loss
(`compute_loss`, less its matmuls); the optimizer update (everything outside the model's
forward `jvp(...)` and backward `transpose(jvp(...))`: gradient norms, the optax update);
copies and transposes; elementwise and reductions (the rest: norms, activations, residuals).

Checked on unrolled layer stacks (each layer its own kernels); where the program loops over
layers, the account says so and its bytes are an upper bound (SCANNED_NOTE).

Collectives take their time from the links they cross (links.seconds, as the plan's
estimate), not from HBM. Where the run's attention is a fused kernel the planner traces as
its plain-JAX stand-in (cuDNN or Pallas, layers/flash.py), the stand-in's kernels are not
what runs: the attention group is then the kernel's own FLOPs and bytes (fused_attention).
"""

import dataclasses
import re
from collections import defaultdict

from paxloom.runner.planning import hlo_text, links

SCANNED_NOTE = ("the program loops over layers (a scanned stack or a pipeline): the account "
                "is checked on unrolled stacks only, and may count a loop's in-place updates "
                "of stacked buffers whole")
GROUPS = ("matmuls", "attention", "elementwise and reductions", "copies and transposes",
          "collectives", "optimizer update", "loss")

# Instructions that launch nothing: views, tuples, control flow (its bodies are read), the
# second halves of asynchronous pairs.
_NOT_KERNELS = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while",
                "conditional", "call", "after-all", "partition-id", "replica-id",
                "opt-barrier", "add-dependency", "copy-done", "send-done", "recv-done",
                "async-done", "async-update", "domain"}
_COLLECTIVES = tuple(hlo_text.OPS)
# One FLOP per result element (XLA's HloCostAnalysis counts elementwise ops so).
_ELEMENTWISE = {"add", "subtract", "multiply", "divide", "maximum", "minimum", "compare",
                "select", "negate", "exponential", "exponential-minus-one", "log",
                "log-plus-one", "tanh", "rsqrt", "sqrt", "power", "abs", "and", "or", "not",
                "xor", "clamp", "floor", "ceil", "round-nearest-even", "sign", "logistic",
                "erf", "cosine", "sine", "remainder", "atan2", "is-finite", "cbrt"}
_REDUCTIONS = {"reduce", "reduce-window"}
_SLICES = {"slice", "dynamic-slice"}
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_OPERANDS = re.compile(r"%([\w.\-]+)")
_PARAMETER_INDEX = re.compile(r"parameter\((\d+)\)")


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One kernel of the step, summed over its executions (loop trips)."""

    name: str
    group: str
    runs: int
    flops: float
    bytes: float
    seconds: float  # roofline, all executions
    scope: str = ""  # jax's name scope, for the reader


@dataclasses.dataclass(frozen=True)
class Group:
    name: str
    kernels: int  # launches per step
    flops: float
    bytes: float
    seconds: float


@dataclasses.dataclass(frozen=True)
class Account:
    device: str  # DEVICE_KINDS name
    peak_flops: float
    memory_bytes_per_s: float
    kernels: list[Kernel]
    notes: list[str]

    @property
    def groups(self) -> list[Group]:
        by_group = defaultdict(list)
        for kernel in self.kernels:
            by_group[kernel.group].append(kernel)
        return [Group(name, sum(k.runs for k in by_group[name]),
                      sum(k.flops for k in by_group[name]),
                      sum(k.bytes for k in by_group[name]),
                      sum(k.seconds for k in by_group[name])) for name in GROUPS]

    @property
    def seconds(self) -> float:
        """The step's roofline: every group's time, one after another."""
        return sum(group.seconds for group in self.groups)


def roofline(flops: float, nbytes: float, peak_flops: float, bytes_per_s: float) -> float:
    return max(flops / peak_flops, nbytes / bytes_per_s)


def account(program: str, device, traffic=(), interconnect=None,
            attention: "FusedAttention | None" = None) -> Account:
    """The account of `program` (compiled.as_text()) on `device` (a DEVICE_KINDS entry);
    `traffic` and `interconnect` the plan's collectives and links; `attention` the fused
    kernel that runs where the program holds its stand-in."""
    computations, calls = hlo_text.parse(program)
    runs = hlo_text.executions(computations, calls)
    fused = _fused_computations(computations)
    flops_of = _computation_flops(computations, fused)
    kernels, notes = [], []
    for computation, outer_scope in _control_flow(computations).items():
        instructions = computations[computation]
        shapes = {name: shape for name, shape, _, _ in instructions}
        for name, shape, op, rest in instructions:
            base = op.removesuffix("-start")
            if op in _NOT_KERNELS or op.endswith("-done") or base in _COLLECTIVES:
                continue  # collectives: from the traffic, below
            scope = _scope(rest) or outer_scope
            group, flops, nbytes = _kernel(name, shape, op, rest, scope, shapes, computations,
                                           flops_of)
            times = runs[computation]
            kernels.append(Kernel(name, group, times, flops * times, nbytes * times,
                                  roofline(flops, nbytes, device.peak_flops,
                                           device.memory_bytes_per_s) * times, scope))
    # Loops the account was not checked on: a scanned layer stack (or a pipeline's), whose
    # in-place updates of stacked buffers inside async or nested fusions it may count whole.
    if any(k.runs > 1 and not _is_attention(k.scope) and "compute_loss" not in k.scope
           for k in kernels):
        notes.append(SCANNED_NOTE)
    for t in traffic:
        kernels.append(Kernel(f"{t.op} over {'+'.join(t.axes) or '?'} ({t.links})",
                              "collectives", t.count, 0.0, t.sent_bytes,
                              links.seconds(t, interconnect)))
    standing_in = [k for k in kernels if k.group == "attention"]
    if attention is not None and not standing_in:
        notes.append(f"attention: {attention.name}'s stand-in was not found by its name scope; "
                     f"its kernels count in the other groups")
    elif attention is not None:
        kernels = [k for k in kernels if k.group != "attention"]
        kernels += attention.kernels(device)
        notes.append(f"attention: {attention.name}'s own FLOPs and bytes "
                     f"(fused_attention), in place of the {len(standing_in)} kernels of "
                     f"the plain-JAX stand-in the planner compiles "
                     f"({sum(k.seconds for k in standing_in) * 1e3:.2f} ms at their roofline)")
    return Account(device.name, device.peak_flops, device.memory_bytes_per_s, kernels, notes)


def _control_flow(computations) -> dict[str, str]:
    """The computations whose instructions are kernels (the entry, loop bodies and
    conditions, branches and calls; not fused computations or reducers), each with the name
    scope of the instruction that runs it, for its kernels that carry none of their own."""
    found, stack = {}, [("ENTRY", "")]
    while stack:
        name, scope = stack.pop()
        if name in found or name not in computations:
            continue
        found[name] = scope
        for _, _, op, rest in computations[name]:
            inner = _scope(rest) or scope
            if op == "while":
                callees = re.findall(r"\b(?:body|condition)=%([\w.\-]+)", rest)
            elif op == "conditional":
                callees = [n.strip().lstrip("%") for names in
                           re.findall(r"branch_computations=\{([^}]*)\}", rest)
                           for n in names.split(",")]
            elif op == "call":
                callees = re.findall(r"\bto_apply=%([\w.\-]+)", rest)
            else:
                continue
            stack += [(callee, inner) for callee in callees]
    return found


def _fused_computations(computations) -> set[str]:
    return {callee for instructions in computations.values()
            for _, _, op, rest in instructions if op == "fusion"
            for callee in re.findall(r"\bcalls=%([\w.\-]+)", rest)}


def _computation_flops(computations, fused) -> dict[str, tuple[float, bool]]:
    """Per fused computation: (FLOPs of one execution, whether it holds a matmul)."""
    result = {}

    def flops(name):
        if name in result:
            return result[name]
        total, matmul = 0.0, False
        instructions = computations.get(name, [])
        shapes = {n: s for n, s, _, _ in instructions}
        for _, shape, op, rest in instructions:
            if hlo_text.is_matmul(op, rest):
                total += hlo_text.instruction_flops(shape, op, rest, shapes)
                matmul = True
            elif op in _ELEMENTWISE:
                total += _elements(shape)
            elif op in _REDUCTIONS:
                operand = _OPERANDS.search(rest)
                total += _elements(shapes.get(operand.group(1), "")) if operand else 0
            elif op == "fusion":
                for callee in re.findall(r"\bcalls=%([\w.\-]+)", rest):
                    inner, inner_matmul = flops(callee)
                    total += inner
                    matmul |= inner_matmul
        result[name] = (total, matmul)
        return result[name]

    for name in fused:
        flops(name)
    return result


def _kernel(name, shape, op, rest, scope, shapes, computations, flops_of):
    """(group, FLOPs, bytes) of one execution of a kernel instruction."""
    operands = _operand_names(rest)
    if op == "fusion":
        callee = re.search(r"\bcalls=%([\w.\-]+)", rest).group(1)
        flops, matmul = flops_of.get(callee, (0.0, False))
        nbytes = _fusion_bytes(shape, operands, shapes, computations[callee])
    elif op == "custom-call":
        matmul = hlo_text.is_matmul(op, rest)
        flops = hlo_text.instruction_flops(shape, op, rest, shapes)
        # A gemm's result is (product, workspace): the workspace is scratch, not HBM traffic.
        result = hlo_text.ARRAY.search(shape)
        written = hlo_text.shape_bytes(result.group(0)) if matmul and result else \
            hlo_text.shape_bytes(shape)
        nbytes = written + sum(hlo_text.shape_bytes(shapes.get(o, "")) for o in operands)
    elif op == "dynamic-update-slice":  # in place: the update read and written
        flops, matmul = 0.0, False
        nbytes = 2 * hlo_text.shape_bytes(shapes.get(operands[1], "")) if len(operands) > 1 else 0
    else:
        matmul = op == "dot"
        flops = hlo_text.instruction_flops(shape, op, rest, shapes) if matmul else (
            _elements(shape) if op in _ELEMENTWISE else 0.0)
        read = (hlo_text.shape_bytes(shape) if op in _SLICES else
                sum(hlo_text.shape_bytes(shapes.get(o, "")) for o in operands))
        nbytes = read + hlo_text.shape_bytes(shape)
    return _group(name, op, scope, matmul), flops, nbytes


# jax's name scopes of attention's scores-softmax-context step: praxis's `_dot_atten`, and
# the fused kernels' `_fused_context` (layers/attention.py), which the grouped-query layer
# calls without it.
_ATTENTION_SCOPES = ("_dot_atten", "_fused_context")


def _is_attention(scope: str) -> bool:
    return any(name in scope for name in _ATTENTION_SCOPES)


def _group(name: str, op: str, scope: str, matmul: bool) -> str:
    if _is_attention(scope):
        return "attention"
    if matmul:
        return "matmuls"
    if "compute_loss" in scope:
        return "loss"
    if scope and "jvp(" not in scope:
        return "optimizer update"
    if op in ("copy", "transpose", "copy-start") or "transpose" in name or name.startswith("copy"):
        return "copies and transposes"
    return "elementwise and reductions"


def _fusion_bytes(shape: str, operands: list[str], shapes: dict, body: list) -> float:
    """Bytes one execution of a fusion moves: each operand read (only the slices the fused
    computation takes of it, where that is all it does with it), its result written (only
    the update, where the result is a buffer updated in place)."""
    params, users = {}, defaultdict(list)
    for name, inner_shape, op, rest in body:
        index = _PARAMETER_INDEX.match(op + "(" + rest) if op == "parameter" else None
        if index:
            params[int(index.group(1))] = name
        for operand in _operand_names(rest):
            users[operand].append((name, inner_shape, op, rest))
    in_place, shapes_in = set(), {name: s for name, s, _, _ in body}
    written = hlo_text.shape_bytes(shape)
    for _, inner_shape, op, rest in body:
        if op == "dynamic-update-slice":
            target, *others = _operand_names(rest)
            if target in params.values():
                in_place.add(target)
                update = shapes_in.get(others[0], "") if others else ""
                written -= hlo_text.shape_bytes(inner_shape) - hlo_text.shape_bytes(update)
    read = 0.0
    for index, operand in enumerate(operands):
        param = params.get(index)
        if param in in_place:
            continue
        uses = users.get(param, [])
        if uses and all(op in _SLICES for _, _, op, _ in uses):
            read += sum(hlo_text.shape_bytes(s) for _, s, _, _ in uses)
        else:
            read += hlo_text.shape_bytes(shapes.get(operand, ""))
    return read + max(written, 0)


def _operand_names(rest: str) -> list[str]:
    """The instruction's operands: the %names before its attributes."""
    depth, end = 1, len(rest)
    for i, char in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            end = i
            break
    return _OPERANDS.findall(rest[:end])


def _scope(rest: str) -> str:
    found = _OP_NAME.search(rest)
    return found.group(1) if found else ""


def _elements(shape: str) -> int:
    return sum(hlo_text.elements(dims) for _, dims in hlo_text.ARRAY.findall(shape))


@dataclasses.dataclass(frozen=True)
class FusedAttention:
    """A fused causal attention kernel's work in one step, per device: the FLOPs of its
    matmuls (QK and PV forward; dQ, dK, dV and the recomputed scores backward, 2.5 times
    the forward) and the least bytes it must move (Q, K, V read and O and its float32
    softmax statistics written forward; those read and dQ, dK, dV written backward),
    plus buffers of its own it writes and reads back (cuDNN's per-segment accumulators)."""

    name: str
    calls: int  # per step: layers x sub-batches x microbatches
    rows: int
    seq_len: int
    heads: int
    kv_heads: int
    head_dim: int
    own_buffer_bytes: int = 0  # per call's backward, written and read once
    dtype_bytes: int = 2

    def kernels(self, device) -> list[Kernel]:
        q = self.rows * self.seq_len * self.heads * self.head_dim * self.dtype_bytes
        kv = self.rows * self.seq_len * self.kv_heads * self.head_dim * self.dtype_bytes
        stats = self.rows * self.seq_len * self.heads * 4
        # Causal: half the score matrix. Two matmuls forward, five backward (scores again).
        forward_flops = 2 * 2 * self.rows * self.heads * self.seq_len ** 2 * self.head_dim / 2
        forward_bytes = q + 2 * kv + q + stats
        backward_bytes = (q + 2 * kv + 2 * q + stats) + (q + 2 * kv) + 2 * self.own_buffer_bytes
        rows = [(f"{self.name} forward", forward_flops, forward_bytes),
                (f"{self.name} backward", 2.5 * forward_flops, backward_bytes)]
        return [Kernel(name, "attention", self.calls, flops * self.calls, nbytes * self.calls,
                       roofline(flops, nbytes, device.peak_flops, device.memory_bytes_per_s)
                       * self.calls) for name, flops, nbytes in rows]


def lines(a: Account, measured_s: float = 0.0, measured_label: str = "", top: int = 12,
          profile: dict | None = None) -> list[str]:
    """The account as text: groups, the heaviest kernels, the sum against the measured step
    (and, with a GPU profile summary, each group's measured time beside its roofline)."""
    peak = a.peak_flops / 1e12
    bandwidth = a.memory_bytes_per_s / 1e12
    out = [f"Step account on one {a.device} (roofline: {peak:g} TFLOP/s bfloat16, "
           f"{bandwidth:g} TB/s HBM)"]
    header = f"  {'group':<28}{'kernels':>8}{'TFLOP':>10}{'GB':>10}{'roofline ms':>13}"
    measured_groups = profile_by_group(a, profile) if profile else {}
    if profile:
        header += f"{'measured ms':>13}"
    out.append(header)
    for g in a.groups:
        row = (f"  {g.name:<28}{g.kernels:>8}{g.flops / 1e12:>10.3f}{g.bytes / 1e9:>10.2f}"
               f"{g.seconds * 1e3:>13.2f}")
        if profile:
            row += f"{measured_groups.get(g.name, 0.0) * 1e3:>13.2f}"
        out.append(row)
    total = (f"  {'total':<28}{sum(g.kernels for g in a.groups):>8}"
             f"{sum(g.flops for g in a.groups) / 1e12:>10.3f}"
             f"{sum(g.bytes for g in a.groups) / 1e9:>10.2f}{a.seconds * 1e3:>13.2f}")
    if profile:
        total += f"{sum(measured_groups.values()) * 1e3:>13.2f}"
    out.append(total)
    if measured_s > 0:
        out.append(f"  measured step {measured_s * 1e3:.2f} ms ({measured_label}): the "
                   f"roofline is {a.seconds / measured_s:.0%} of it; "
                   f"{(measured_s - a.seconds) * 1e3:.2f} ms are launch gaps, kernels below "
                   f"their roofline and what a compile without a GPU does not show")
    out += [f"  note: {note}" for note in a.notes]
    if top <= 0:
        return out
    out += ["", f"Heaviest kernels ({top} of {len(a.kernels)}, by roofline time)",
            f"  {'kernel':<44}{'group':<16}{'runs':>5}{'GFLOP':>10}{'MB':>10}{'ms':>8}"]
    for k in sorted(a.kernels, key=lambda k: -k.seconds)[:top]:
        out.append(f"  {k.name[:43]:<44}{k.group[:15]:<16}{k.runs:>5}{k.flops / 1e9:>10.1f}"
                   f"{k.bytes / 1e6:>10.1f}{k.seconds * 1e3:>8.3f}")
    return out


def profile_by_group(a: Account, profile: dict) -> dict[str, float]:
    """A GPU profile summary ({kernel name: seconds per step}, bench/step_account.py reads
    it from jax's profiler) summed by the account's group of each named kernel; kernels the
    account does not name (cuDNN's own, library launches) count as "attention" when cuDNN's
    and otherwise as elementwise."""
    group_of = {k.name: k.group for k in a.kernels}
    found = defaultdict(float)
    for name, seconds in profile.items():
        group = group_of.get(name)
        if group is None:
            group = "attention" if "fmha" in name or "cudnn" in name.lower() else \
                "elementwise and reductions"
        found[group] += seconds
    return dict(found)
