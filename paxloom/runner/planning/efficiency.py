"""How much of its peak a GPU's matmul-bound step reaches, and what recomputation costs:
the constants of the step-time estimate (step_time.py), fitted on measured runs.

On the MFU basis (model FLOPs, PaLM's 6N + 12LHQT, per second over peak): a token's
matmul work grows as D^2 and the rest of its work (norms, softmax, attention's memory-bound
parts, optimizer, kernel launches) about as D, so the share of the step spent in matmuls
rises with the width D; and each matmul runs closer to peak the more rows M it has (the
tokens a device's matmuls take at once: wave and tile quantisation, fixed costs per
kernel). The same saturation in both:

    eff(D, M) = e_max * D / (D + h) * M / (M + m) * device_scale

Recomputed matmuls (rematerialisation, the chunked loss's logits) cost `recompute_share`
of their time at that efficiency: they run where the GPU would otherwise wait on memory.

The constants are fitted by `python -m paxloom.tools.fit_step_time` on the runs of one H200
(layers/gpu_measurements.json, jax 0.11.2, 2026-11-27, bench/gpu_bench.py, cuDNN packed
attention), each planned by XLA:GPU for one H200 and estimated with every term of
step_time.py (the saved activations' memory traffic included):

    fitted   Synthetic126M batch 4 and 16 (D=768; M=8192 and 32768 tokens)
             GPT1_3B batch 4 (D=2048)
             Llama1B batch 8, save_nothing against save_dot_with_no_batch_dims (their
             difference: recomputed FLOPs against saved activations)
    checked  Synthetic126M batch 8; Llama1B batch 8 with CHECKPOINT_POLICY=none

No A100 was measured here. Its device_scale is fitted on ONE published row, Pax's GPT126M
on 64 A100 80GB (2068.5 sequences/s, the performance table of Pax's GPU README), by the
analytic estimate of that layout; Pax's 5B and 175B rows are the held-out check.
"""

import dataclasses

from paxloom.runner.planning import gpu_target


@dataclasses.dataclass(frozen=True)
class Calibration:
    """eff(D, M) = e_max * D/(D + half_width) * M/(M + half_rows) * device_scale for one
    GPU kind, and the share of recomputed FLOPs' time a step pays."""

    e_max: float
    half_width: float  # h: the width at which half of e_max is reached
    half_rows: float  # m: the tokens per matmul at which half is reached
    device_scale: float
    recompute_share: float
    source: str

    def efficiency(self, model_dims: int, tokens_per_pass: float) -> float:
        return (self.e_max * model_dims / (model_dims + self.half_width)
                * tokens_per_pass / (tokens_per_pass + self.half_rows) * self.device_scale)


@dataclasses.dataclass(frozen=True)
class PublishedRun:
    """A run someone else published: the layout (ICI x DCN over the five mesh axes) and its
    throughput."""

    name: str
    experiment: str
    ici: tuple[int, ...]
    dcn: tuple[int, ...]
    percore_batch_size: int
    checkpoint_policy: str
    sequences_per_s: float


# Pax's GPU README (seed 002): DGX A100 80GB nodes, 2048 tokens a sequence. The first sets
# the A100's scale; the other two are the held-out check.
PAX_A100_SOURCE = "the performance table of Pax's GPU README (paxml/contrib/gpu/scripts_gpu)"
PAX_A100_RUNS = (
    PublishedRun("126M", "experiments.GPT126M", (1, 8, 1, 1, 1), (1, 8, 1, 1, 1), 4, "none",
                 2068.5),
    PublishedRun("5B", "experiments.GPT5B", (1, 1, 4, 1, 2), (1, 32, 1, 1, 1), 8,
                 "save_dot_with_no_batch_dims", 450.6),
    PublishedRun("175B", "experiments.GPT175B", (1, 1, 8, 1, 1), (1, 1, 32, 1, 1), 6,
                 "save_nothing", 17.5),
)

MEASUREMENTS = "layers/gpu_measurements.json, one H200, jax 0.11.2, 2026-11-27"

# Fitted by `python -m paxloom.tools.fit_step_time` (2026-12-02: plans compiled with the
# launchers' XLA flags, cuBLAS GEMMs), rounded.
E_MAX = 0.863
HALF_WIDTH = 947.0
HALF_ROWS = 1350.0
RECOMPUTE_SHARE = 0.19
A100_SCALE = 0.81

_FIT = (f"e_max {E_MAX}, h {HALF_WIDTH:g}, m {HALF_ROWS:g} and recomputation at "
        f"{RECOMPUTE_SHARE:g} of its time, fitted on H200 runs of Synthetic126M, GPT1_3B and "
        f"Llama1B ({MEASUREMENTS}; python -m paxloom.tools.fit_step_time)")
_HOPPER = Calibration(E_MAX, HALF_WIDTH, HALF_ROWS, 1.0, RECOMPUTE_SHARE,
                      f"{_FIT}; scale 1.0 (measured on this GPU)")
_HOPPER_H100 = Calibration(E_MAX, HALF_WIDTH, HALF_ROWS, 1.0, RECOMPUTE_SHARE,
                           f"{_FIT}; scale 1.0 (an H100 ran above the H200's curve: GPT1_3B "
                           f"MFU 0.524 and Synthetic5B 0.659 unpacked, docs/performance.md, "
                           f"2026-11-24)")
_AMPERE = Calibration(
    E_MAX, HALF_WIDTH, HALF_ROWS, A100_SCALE, RECOMPUTE_SHARE,
    f"{_FIT}; scale {A100_SCALE} fitted on ONE published row, Pax's GPT126M on 64 A100 80GB "
    f"(2068.5 sequences/s; {PAX_A100_SOURCE}); its 5B and 175B rows are the held-out check. "
    f"No A100 was measured here: replace this with a measured row when there is one")

CALIBRATION = {
    "h100": _HOPPER_H100,
    "h200": _HOPPER,
    "a100-80gb": _AMPERE,
    "a100-40gb": _AMPERE,  # the same chip and clocks as the 80GB part, less memory
}


def calibration(device_key: str) -> Calibration:
    """The constants of `device_key`'s GPU (a DEVICE_KINDS key or an alias of one)."""
    key = gpu_target.canonical(device_key)
    if key not in CALIBRATION:
        raise KeyError(f"no efficiency calibration for {device_key!r}: one of "
                       f"{', '.join(CALIBRATION)}")
    return CALIBRATION[key]


def efficiency(device_key: str, model_dims: int, tokens_per_pass: float) -> float:
    """The MFU a compute-bound step of a model `model_dims` wide, `tokens_per_pass` tokens
    a device at a time, reaches on `device_key`."""
    return calibration(device_key).efficiency(model_dims, tokens_per_pass)
