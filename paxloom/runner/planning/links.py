"""How fast a planned GPU's links move a collective's bytes: NVLink within a node, the
network between nodes, per GPU kind (keyed like paxloom/runner/planning/plan.DEVICE_KINDS).

A collective's bytes per device come from the compiled program (hlo_text.Traffic.sent_bytes:
the ring algorithm's share of its buffer, 2(n-1)/n of it for an all-reduce, (n-1)/n for an
all-gather or all-to-all, (n-1) shards for a reduce-scatter, the buffer for a permute),
so its time is those bytes over the bandwidth of the slowest link the ring crosses:

- within a node (ICI): NVLink, per GPU and direction;
- between nodes (DCN), one device per node: the GPU's own network adapter;
- both (ICI+DCN): NCCL's hierarchical rings (and NVLS/tree algorithms) spread the
  inter-node part over the NICs of every GPU of the group in the node, so the group moves
  `per_node` NICs' worth between nodes, and never more than NVLink within one.

Figures are the vendors' per-direction peaks; NCCL reaches 80-90% of them on large
messages (nccl-tests bus bandwidth), small messages less: the step-time estimate is
optimistic there and says so (step_time.lines).
"""

import dataclasses

from paxloom.runner.planning import gpu_target, hlo_text


@dataclasses.dataclass(frozen=True)
class Interconnect:
    """The links of one GPU kind's nodes."""

    nvlink_bytes_per_s: float  # per GPU, per direction, to the other GPUs of its node
    network_bytes_per_s_per_gpu: float  # per GPU, per direction, to other nodes
    gpus_per_node: int
    source: str


# HGX/DGX nodes: 8 GPUs on NVSwitch, a network adapter per GPU (the rail-optimised fabric
# of NVIDIA's reference clusters and of Pax's published A100 runs).
_HOPPER = Interconnect(
    nvlink_bytes_per_s=450e9, network_bytes_per_s_per_gpu=400e9 / 8, gpus_per_node=8,
    source="NVIDIA H100/H200 SXM datasheets: NVLink 4 900 GB/s per GPU (450 GB/s each way); "
           "ConnectX-7 400 Gb/s InfiniBand per GPU (DGX H100/H200)")
_AMPERE = Interconnect(
    nvlink_bytes_per_s=300e9, network_bytes_per_s_per_gpu=200e9 / 8, gpus_per_node=8,
    source="NVIDIA A100 SXM datasheet: NVLink 3 600 GB/s per GPU (300 GB/s each way); "
           "ConnectX-6 200 Gb/s HDR InfiniBand per GPU (DGX A100)")

INTERCONNECTS = {
    "h100": _HOPPER,
    "h200": _HOPPER,
    "a100-80gb": _AMPERE,
    "a100-40gb": _AMPERE,
}

LINKS = ("ICI", "DCN", "ICI+DCN")


def interconnect(device_key: str) -> Interconnect:
    """The links of `device_key`'s nodes (a DEVICE_KINDS key or an alias of one)."""
    key = gpu_target.canonical(device_key)
    if key not in INTERCONNECTS:
        raise KeyError(f"no interconnect for {device_key!r}: one of {', '.join(INTERCONNECTS)}")
    return INTERCONNECTS[key]


def bandwidth(links: str, per_node: int, ic: Interconnect) -> float:
    """Bytes/s per device of a collective over `links` ("ICI", "DCN", "ICI+DCN"; anything
    else, an unread group, as the network: nothing faster is assumed) with `per_node` of its
    devices in each node."""
    if links == "ICI":
        return ic.nvlink_bytes_per_s
    if links == "ICI+DCN":
        return min(ic.nvlink_bytes_per_s, max(per_node, 1) * ic.network_bytes_per_s_per_gpu)
    return ic.network_bytes_per_s_per_gpu


def seconds(traffic: hlo_text.Traffic, ic: Interconnect) -> float:
    """Per step, the time `traffic`'s collectives take on their links: the bytes each
    device sends (ring factors included) over the link's bandwidth."""
    return traffic.sent_bytes / bandwidth(traffic.links, traffic.per_node, ic)
