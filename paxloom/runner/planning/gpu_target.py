"""XLA:GPU without a GPU: the planned train step compiled by the GPU compiler for a named GPU.

XLA compiles for a GPU it is not running on when given the GPU's description (a
GpuTargetConfigProto: compute capability, SMs, shared memory, memory size, ...): jax exposes
this as a deviceless topology of the CUDA PJRT plugin (`jax.experimental.topologies`), whose
devices a mesh can hold and a jitted function can be compiled for, not run on. The
compiled program is XLA:GPU's own: its fusions, its bfloat16 handling, its buffer
assignment and its collectives (async, reduce-scatters), so its memory analysis is the
GPU's, not XLA:CPU's (which keeps float32 copies a GPU does not; paxloom/runner/planning/plan.py).
Not done without the GPU: autotuning (default GEMM and fusion configurations) and
anything that needs the cuDNN library at compile time (the plan traces cuDNN and Pallas
attention as a plain-JAX flash kernel).

The plugin (jax-cuda13-pjrt and jax-cuda13-plugin of the locked jax's release, the XLA the
GPU machines run: CUDA 13, cuDNN 9.19) is installed
by `make install` into its own directory, `<venv>/xla-gpu-compiler`, not into the
environment's site-packages: on a machine without a GPU driver its loader prints a line
per CUDA stub whenever jax starts, and only a plan needs it. A plan puts that directory on
the import path while jax starts its backends, and takes it off after (on a GPU machine
whose jax already has a CUDA plugin, that one is used).
"""

import contextlib
import dataclasses
import importlib.util
import math
import os
import sys

from paxloom.core.errors import UserError

# Where `make install` puts the plugin (requirements-plan.txt); PAXLOOM_XLA_GPU_COMPILER
# names another directory.
PLUGIN_DIR = "xla-gpu-compiler"
PLUGINS = ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")


@dataclasses.dataclass(frozen=True)
class GpuTarget:
    """What XLA:GPU needs to know of a GPU to compile for it (NVIDIA's published figures)."""

    description: str  # the device kind a real one reports
    compute_capability: tuple[int, int]
    sm_count: int
    fpus_per_sm: int
    shared_memory_per_sm: int  # bytes
    shared_memory_per_block_optin: int  # bytes
    l2_cache_bytes: int
    memory_bandwidth: float  # bytes/s
    clock_ghz: float


_HOPPER = dict(compute_capability=(9, 0), sm_count=132, fpus_per_sm=128,
               shared_memory_per_sm=228 * 1024, shared_memory_per_block_optin=227 * 1024,
               l2_cache_bytes=50 * 2**20, clock_ghz=1.98)
_AMPERE = dict(compute_capability=(8, 0), sm_count=108, fpus_per_sm=64,
               shared_memory_per_sm=164 * 1024, shared_memory_per_block_optin=163 * 1024,
               l2_cache_bytes=40 * 2**20, clock_ghz=1.41)

# Keyed as paxloom/runner/planning/plan.DEVICE_KINDS (SXM parts).
TARGETS = {
    "h100": GpuTarget("NVIDIA H100 80GB HBM3", memory_bandwidth=3.35e12, **_HOPPER),
    "h200": GpuTarget("NVIDIA H200", memory_bandwidth=4.8e12, **_HOPPER),
    "a100-80gb": GpuTarget("NVIDIA A100-SXM4-80GB", memory_bandwidth=2.039e12, **_AMPERE),
    "a100-40gb": GpuTarget("NVIDIA A100-SXM4-40GB", memory_bandwidth=1.555e12, **_AMPERE),
}

# Other names --plan_device accepts, and the key each stands for: "a100" is the part Pax's
# published A100 figures ran on (DGX A100 80GB nodes, its GPU README).
ALIASES = {"a100": "a100-80gb"}


def canonical(key: str) -> str:
    """The TARGETS key `key` names (itself, or the key of an alias); unknown keys unchanged,
    for the caller to refuse."""
    return ALIASES.get(key, key)


def target_config(target: GpuTarget, memory_bytes: int) -> str:
    """The GpuTargetConfigProto text XLA:GPU compiles for."""
    major, minor = target.compute_capability
    return f"""
gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {target.shared_memory_per_sm}
  threads_per_core_limit: 2048
  core_count: {target.sm_count}
  fpus_per_core: {target.fpus_per_sm}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(target.memory_bandwidth)}
  l2_cache_size: {target.l2_cache_bytes}
  clock_rate_ghz: {target.clock_ghz}
  device_memory_size: {memory_bytes}
  shared_memory_per_block_optin: {target.shared_memory_per_block_optin}
  cuda_compute_capability {{ major: {major} minor: {minor} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
runtime_version {{ major: 13 minor: 0 }}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 19 }}
device_description_str: "{target.description}"
"""


def plugin_dir() -> str:
    return os.environ.get("PAXLOOM_XLA_GPU_COMPILER", os.path.join(sys.prefix, PLUGIN_DIR))


def _plugin_importable() -> bool:
    try:
        return any(importlib.util.find_spec(name) is not None for name in PLUGINS)
    except ModuleNotFoundError:  # no jax_plugins package at all
        return False


def installed() -> bool:
    """Is a CUDA PJRT plugin importable, or in the directory `make install` puts it in?"""
    return _plugin_importable() or os.path.isdir(os.path.join(plugin_dir(), "jax_plugins"))


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 to /dev/null: the plugin's C++ loader writes there directly."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def start_jax() -> None:
    """Start jax's backends with the CUDA plugin registered and only the CPU platform in use
    (a plan never touches a GPU, even on a GPU machine). Call before jax has started."""
    added = not _plugin_importable()
    if added:
        sys.path.append(plugin_dir())
    # The plugin checks the installed CUDA libraries' versions when it registers; compiling
    # needs none of them (the compiler is in the plugin), and a CPU machine has none.
    os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"
    import jax

    jax.config.update("jax_platforms", "cpu")
    try:
        with _quiet_stderr():
            jax.devices("cpu")
    finally:
        # Registered now, the plugin needs its directory no more. Off the path, it is not
        # handed to the processes this one spawns (--plan_search's workers), whose `import
        # jax` would otherwise load the plugin's CUDA modules before any stderr is quieted:
        # on a machine without CUDA, each prints XLA's "cudart_stub.cc ... Could not find
        # cuda drivers" as it loads, at C++ static initialisation, before any log level
        # (TF_CPP_MIN_LOG_LEVEL) applies.
        if added:
            sys.path.remove(plugin_dir())


def devices(key: str, memory_bytes: int, ici_shape, dcn_shape) -> list:
    """Deviceless devices of `key`'s GPU (TARGETS), as many as the mesh has: a node per
    DCN position, each with the ICI mesh's devices."""
    from jax.experimental import topologies

    nodes, per_node = math.prod(dcn_shape), math.prod(ici_shape)
    try:
        with _quiet_stderr():
            topology = topologies.get_topology_desc(
                "paxloom-plan", "cuda", target_config=target_config(TARGETS[key], memory_bytes),
                topology=f"1x{nodes}x{per_node}")
    except Exception as error:  # a plugin that is there but does not load, or too old
        detail = " ".join(str(error).split())[:200]
        raise UserError(f"--plan_compiler=gpu: XLA:GPU's plugin ({plugin_dir()}) could not "
                        f"describe a {TARGETS[key].description}: {detail}; "
                        f"--plan_compiler=cpu plans with XLA:CPU") from None
    return list(topology.devices)
