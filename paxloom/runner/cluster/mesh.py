"""The device mesh: ICI x DCN over axes (stage, replica, data, context, mdl).

ICI_MESH_SHAPE lays out the devices of one node (NVLink); DCN_MESH_SHAPE lays out the
nodes (the slow network between them). The mesh size along each axis is
ici[i] * dcn[i]. A shape of three entries [replica, data, mdl] has one pipeline stage;
four entries put the stage count first, as Pax's pipelined configs do; five add the
context axis before mdl (paxloom/core/mesh_axes.py). A node is one process, as jax's hybrid mesh has it, or, when a job
runs several processes per node (Pax's example_slurm_pile.sub starts one per GPU),
the processes that share a node: SLURM_NODEID where srun set it, else the host name.
"""

import math
import os
import socket
import zlib

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from paxloom.core.errors import UserError
from paxloom.core.mesh_axes import (
    BATCH_AXES,
    CONTEXT_AXIS,
    MESH_AXIS_NAMES,
    full_shape,
    written_shapes,
)


def create_mesh(ici_mesh_shape, dcn_mesh_shape, devices=None) -> Mesh:
    """A Mesh over `devices` (default: all), or UserError naming a shape that fits."""
    devices = list(jax.devices() if devices is None else devices)
    num_processes = len({d.process_index for d in devices})
    num_devices = len(devices)
    ici, dcn = full_shape(ici_mesh_shape), full_shape(dcn_mesh_shape)
    if math.prod(ici) * math.prod(dcn) != num_devices:
        raise _size_error(ici_mesh_shape, dcn_mesh_shape, devices, num_processes)
    if num_processes == 1:
        if math.prod(dcn) != 1:
            raise _dcn_error(dcn_mesh_shape, num_processes)
        return Mesh(np.asarray(devices).reshape(ici), MESH_AXIS_NAMES)
    if math.prod(dcn) == num_processes:
        device_array = mesh_utils.create_hybrid_device_mesh(
            ici, dcn, devices=devices, process_is_granule=True
        )
        return Mesh(device_array, MESH_AXIS_NAMES)
    nodes = _devices_by_node(devices)
    if len(nodes) != math.prod(dcn) or any(len(d) != math.prod(ici) for d in nodes):
        raise _dcn_error(dcn_mesh_shape, num_processes, len(nodes))
    return Mesh(_hybrid(ici, dcn, nodes), MESH_AXIS_NAMES)


def _size_error(ici_mesh_shape, dcn_mesh_shape, devices: list, num_processes: int) -> UserError:
    """The mesh does not cover this job's devices: the shapes as the user writes them (three
    entries when there is one stage and no context axis), the shapes nearest them that fit,
    and on CPU how to get more."""
    ici, dcn = written_shapes(ici_mesh_shape, dcn_mesh_shape)
    wanted, num_devices = math.prod(ici) * math.prod(dcn), len(devices)
    per_process = num_devices // num_processes
    # A DCN shape that already spans the processes is kept, so only ICI is off.
    fit_dcn = (full_shape(dcn_mesh_shape) if math.prod(dcn) == num_processes
               else _nearest_shape(dcn_mesh_shape, num_processes))
    fit_ici = _nearest_shape(ici_mesh_shape, num_devices // math.prod(fit_dcn))
    fit_ici, fit_dcn = written_shapes(fit_ici, fit_dcn)
    cpu = (f"; on CPU, XLA_FLAGS=--xla_force_host_platform_device_count={wanted} gives each "
           f"process {_count(wanted, 'device')}"
           if devices[0].platform == "cpu" and num_processes == 1 else "")
    return UserError(
        f"ICI_MESH_SHAPE={ici} x DCN_MESH_SHAPE={dcn} covers {_count(wanted, 'device')}, but "
        f"this job has {num_devices} ({_count(num_processes, 'process')} x {per_process}); try "
        f"--fdl.ICI_MESH_SHAPE={_flag(fit_ici)} --fdl.DCN_MESH_SHAPE={_flag(fit_dcn)}"
        f"{cpu}")


# When several shapes are as near, the axis changed is the first of these: data parallelism
# changes nothing but the batch, while the context and stage counts must divide the
# sequence and the layers.
_CHANGE_FIRST = ("replica", "data", "mdl", "context", "stage")


def _nearest_shape(mesh_shape, size: int) -> list[int]:
    """`mesh_shape` over MESH_AXIS_NAMES with its non-1 axes rescaled to cover `size`
    devices: the fewest of those axes dropped to 1, then the smallest change (by factors),
    made on the largest axes, then on the fewest; pure data parallelism when the shape has
    no axis above 1."""
    shape = full_shape(mesh_shape)
    axes = [i for i, n in enumerate(shape) if n > 1]
    divisors = [d for d in range(1, size + 1) if size % d == 0]

    def splits(n: int, k: int):  # every way to write n as an ordered product of k factors
        if k == 1:
            yield (n,)
            return
        for f in divisors:
            if n % f == 0:
                for rest in splits(n // f, k - 1):
                    yield (f, *rest)

    def cost(factors):
        old = [shape[i] for i in axes]
        change = [abs(math.log2(new / was)) for new, was in zip(factors, old, strict=True)]
        changed = sorted(_CHANGE_FIRST.index(MESH_AXIS_NAMES[i])
                         for i, c in zip(axes, change, strict=True) if c)
        return (sum(new == 1 for new in factors), round(sum(change), 9),
                -sum(c * was for c, was in zip(change, old, strict=True)), len(changed), changed)

    if not axes:
        axes = [MESH_AXIS_NAMES.index("replica")]
    best = min(splits(size, len(axes)), key=cost)
    for i, n in zip(axes, best, strict=True):
        shape[i] = n
    return shape


def _flag(shape) -> str:
    """A shape as a --fdl flag writes it: [1,8,1]."""
    return "[" + ",".join(str(n) for n in shape) + "]"


def _count(n: int, noun: str) -> str:
    """'1 device', '8 devices', '2 processes'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith('s') else 's'}"


def _dcn_error(dcn, num_processes: int, num_nodes: int | None = None) -> UserError:
    nodes = f" on {num_nodes} nodes" if num_nodes is not None else ""
    return UserError(
        f"DCN_MESH_SHAPE={list(dcn)} has {math.prod(dcn)} slices, but there are {num_processes} "
        f"processes{nodes}; DCN_MESH_SHAPE spans nodes and ICI_MESH_SHAPE the devices of each, "
        f"e.g. --fdl.DCN_MESH_SHAPE=[{num_nodes or num_processes},1,1]"
    )


def _devices_by_node(devices) -> list[list]:
    """The devices grouped by the node their process runs on, nodes in order, each node's
    devices by process then id (so each process's batch rows stay contiguous)."""
    from jax.experimental import multihost_utils

    node = os.environ.get("SLURM_NODEID", "")
    key = int(node) if node.isdigit() else zlib.crc32(socket.gethostname().encode()) % 2**31
    node_of_process = np.asarray(multihost_utils.process_allgather(np.int32(key))).ravel()
    groups: dict[int, list] = {}
    for device in sorted(devices, key=lambda d: (d.process_index, d.id)):
        groups.setdefault(int(node_of_process[device.process_index]), []).append(device)
    return [groups[k] for k in sorted(groups)]


def _hybrid(ici, dcn, nodes: list[list]) -> np.ndarray:
    """Each node's devices laid out as ICI, the nodes as DCN (jax's hybrid mesh, with
    nodes for granules)."""
    blocks = np.empty(len(nodes), dtype=object)
    for i, node_devices in enumerate(nodes):
        blocks[i] = np.asarray(node_devices, dtype=object).reshape(ici)
    return np.block(blocks.reshape(dcn).tolist())


def mesh_shape(mesh: Mesh) -> tuple[int, ...]:
    return tuple(mesh.shape[name] for name in MESH_AXIS_NAMES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of a [batch, seq] input array: rows over the batch axes, each row's tokens
    over the context axis."""
    return NamedSharding(mesh, P(BATCH_AXES, CONTEXT_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def process_batch_rows(mesh: Mesh, batch_size: int) -> tuple[int, int]:
    """The contiguous rows [start, stop) of the global batch this process must load."""
    sharding = batch_sharding(mesh)
    index_map = sharding.addressable_devices_indices_map((batch_size, mesh.shape[CONTEXT_AXIS]))
    starts = [idx[0].start or 0 for idx in index_map.values()]
    stops = [batch_size if idx[0].stop is None else idx[0].stop for idx in index_map.values()]
    start, stop = min(starts), max(stops)
    rows = set()
    for a, b in zip(starts, stops, strict=True):
        rows.update(range(a, b))
    if len(rows) != stop - start:
        raise UserError(
            "this process's devices hold non-contiguous batch rows; order DCN_MESH_SHAPE "
            "so that data-parallel axes span processes (e.g. [N,1,1])"
        )
    return start, stop
