"""XLA_FLAGS: the ones the GPU launchers set, and those from the Pax GPU scripts that
today's XLA no longer knows.

The launchers in scripts_gpu/ set GPU_DEFAULTS (scripts_gpu/common.sh, which a test holds
equal to it); a plan compiled with XLA:GPU sets them too (use_gpu_defaults), so that it
compiles the program those launchers run (cuBLAS GEMMs, the latency-hiding scheduler).

XLA aborts the whole process (a C++ fatal error, no Python traceback) on an unknown
flag in XLA_FLAGS, and paxml's run_*.sh scripts export several flags that were
deleted since. Dropping exactly those, with one note, lets the scripts run as they
are; any other unknown flag still reaches XLA and fails there, as it should.
"""

import os

from paxloom.core.errors import UserError

# Flag name -> what replaced it. Sources: openxla/xla#11422 (April 2024) deleted the
# async-collective switches (async collectives are the default); command buffers
# replaced CUDA graph levels; the others were removed when their passes became
# unconditional or were deleted.
RETIRED = {
    "--xla_gpu_enable_async_all_gather": "on by default",
    "--xla_gpu_enable_async_reduce_scatter": "on by default",
    "--xla_gpu_enable_async_all_reduce": "on by default",
    "--xla_gpu_simplify_all_fp_conversions": "always done",
    "--xla_gpu_enable_triton_softmax_fusion": "removed",
    "--xla_gpu_graph_level": "use --xla_gpu_enable_command_buffer",
}


# scripts_gpu/common.sh's BASE_XLA_FLAGS default, from the Pax GPU README's recommendations.
GPU_DEFAULTS = "--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_triton_gemm=false"


def use_gpu_defaults(environ=os.environ) -> None:
    """XLA_FLAGS as scripts_gpu/common.sh makes them, before jax starts: $BASE_XLA_FLAGS
    (default GPU_DEFAULTS; empty for none) first, the flags already set after it, so they win."""
    base = environ.get("BASE_XLA_FLAGS", GPU_DEFAULTS)
    environ["XLA_FLAGS"] = " ".join(f for f in (base, environ.get("XLA_FLAGS", "")) if f)


def drop_retired(environ=os.environ) -> list[str]:
    """Remove retired flags from environ["XLA_FLAGS"]; return the ones removed."""
    flags = environ.get("XLA_FLAGS", "").split()
    kept, dropped = [], []
    for flag in flags:
        (dropped if flag.partition("=")[0] in RETIRED else kept).append(flag)
    if dropped:
        environ["XLA_FLAGS"] = " ".join(kept)
    return dropped


def note(dropped: list[str]) -> str:
    names = ", ".join(f"{f.partition('=')[0]} ({RETIRED[f.partition('=')[0]]})" for f in dropped)
    return f"note: ignoring XLA_FLAGS that this XLA no longer has: {names}"


def check_host_device_count(environ=os.environ) -> None:
    """--xla_force_host_platform_device_count below 1 makes jax fail to start its CPU
    backend with a traceback: a one-line UserError names it first."""
    for flag in environ.get("XLA_FLAGS", "").split():
        name, _, value = flag.partition("=")
        if name == "--xla_force_host_platform_device_count":
            try:
                count = int(value)
            except ValueError:
                count = 0
            if count < 1:
                raise UserError(f"XLA_FLAGS has {flag}: the number of CPU devices must be at "
                                f"least 1, e.g. --xla_force_host_platform_device_count=8")
