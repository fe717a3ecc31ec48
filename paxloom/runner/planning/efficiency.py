"""How much of its peak a GPU's matmul-bound step reaches, by model width: the compute
term of the step-time estimate (step_time.py), calibrated on measured runs.

On the MFU basis (model FLOPs, PaLM's 6N + 12LHQT, per second over peak): a token's
matmul work grows as D^2 and the rest of its work (norms, softmax, attention's memory-bound
parts, optimizer, kernel launches) about as D, so the share of the step spent in matmuls
rises with the width D:

    eff(D) = e_max * D / (D + h) * device_scale

Fitted on two rows of one measurement run, so that nothing else differs between them
(layers/gpu_measurements.json, one H200, jax 0.11.2, 2026-11-27, cuDNN packed attention,
`bench/gpu_bench.py ... --impls auto`/`cudnn --set MAX_SEGMENTS_PER_SEQ=32`):

    Synthetic126M, batch 4x2048, D=768:  MFU 0.300 (306,139 tokens/s)
    GPT1_3B,       batch 4x2048, D=2048: MFU 0.478 (52,056 tokens/s)

which give h = 1132, e_max = 0.7417 exactly; rounded, h = 1130 and e_max = 0.741
(eff(768) = 0.300, eff(2048) = 0.478, eff(4096) = 0.581, eff(12288) = 0.679).
Checks on an H100 (docs/performance.md, 2026-11-24, cuDNN unpacked): GPT1_3B measured 0.524 against
0.478, Synthetic5B (8 layers, D=4096) 0.659 against 0.581: within 12%, low.

There is no A100 measurement in the repository. The A100's scale is fitted on ONE published
row: Pax's GPT126M on 64 A100 80GB (8 DGX A100 nodes, data-parallel over all 64, batch 4 per
GPU, 2048 tokens): 2068.5 sequences/s (the performance table of Pax's GPU README,
paxml/contrib/gpu/scripts_gpu) = 66,192 tokens/s per GPU x 9.68e8 FLOPs per
token / 312e12 = MFU 0.205, against eff(768) = 0.300 on the H200: scale 0.68. Its other
two rows stay a held-out check, not a fit: 5B (D=4096) predicts 0.395 against 0.377
published, 175B (D=12288) 0.461 against 0.483, before communication and recomputation.
"""

import dataclasses

from paxloom.runner.planning import gpu_target


@dataclasses.dataclass(frozen=True)
class MeasuredRow:
    """One measured run the curve is fitted on or checked against."""

    experiment: str
    device: str  # DEVICE_KINDS key
    model_dims: int
    mfu: float
    source: str


@dataclasses.dataclass(frozen=True)
class Calibration:
    """eff(D) = e_max * D / (D + half_width) * device_scale for one GPU kind."""

    e_max: float
    half_width: float  # h: the width at which half of e_max is reached
    device_scale: float
    source: str


_MEASUREMENTS = "layers/gpu_measurements.json, one H200, jax 0.11.2, 2026-11-27"

# The two rows the curve is fitted on.
FIT_ROWS = (
    MeasuredRow("Synthetic126M", "h200", 768, 0.300,
                f"{_MEASUREMENTS}: Synthetic126M batch 4x2048, cuDNN packed (auto)"),
    MeasuredRow("GPT1_3B", "h200", 2048, 0.478,
                f"{_MEASUREMENTS}: GPT1_3B batch 4x2048, cuDNN packed"),
)

# Pax's published A100 runs (Pax GPU README, seed 002): DGX A100 80GB nodes, T = 2048,
# MFU = sequences/s x 2048 / GPUs x FLOPs per token / 312e12. The first sets the A100's
# scale; the other two are the held-out check.
PAX_A100_SOURCE = "the performance table of Pax's GPU README (paxml/contrib/gpu/scripts_gpu)"
PAX_A100_ROWS = (
    MeasuredRow("GPT126M, 64 GPUs, DP64, batch 4/GPU: 2068.5 sequences/s", "a100-80gb", 768,
                2068.5 * 2048 / 64 * 9.68e8 / 312e12, PAX_A100_SOURCE),
    MeasuredRow("GPT5B, 256 GPUs, DP32 FSDP4 TP2, batch 8/GPU: 450.6 sequences/s", "a100-80gb",
                4096, 450.6 * 2048 / 256 * 3.264e10 / 312e12, PAX_A100_SOURCE),
    MeasuredRow("GPT175B, 256 GPUs, FSDP256, batch 6/GPU: 17.5 sequences/s", "a100-80gb",
                12288, 17.5 * 2048 / 256 * 1.076e12 / 312e12, PAX_A100_SOURCE),
)

E_MAX = 0.741
HALF_WIDTH = 1130.0
_CURVE = (f"e_max {E_MAX} and h {HALF_WIDTH:g} fitted on the H200 rows "
          f"{FIT_ROWS[0].experiment} (D=768, MFU 0.300) and {FIT_ROWS[1].experiment} "
          f"(D=2048, MFU 0.478) of {_MEASUREMENTS}")
_HOPPER = Calibration(E_MAX, HALF_WIDTH, 1.0, f"{_CURVE}; scale 1.0 (measured on this GPU)")
_HOPPER_H100 = Calibration(E_MAX, HALF_WIDTH, 1.0,
                           f"{_CURVE}; scale 1.0 (an H100 ran above the curve: GPT1_3B 0.524, "
                           f"Synthetic5B 0.659, docs/performance.md, 2026-11-24)")
_AMPERE = Calibration(
    E_MAX, HALF_WIDTH, 0.68,
    f"{_CURVE}; scale 0.68 fitted on ONE published row, Pax's GPT126M on 64 A100 80GB "
    f"(2068.5 sequences/s, MFU 0.205 = 0.68 x eff(768); {PAX_A100_SOURCE}); its 5B and 175B "
    f"rows are the held-out check. No A100 was measured here: replace this with a measured "
    f"row when there is one")

CALIBRATION = {
    "h100": _HOPPER_H100,
    "h200": _HOPPER,
    "a100-80gb": _AMPERE,
    "a100-40gb": _AMPERE,  # the same chip and clocks as the 80GB part, less memory
}

# The share of recomputed FLOPs (rematerialisation) that costs step time. Measured on one
# H200 (layers/gpu_measurements.json, 2026-11-27, Llama1B batch 8x2048, cuDNN packed):
# CHECKPOINT_POLICY=save_nothing trained at MFU 0.434 and none at 0.421, despite about 4/3
# the FLOPs: recomputation cost about nothing there (it fills time the GPU would wait on
# memory). 0.25 is the conservative choice: a larger model with less to hide behind pays some.
KAPPA_RECOMPUTE = 0.25
KAPPA_SOURCE = ("layers/gpu_measurements.json, H200 2026-11-27, Llama1B batch 8: save_nothing "
                "MFU 0.434 vs none 0.421 (recompute ~free); 0.25 charged, conservatively")


def calibration(device_key: str) -> Calibration:
    """The curve of `device_key`'s GPU (a DEVICE_KINDS key or an alias of one)."""
    key = gpu_target.canonical(device_key)
    if key not in CALIBRATION:
        raise KeyError(f"no efficiency calibration for {device_key!r}: one of "
                       f"{', '.join(CALIBRATION)}")
    return CALIBRATION[key]


def efficiency(device_key: str, model_dims: int) -> float:
    """The MFU a compute-bound step of a model `model_dims` wide reaches on `device_key`."""
    c = calibration(device_key)
    return c.e_max * model_dims / (model_dims + c.half_width) * c.device_scale
