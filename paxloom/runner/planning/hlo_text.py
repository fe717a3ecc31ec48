"""What a compiled SPMD program does, read from its HLO text (`compiled.as_text()`).

Three readings for the plan (paxloom/runner/planning/plan.py): the bytes its collectives move per mesh axis
(step_traffic), the FLOPs of its matmuls and how many recompute (dot_flops), and the float32 copies of bfloat16
arrays XLA:CPU makes (upcast_copies).

The partitioned program (`compiled.as_text()`) names each collective's devices by their
index in the mesh's device order (`use_global_device_ids`). A collective's groups vary
along some mesh axes; those axes are where its bytes travel. Within an axis of size
ICI x DCN, position = dcn_index * ICI + ici_index (as jax's hybrid mesh lays it out), so
a group that varies the ici part crosses NVLink and one that varies the dcn part crosses
the network between nodes.

A pipelined run (a stage axis of several devices) sends each microbatch's activations from
stage to stage, and their gradients back, with collective-permutes whose pairs move along
the stage axis alone; stage_transfers picks them out of the traffic. Within the stage axis,
ici and dcn split positions as for any other, so stages within a node send over NVLink
and stages on different nodes over the network.

An instruction inside a while loop runs once per iteration: a scanned layer stack's
collectives and matmuls count NUM_LAYERS times, using the trip count XLA records on the loop
(`known_trip_count`). Branches of a conditional each count as if taken.

Whether a collective can overlap compute is the compiler's to say. XLA:GPU splits every
collective into a `-start` and a `-done` and runs it on its own stream; where its
latency-hiding scheduler found nothing to put between the two it marks the pair
`"is_sync":true` (a tensor-parallel all-reduce whose result the next matmul needs at once),
and the step waits for it. XLA:CPU schedules nothing asynchronously, so for its programs the
kind stands in for what XLA:GPU would do: weight gathers and gradient reductions
(all-gather, reduce-scatter, all-reduce over any axis but mdl) are needed only later,
tensor-parallel all-reduces, all-to-alls and permutes at once.

XLA:CPU computes many bfloat16 operations in float32 and, where that converts a whole
array, keeps a float32 copy a GPU would not need; upcast_copies lists those copies so a
reader can tell how much of the CPU's memory figure is the CPU's own.
"""

import dataclasses
import math
import re
from collections import defaultdict

import numpy as np

from paxloom.core import mesh_axes

OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_ASYNC = "-start"  # XLA:GPU runs collectives asynchronously: `all-gather-start` ... `-done`
_SYNC = re.compile(r'"is_sync":true')  # ... unless its scheduler found nothing to overlap
# For programs without `-start` pairs (XLA:CPU): the mesh axis whose all-reduces are
# tensor parallelism's, on the critical path (the last of the mesh's axes).
TENSOR_AXIS = mesh_axes.MESH_AXIS_NAMES[-1]

_COMPUTATION = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.*?)\s"
                          r"(?P<op>[a-z][\w\-]*)\((?P<rest>.*)$")
_CALLEE = re.compile(r"\b(?:calls|to_apply|body|condition)=%([\w.\-]+)")
_CALLEE_LISTS = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
ARRAY = re.compile(r"\b(pred|[a-z]+\d+[a-z0-9]*)\[([\d,]*)\]")  # not token[]


@dataclasses.dataclass(frozen=True)
class Traffic:
    """The collectives of one kind over the same mesh axes, summed over one step."""

    op: str
    axes: tuple[str, ...]  # mesh axes the groups span; () if the groups could not be read,
    # and then group_size is 0 and sent_bytes the buffer's
    links: str  # "ICI", "DCN" or "ICI+DCN"
    group_size: int
    count: int  # executions per step
    buffer_bytes: float  # per device: the whole (gathered, unreduced) buffer, summed
    sent_bytes: float  # per device: bytes a ring/bidirectional algorithm sends, summed
    # Devices of one group in one node (node = the position along the DCN factors of the
    # mesh): a group crossing nodes uses that many NICs at once (links.bandwidth). Equal to
    # group_size within a node, 1 for a group with one device per node.
    per_node: int = 1
    # Whether the step may run on while the collective is in flight (module docstring).
    asynchronous: bool = False


def step_traffic(hlo_text: str, mesh_shape: dict[str, int], ici_shape, dcn_shape
                 ) -> list[Traffic]:
    """Per (op, axes) traffic of one execution of the program in `hlo_text`.

    `mesh_shape` maps axis names to sizes in mesh order; `ici_shape` and `dcn_shape` split
    each size into its within-node and across-node factors.
    """
    computations, calls = parse(hlo_text)
    runs = executions(computations, calls)
    scheduled = any(op.endswith(_ASYNC) and op[:-len(_ASYNC)] in OPS
                    for instructions in computations.values() for _, _, op, _ in instructions)
    totals: dict[tuple, list] = defaultdict(lambda: [0, 0.0, 0.0])
    for name, instructions in computations.items():
        for _, shape, op, rest in instructions:
            started = op.endswith(_ASYNC) and op[:-len(_ASYNC)] in OPS
            if started:  # XLA:GPU's async form
                op, shape = op[:-len(_ASYNC)], _async_result(op[:-len(_ASYNC)], shape)
            if op not in OPS or not runs.get(name):
                continue
            nbytes = shape_bytes(shape)
            if op == "collective-permute":
                pairs = _pairs(rest)
                moving = [(s, t) for s, t in pairs if s != t]
                if not moving:
                    continue
                axes, links, per_node = _axes_of([list(p) for p in moving], mesh_shape,
                                                 ici_shape, dcn_shape)
                group, buffer, sent = 2, nbytes, nbytes
            else:
                groups = _replica_groups(rest, math.prod(mesh_shape.values()))
                if not groups:  # a form this parser does not know: bytes, but no axes
                    axes, links, group, buffer, sent = (), "?", 0, nbytes, nbytes
                    per_node = 1
                elif len(groups[0]) == 1:
                    continue  # a no-op over one device
                else:
                    axes, links, per_node = _axes_of(groups, mesh_shape, ici_shape, dcn_shape)
                    group = len(groups[0])
                    buffer, sent = _ring_bytes(op, nbytes, group)
            if scheduled:
                asynchronous = started and not _SYNC.search(rest)
            else:
                asynchronous = _overlaps_by_kind(op, axes)
            key = (op, axes, links, group, per_node, asynchronous)
            totals[key][0] += runs[name]
            totals[key][1] += runs[name] * buffer
            totals[key][2] += runs[name] * sent
    return sorted((Traffic(op, axes, links, group, count, buffer, sent, per_node, asynchronous)
                   for (op, axes, links, group, per_node, asynchronous), (count, buffer, sent)
                   in totals.items()),
                  key=lambda t: -t.sent_bytes)


def _overlaps_by_kind(op: str, axes: tuple[str, ...]) -> bool:
    """For a program without async pairs (XLA:CPU): whether XLA:GPU would overlap a
    collective of this kind with compute. Gathered weights and reduced gradients are
    needed a layer later or at the update; a tensor-parallel all-reduce's result feeds the
    next matmul. Groups not read (no axes) count as synchronous: nothing is assumed hidden."""
    if op in ("all-gather", "reduce-scatter"):
        return bool(axes)
    if op == "all-reduce":
        return bool(axes) and TENSOR_AXIS not in axes
    return False  # all-to-all, collective-permute


def _async_result(op: str, shape: str) -> str:
    """The result of the collective a `-start` instruction begins: an all-reduce's is the
    start's own; the others' starts return (operands, results[, scratch]), so their second
    element."""
    if op == "all-reduce":
        return shape
    if not shape.startswith("("):
        return shape
    elements, depth, start = [], 0, 1
    for i, char in enumerate(shape):
        depth += (char in "([{") - (char in ")]}")
        if depth == 1 and char == "," or depth == 0:  # a top-level comma, or the end
            elements.append(shape[start:i])
            start = i + 1
        if depth == 0:
            break
    return elements[1] if len(elements) > 1 else shape


def stage_transfers(traffic: list[Traffic], axis: str = "stage") -> list[Traffic]:
    """The pipeline's stage-to-stage sends in `traffic`: collective-permutes along the
    `axis` mesh axis only. The other collectives over it are not transfers between stages:
    all-reduces and all-gathers of what runs outside the pipeline (the embedding and
    softmax, data-parallel over the stages), and permutes that move rows along the stage
    and data axes at once (the batch relaid into microbatches)."""
    return [t for t in traffic if t.op == "collective-permute" and t.axes == (axis,)]


def upcast_copies(hlo_text: str) -> list[tuple[str, int]]:
    """(shape, bytes) of each float32 array the program makes by converting a whole
    bfloat16 array of the same shape (a convert, or a fusion of nothing else), largest first.
    Sizes, not liveness: the largest ones are what matters."""
    computations, _ = parse(hlo_text)
    fused = {_CALLEE.search(rest).group(1) for instructions in computations.values()
             for _, _, op, rest in instructions if op == "fusion"}
    converts_only = {name for name in fused
                     if sorted(op for _, _, op, _ in computations.get(name, ()))
                     == ["convert", "parameter"]}
    copies = []
    # Values inside a fusion are never whole arrays in memory: only the unfused computations.
    for name, instructions in computations.items():
        if name in fused:
            continue
        shapes = {name: shape for name, shape, _, _ in instructions}
        for _, shape, op, rest in instructions:
            callee = _CALLEE.search(rest)
            if not shape.startswith("f32[") or not (
                    op == "convert" or op == "fusion" and callee
                    and callee.group(1) in converts_only):
                continue
            operand = shapes.get(rest.split(")")[0].split(",")[0].strip().lstrip("%"), "")
            if operand.startswith("bf16[") and ARRAY.match(operand).group(2) == \
                    ARRAY.match(shape).group(2):
                copies.append((shape.split("{")[0], shape_bytes(shape)))
    return sorted(copies, key=lambda c: -c[1])


def _ring_bytes(op: str, nbytes: int, n: int) -> tuple[float, float]:
    """(whole buffer, bytes sent) per device for a result of `nbytes` over `n` devices."""
    if op == "all-reduce":  # reduce-scatter then all-gather
        return nbytes, 2 * (n - 1) / n * nbytes
    if op == "reduce-scatter":  # the result is one shard of the reduced buffer
        return n * nbytes, (n - 1) * nbytes
    return nbytes, (n - 1) / n * nbytes  # all-gather (result is whole), all-to-all


def parse(hlo_text: str):
    """{computation: [(name, result shape, opcode, rest of line)]},
    {computation: [(callee, times per execution of the caller)]}."""
    computations: dict[str, list] = {}
    calls: dict[str, list] = defaultdict(list)
    current = None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = "ENTRY" if header.group(1) else header.group(2)
            computations[current] = []
            continue
        if current is None:
            continue
        instruction = _INSTRUCTION.match(line)
        if not instruction:
            continue
        op, rest = instruction.group("op"), instruction.group("rest")
        computations[current].append((instruction.group("name"), instruction.group("shape"),
                                      op, rest))
        trips = _TRIP_COUNT.search(rest)
        for callee in _CALLEE.findall(rest):
            # A loop body (and its condition) runs once per iteration.
            times = int(trips.group(1)) if op == "while" and trips else 1
            calls[current].append((callee, times))
        for names in _CALLEE_LISTS.findall(rest):
            calls[current] += [(n.strip().lstrip("%"), 1) for n in names.split(",") if n.strip()]
    return computations, calls


def executions(computations, calls) -> dict[str, int]:
    """How many times each computation runs per execution of the entry computation."""
    order, seen = [], set()

    def visit(name):  # callers before callees (reverse post-order of the call graph)
        if name in seen:
            return
        seen.add(name)
        for callee, _ in calls.get(name, ()):
            visit(callee)
        order.append(name)

    visit("ENTRY")
    runs = defaultdict(int, {"ENTRY": 1})
    for name in reversed(order):
        for callee, times in calls.get(name, ()):
            runs[callee] += runs[name] * times
    return runs


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO result shape: one array, or a tuple of them (layouts ignored)."""
    total = 0
    for dtype, dims in ARRAY.findall(shape):
        bits = 8 if dtype == "pred" else int(re.search(r"\d+", dtype).group())
        total += math.prod(int(d) for d in dims.split(",") if d) * bits // 8
    return total


def _pairs(rest: str) -> list[tuple[int, int]]:
    found = re.search(r"source_target_pairs=\{(.*?)\}\}", rest)
    if not found:
        return []
    return [(int(a), int(b)) for a, b in re.findall(r"\{?(\d+),(\d+)", found.group(1) + "}")]


def _replica_groups(rest: str, num_devices: int) -> list[list[int]]:
    """The device groups of a collective, in any of the three forms XLA prints; [] if none."""
    explicit = re.search(r"replica_groups=\{(\{[\d,{}]*\})?\}", rest)
    if explicit:
        if not explicit.group(1):  # {}: one group of every device
            return [list(range(num_devices))]
        return [[int(d) for d in g.split(",") if d]
                for g in re.findall(r"\{([\d,]*)\}", explicit.group(1))]
    iota = re.search(r"replica_groups=\[(\d+),\d+\]<=(\[[\d,]+\](?:T\([\d,]+\))?)", rest)
    if iota:  # [groups, size] <= [dims] T(perm): iota over dims, transposed, cut into groups
        return _iota(iota.group(2)).reshape(int(iota.group(1)), -1).tolist()
    mesh = re.search(r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=\(([^)]*\)?)\))?"
                     r"\s*\{([^}]*)\}", rest)
    if mesh:
        return _mesh_groups(mesh.group(1), mesh.group(2), mesh.group(3))
    return []


def _iota(text: str) -> np.ndarray:
    """The device ids of an iota tile assignment `[dims]` or `[dims]T(perm)`, flattened."""
    dims, _, perm = re.fullmatch(r"\[([\d,]+)\](T\(([\d,]+)\))?", text).groups()
    ids = np.arange(math.prod(int(d) for d in dims.split(","))).reshape(
        [int(d) for d in dims.split(",")])
    return (ids.transpose([int(p) for p in perm.split(",")]) if perm else ids).ravel()


def _mesh_groups(axes_text: str, device_ids: str | None, grouped_text: str
                 ) -> list[list[int]]:
    """Groups of the `mesh['a'=4,'b'=2], device_ids=([2,4]T(1,0)) {'a'}` form: the device
    ids (iota when not given) laid out on the named axes; each group varies the braced axes
    (or sub-axes, 'a':(pre)size) and no other."""
    names, sizes = [], []
    for name, size in re.findall(r"'([^']+)'=(\d+)", axes_text):
        names.append(name)
        sizes.append(int(size))
    # Split every axis into (major, sub, minor) pieces so a sub-axis is a dimension of its own.
    pieces = [[size] for size in sizes]
    grouped = []
    for name, pre, size in re.findall(r"'([^']+)'(?::\((\d+)\)(\d+))?", grouped_text):
        axis = names.index(name)
        if pre:
            pre, size = int(pre), int(size)
            pieces[axis] = [pre, size, sizes[axis] // (pre * size)]
            grouped.append((axis, 1))
        else:
            grouped.append((axis, 0))
    dims, index = [], {}
    for axis, parts in enumerate(pieces):
        for part, size in enumerate(parts):
            index[(axis, part)] = len(dims)
            dims.append(size)
    ids = (_iota(device_ids) if device_ids else np.arange(math.prod(sizes))).reshape(dims)
    varying = [index[g] for g in grouped]
    fixed = [d for d in range(len(dims)) if d not in varying]
    group_size = math.prod(dims[d] for d in varying)
    return ids.transpose(fixed + varying).reshape(-1, group_size).tolist()


def _axes_of(groups, mesh_shape: dict[str, int], ici_shape, dcn_shape):
    """(mesh axes the groups vary along, which links that crosses, devices of a group in
    one node). A device's node is its position along the DCN factors of every axis
    (coordinate // ICI factor); where groups differ, the fewest devices per node count."""
    names = list(mesh_shape)
    ici = np.asarray(ici_shape)[:, None]
    axes, links, per_node = set(), set(), None
    for group in groups:
        coords = np.array(np.unravel_index(np.asarray(group), list(mesh_shape.values())))
        for i, name in enumerate(names):
            along = coords[i]
            if len(set(along)) < 2:
                continue
            axes.add(name)
            if len(set(along % ici_shape[i])) > 1:
                links.add("ICI")
            if len(set(along // ici_shape[i])) > 1:
                links.add("DCN")
        nodes = len({tuple(node) for node in (coords // ici).T})
        per_node = min(per_node or len(group), len(group) // nodes)
    link = "+".join(k for k in ("ICI", "DCN") if k in links)
    return tuple(n for n in names if n in axes), link, per_node or 1


@dataclasses.dataclass(frozen=True)
class DotFlops:
    """Per device, the FLOPs of one execution's matmuls: all of them, and those that
    recompute the forward pass (rematerialisation)."""

    total: float
    recomputed: float


def dot_flops(hlo_text: str) -> DotFlops:
    """Per device, the FLOPs of the program's matmuls in one execution (one train step):
    2 x the result's elements x the contracted elements of each, loop trips counted.

    Dots sit mostly inside fusions, their operands the fusion's parameters, whose shapes
    are on the fused computation's own lines. cuBLAS calls (`__cublas$gemm`, in programs
    compiled after GEMM rewriting) carry their contracting dimensions in the backend config.
    Counts the dots XLA runs, recomputation included: the hardware FLOPs, not the model's.
    A recomputed dot is one jax traced again for the backward pass of a jax.checkpoint
    (CHECKPOINT_POLICY, the chunked loss): its op_name carries jax's name scope for that,
    `rematted_computation` (jax/_src/ad_checkpoint.py), which XLA keeps on fused and
    rewritten instructions alike."""
    computations, calls = parse(hlo_text)
    runs = executions(computations, calls)
    total = recomputed = 0.0
    for name, instructions in computations.items():
        if not runs.get(name):
            continue
        shapes = {instruction: shape for instruction, shape, _, _ in instructions}
        for _, shape, op, rest in instructions:
            flops = runs[name] * instruction_flops(shape, op, rest, shapes)
            total += flops
            if flops and _RECOMPUTED.search(rest):
                recomputed += flops
    return DotFlops(total, recomputed)


def is_matmul(op: str, rest: str) -> bool:
    """A dot, or a cuBLAS GEMM it was rewritten into."""
    return op == "dot" or op == "custom-call" and GEMM.search(rest) is not None


def instruction_flops(shape: str, op: str, rest: str, shapes: dict[str, str]) -> float:
    """The FLOPs of one execution of a matmul instruction (2 x its result's elements x the
    contracted elements; 0 for any other), its operands' shapes looked up in `shapes`."""
    if not is_matmul(op, rest):
        return 0.0
    contracting = (re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest) if op == "dot"
                   else GEMM_CONTRACTING.search(rest))
    lhs = operand_dims(rest, shapes)
    result = ARRAY.search(shape)  # a gemm returns (result, workspace): the first
    if lhs is None or result is None:
        return 0.0
    dims = [int(d) for d in re.findall(r"\d+", contracting.group(1))] if contracting else []
    return 2.0 * elements(result.group(2)) * math.prod(lhs[d] for d in dims)


_RECOMPUTED = re.compile(r'op_name="[^"]*/rematted_computation/')
GEMM = re.compile(r'custom_call_target="__cublas\$(?:lt\$matmul|gemm)')
GEMM_CONTRACTING = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')


def operand_dims(rest: str, shapes: dict[str, str]) -> list[int] | None:
    """The dimensions of an instruction's first operand: printed inline (`f32[2,3]{1,0}
    %a`) or looked up by name among its computation's instructions and parameters."""
    inline = ARRAY.search(rest.split("%", 1)[0])
    if inline is None:
        name = re.match(r"\s*%?([\w.\-]+)", rest)
        inline = ARRAY.search(shapes.get(name.group(1), "")) if name else None
    if inline is None:
        return None
    return [int(d) for d in inline.group(2).split(",") if d]


def elements(dims: str) -> int:
    return math.prod(int(d) for d in dims.split(",") if d)
