"""The devices a run's graph is built for, determined once: this process's devices, or the
GPU that --mode=plan plans for without one. The config builder reads it to choose the
attention kernel and to refuse FP8 where there are no FP8 tensor cores (unless the graph is
only printed: --print_config)."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class TargetDevice:
    platform: str  # jax's platform name: "gpu", "cpu", "tpu"
    kind: str  # e.g. "NVIDIA H100 80GB HBM3"
    compute_capability: tuple[int, ...] = (0,)  # the oldest device's; (0,) off GPUs
    planned: bool = False  # compiled for (--mode=plan), not run on
    # Built to be printed (--print_config), neither run nor compiled: settings that only
    # a GPU can run (cuDNN attention, FP8) are shown, not refused, on any machine.
    printed: bool = False

    @property
    def hopper_or_newer(self) -> bool:
        """Compute capability 9.0 or more: cuDNN's packed attention (layers/attention.py)."""
        return self.platform == "gpu" and self.compute_capability >= (9, 0)

    @property
    def fp8_tensor_cores(self) -> bool:
        """Compute capability 8.9 (Ada) or more: FP8 matmuls (layers/fp8.py)."""
        return self.platform == "gpu" and self.compute_capability >= (8, 9)


def compute_capability(device) -> tuple[int, ...]:
    """A GPU device's compute capability, e.g. (9, 0); (0,) for a device without one."""
    return tuple(int(x) for x in str(getattr(device, "compute_capability", "0")).split("."))


def of_devices(devices) -> TargetDevice:
    """The target of a run on `devices` (jax devices; every one must qualify)."""
    devices = list(devices)
    return TargetDevice(platform=devices[0].platform, kind=devices[0].device_kind,
                        compute_capability=min(compute_capability(d) for d in devices))


def this_process(printed: bool = False) -> TargetDevice:
    """This process's devices (starts jax's backends); `printed`: for --print_config."""
    import jax

    return dataclasses.replace(of_devices(jax.devices()), printed=printed)
