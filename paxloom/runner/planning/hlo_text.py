"""What a compiled SPMD program does, read from its HLO text (`compiled.as_text()`).

Two readings for the plan (paxloom/runner/planning/plan.py): the bytes its collectives move per mesh axis
(step_traffic), and the float32 copies of bfloat16 arrays XLA:CPU makes (upcast_copies).

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
collectives count NUM_LAYERS times, using the trip count XLA records on the loop
(`known_trip_count`). Branches of a conditional each count as if taken.

XLA:CPU computes many bfloat16 operations in float32 and, where that converts a whole
array, keeps a float32 copy a GPU would not need; upcast_copies lists those copies so a
reader can tell how much of the CPU's memory figure is the CPU's own.
"""

import dataclasses
import math
import re
from collections import defaultdict

import numpy as np

OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_ASYNC = "-start"  # XLA:GPU runs collectives asynchronously: `all-gather-start` ... `-done`

_COMPUTATION = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.*?)\s"
                          r"(?P<op>[a-z][\w\-]*)\((?P<rest>.*)$")
_CALLEE = re.compile(r"\b(?:calls|to_apply|body|condition)=%([\w.\-]+)")
_CALLEE_LISTS = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_ARRAY = re.compile(r"\b(pred|[a-z]+\d+[a-z0-9]*)\[([\d,]*)\]")  # not token[]


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


def step_traffic(hlo_text: str, mesh_shape: dict[str, int], ici_shape, dcn_shape
                 ) -> list[Traffic]:
    """Per (op, axes) traffic of one execution of the program in `hlo_text`.

    `mesh_shape` maps axis names to sizes in mesh order; `ici_shape` and `dcn_shape` split
    each size into its within-node and across-node factors.
    """
    computations, calls = _parse(hlo_text)
    runs = _executions(computations, calls)
    totals: dict[tuple, list] = defaultdict(lambda: [0, 0.0, 0.0])
    for name, instructions in computations.items():
        for _, shape, op, rest in instructions:
            if op.endswith(_ASYNC) and op[:-len(_ASYNC)] in OPS:  # XLA:GPU's async form
                op, shape = op[:-len(_ASYNC)], _async_result(op[:-len(_ASYNC)], shape)
            if op not in OPS or not runs.get(name):
                continue
            nbytes = _shape_bytes(shape)
            if op == "collective-permute":
                pairs = _pairs(rest)
                moving = [(s, t) for s, t in pairs if s != t]
                if not moving:
                    continue
                axes, links = _axes_of([list(p) for p in moving], mesh_shape, ici_shape,
                                       dcn_shape)
                group, buffer, sent = 2, nbytes, nbytes
            else:
                groups = _replica_groups(rest, math.prod(mesh_shape.values()))
                if not groups:  # a form this parser does not know: bytes, but no axes
                    axes, links, group, buffer, sent = (), "?", 0, nbytes, nbytes
                elif len(groups[0]) == 1:
                    continue  # a no-op over one device
                else:
                    axes, links = _axes_of(groups, mesh_shape, ici_shape, dcn_shape)
                    group = len(groups[0])
                    buffer, sent = _ring_bytes(op, nbytes, group)
            key = (op, axes, links, group)
            totals[key][0] += runs[name]
            totals[key][1] += runs[name] * buffer
            totals[key][2] += runs[name] * sent
    return sorted((Traffic(op, axes, links, group, count, buffer, sent)
                   for (op, axes, links, group), (count, buffer, sent) in totals.items()),
                  key=lambda t: -t.sent_bytes)


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
    computations, _ = _parse(hlo_text)
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
            if operand.startswith("bf16[") and _ARRAY.match(operand).group(2) == \
                    _ARRAY.match(shape).group(2):
                copies.append((shape.split("{")[0], _shape_bytes(shape)))
    return sorted(copies, key=lambda c: -c[1])


def _ring_bytes(op: str, nbytes: int, n: int) -> tuple[float, float]:
    """(whole buffer, bytes sent) per device for a result of `nbytes` over `n` devices."""
    if op == "all-reduce":  # reduce-scatter then all-gather
        return nbytes, 2 * (n - 1) / n * nbytes
    if op == "reduce-scatter":  # the result is one shard of the reduced buffer
        return n * nbytes, (n - 1) * nbytes
    return nbytes, (n - 1) / n * nbytes  # all-gather (result is whole), all-to-all


def _parse(hlo_text: str):
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


def _executions(computations, calls) -> dict[str, int]:
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


def _shape_bytes(shape: str) -> int:
    """Bytes of an HLO result shape: one array, or a tuple of them (layouts ignored)."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
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
    """(mesh axes the groups vary along, which links that crosses)."""
    names = list(mesh_shape)
    axes, links = set(), set()
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
    link = "+".join(k for k in ("ICI", "DCN") if k in links)
    return tuple(n for n in names if n in axes), link
