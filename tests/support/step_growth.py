"""How much one train step grows a fresh process's resident memory: the independent check of
a plan's peak (tests/test_plan.py). Run as

    python -m tests.support.step_growth '{"ICI_MESH_SHAPE": [2, 2, 2], ...}' RUN_DIR

It builds the tiny model's trainer with those overrides, compiles and runs one step, and
prints one JSON line: the growth of the process's resident set over the step, the device
count, XLA's memory analysis of the step's peak a device, and a digest of the compiled
program (to tie them to the planned program).

A fresh process, because the growth depends on what the process did before: in a pytest
worker that had run 80 other tests the same step grew it by 0.97 of what it grows a process
that only built this trainer (1.14-1.20), and CI has seen 0.76-0.78.
"""

import ctypes
import gc
import hashlib
import json
import re
import sys

import jax

from tests.support.training import make_trainer

M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def program_lines(compiled) -> list[str]:
    """The compiled program's instructions without their source-location metadata."""
    return [re.sub(r",? metadata=\{.*?\}(?=,|$)", "", line)
            for line in compiled.as_text().splitlines() if " = " in line]


def program_digest(compiled) -> str:
    return hashlib.sha256("\n".join(program_lines(compiled)).encode()).hexdigest()


def resident_after_reset() -> int | None:
    """Current resident bytes, after resetting the high-water mark (None where Linux's
    /proc/self/clear_refs is not writable)."""
    # The step's buffers must come from fresh pages for the process to grow by them. glibc
    # serves a large block from its heap, reusing what was freed before, once its mmap
    # threshold has risen with use; a fixed threshold maps every block of 128 KiB or more
    # anew, and malloc_trim hands back the freed heap.
    gc.collect()
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    libc.malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return _status("VmRSS")


def peak_resident() -> int:
    return _status("VmHWM")


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def main(argv: list[str]) -> None:
    overrides, run_dir = json.loads(argv[1]), argv[2]
    trainer = make_trainer(run_dir, **overrides)
    state = trainer.init_state()
    batch = trainer.to_device(trainer.make_train_input().next_batch())
    with jax.set_mesh(trainer.mesh):
        ran = trainer.train_step.lower(state, batch).compile()
    jax.block_until_ready((state, batch))  # the initialisation's buffers before the baseline
    gc.disable()  # nothing freed by a collection while the step runs
    before = resident_after_reset()
    _, metrics = ran(state, batch)
    jax.block_until_ready(metrics)
    grown = None if before is None else peak_resident() - before
    stats = ran.memory_analysis()
    analysed = (stats.argument_size_in_bytes + stats.output_size_in_bytes
                - stats.alias_size_in_bytes + stats.temp_size_in_bytes)
    print(json.dumps({"grown_bytes": grown, "devices": len(jax.devices()),
                      "analysed_peak_bytes": analysed, "program": program_digest(ran)}))


if __name__ == "__main__":
    main(sys.argv)
