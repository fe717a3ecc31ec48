"""The check before the first train step: does the compiled step fit the devices?

XLA reports an out-of-memory only when the step first runs, as a long traceback; but the
compiled step already says what it needs (its memory analysis: arguments, outputs not
written over donated arguments, temporaries), and a GPU's allocator says what it can
give. The runner compiles the step ahead of its first call, compares the two, and stops
a step that cannot fit with one line naming the knobs that make it smaller. XLA:CPU's
allocator gives no limit, so on CPU the check runs only with --device_memory_gb.
"""

from paxloom.core.errors import UserError

GiB = 2**30
# What lowers a step's memory, in the order a user would try them.
KNOBS = ("--fdl.PERCORE_BATCH_SIZE (or GRADIENT_ACCUMULATION_STEPS)", "--fdl.CHECKPOINT_POLICY",
         "--fdl.MAX_SEGMENTS_PER_SEQ", "the mesh (--fdl.ICI_MESH_SHAPE: FSDP or tensor "
         "parallelism)")


def step_bytes(compiled) -> int | None:
    """The device memory the compiled step uses beyond its donated arguments' own buffers:
    outputs not written over donated arguments, and temporaries. None where the backend
    gives no memory analysis."""
    try:
        analysis = compiled.memory_analysis()
    except NotImplementedError:
        return None
    if analysis is None:
        return None
    return (analysis.output_size_in_bytes - analysis.alias_size_in_bytes
            + analysis.temp_size_in_bytes)


def free_bytes(devices, stated_gb: float = 0.0) -> int | None:
    """What the least free of `devices` can still give: `stated_gb` (GB, --device_memory_gb)
    less what it holds now, else its allocator's limit less what it holds; None where
    neither is known (XLA:CPU)."""
    free = []
    for device in devices:
        stats = device.memory_stats() or {}
        limit = int(stated_gb * 1e9) if stated_gb > 0 else stats.get("bytes_limit")
        if limit is None:
            return None
        free.append(limit - stats.get("bytes_in_use", 0))
    return min(free) if free else None


def check_fits(compiled, devices, stated_gb: float = 0.0, what: str = "the train step") -> None:
    """UserError (one line: exit 2 before the first step) when `compiled` needs more than
    the devices can give; nothing when it fits or either side is unknown."""
    needed, free = step_bytes(compiled), free_bytes(devices, stated_gb)
    if needed is None or free is None or needed <= free:
        return
    source = (f"--device_memory_gb={stated_gb:g}" if stated_gb > 0
              else "the device's allocator")
    raise UserError(
        f"{what} needs {needed / GiB:.2f} GiB per device beyond the state it holds, and "
        f"{devices[0].device_kind} has {max(free, 0) / GiB:.2f} GiB free ({source}): it would "
        f"run out of memory; lower {', '.join(KNOBS)}; --mode=plan shows what each saves")
