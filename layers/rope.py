"""Rotary position embeddings with scaled frequencies, for a context longer than training's.

RoPE (Su et al. 2021) rotates the i-th pair of a head's dimensions by the angle
position / timescale_i, timescale_i = min * (max / min) ** (2i / H): the inverse frequency
is 1 / timescale_i. Each scaling divides some frequencies by `factor`, so the positions of
a longer context turn the slow pairs no further than training's did:

- "linear" (Chen et al. 2023, "Extending Context Window of Large Language Models via
  Positional Interpolation"): every frequency, i.e. positions / factor.
- "llama3" (Meta's Llama 3.1, `apply_scaling` in its released llama-models code): pairs
  whose wavelength 2 pi timescale is shorter than original_max_position_embeddings /
  high_freq_factor keep their frequency, those longer than original / low_freq_factor are
  divided by factor, and the ones between mix the two, kept by (original / wavelength -
  low) / (high - low).
- "yarn" (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language
  Models", section 3): the same mix ("NTK-by-parts"), kept by a ramp over the pairs that
  runs from the pair turning beta_fast times over the original context (kept) to the one
  turning beta_slow times (divided); and both queries and keys multiplied by the attention
  factor 0.1 ln(factor) + 1 (the paper's sqrt(1/t)), here on cos and sin. The ramp is the
  authors' released code's (jquesnelle/yarn, which the checkpoints and `transformers`
  follow): linear in the pair's index between the two pairs' fractional indices rounded
  outwards, not linear in the turns as the paper's equation writes it.

Every scaling is one formula: a pair keeps the fraction `kept` of its frequency and takes
1 - kept of it divided by factor. `timescales` computes them from plain numbers, for
praxis's layer here (`ScaledRotaryPositionalEmbedding`) and the cached decoder
(layers/cached_lm.py) alike; tests/test_rope.py checks it against transformers'
independent implementation.

Without scaling, models keep praxis's own RotaryPositionalEmbedding (`template`), and the
unscaled `timescales` is praxis's expression, so this layer then computes praxis's bits.
"""

import dataclasses

import fiddle as fdl
import jax.numpy as jnp
import numpy as np
from praxis import pax_fiddle
from praxis.layers import embedding_softmax

# Each scaling and the RopeScaling fields (Hugging Face's rope_parameters keys) it reads.
PARAMETERS = {
    "none": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow"),
}
SCALINGS = tuple(PARAMETERS)


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """A RoPE scaling in plain numbers; the defaults are Llama 3.1's published values and the
    YaRN paper's betas. Fields a `kind` does not read (PARAMETERS) are ignored."""

    kind: str = "none"  # one of SCALINGS
    factor: float = 8.0  # how many times longer the new context is
    low_freq_factor: float = 1.0  # llama3: wavelengths above original / this are divided
    high_freq_factor: float = 4.0  # llama3: wavelengths below original / this are kept
    original_max_position_embeddings: int = 8192  # the context the model was trained at
    beta_fast: float = 32.0  # yarn: pairs turning more often than this over it are kept
    beta_slow: float = 1.0  # yarn: pairs turning less often than this are divided


NONE = RopeScaling()
_FIELDS = tuple(field.name for field in dataclasses.fields(RopeScaling))


def timescales(dims: int, min_timescale: float, max_timescale: float,
               scaling: RopeScaling = NONE):
    """(timescales [dims // 2] float32, the attention factor) of a head of `dims`: pair i
    turns by position / timescales[i] (1 / its inverse frequency), and cos and sin are
    multiplied by the attention factor. Usable inside jit: the numbers are constants."""
    if scaling.kind not in PARAMETERS:
        raise ValueError(f"RoPE scaling {scaling.kind!r} is not one of {', '.join(SCALINGS)}")
    # praxis's RotaryPositionalEmbedding's own expression, so the unscaled bits are its.
    fraction = 2 * jnp.arange(0, dims // 2) / dims
    timescale = min_timescale * (max_timescale / min_timescale) ** fraction
    if scaling.kind == "none":
        return timescale, 1.0
    kept = _kept(dims, min_timescale, max_timescale, scaling)
    frequency_scale = kept + (1 - kept) / scaling.factor  # of each inverse frequency
    attention_factor = 1.0
    if scaling.kind == "yarn" and scaling.factor > 1:
        attention_factor = 0.1 * np.log(scaling.factor) + 1
    return timescale / frequency_scale.astype(np.float32), float(attention_factor)


def _kept(dims: int, min_timescale: float, max_timescale: float,
          scaling: RopeScaling) -> np.ndarray:
    """The fraction [dims // 2] (float64) of each pair's frequency that the scaling keeps."""
    pairs = np.arange(dims // 2)
    if scaling.kind == "linear":
        return np.zeros(dims // 2)
    original = scaling.original_max_position_embeddings
    if scaling.kind == "llama3":
        wavelength = 2 * np.pi * min_timescale * (max_timescale / min_timescale) ** (
            2 * pairs / dims)
        # original / wavelength is how many turns the pair makes over the original context:
        # all kept above high_freq_factor turns, none below low_freq_factor, linear between
        # (the ramp YaRN's paper writes in turns; Meta's code as three cases).
        turns = original / wavelength
        low, high = scaling.low_freq_factor, scaling.high_freq_factor
        return np.clip((turns - low) / (high - low), 0.0, 1.0)

    # yarn: the (fractional) pair index that turns `turns` times over the original context,
    # from turns = original / (2 pi min (max / min) ** (2i / dims)).
    def pair_turning(turns: float) -> float:
        return dims * np.log(original / (2 * np.pi * min_timescale * turns)) / (
            2 * np.log(max_timescale / min_timescale))

    first = max(np.floor(pair_turning(scaling.beta_fast)), 0)  # kept up to here
    last = min(np.ceil(pair_turning(scaling.beta_slow)), dims - 1)  # divided from here
    if first == last:
        last += 0.001  # as the released code: a step, not a division by zero
    return 1 - np.clip((pairs - first) / (last - first), 0.0, 1.0)


def rotate(x, position, timescale, attention_factor: float = 1.0):
    """x [B, T, N, H] with each (i, i + H/2) pair rotated by position [B, T] / timescale[i],
    in the dtype praxis's arithmetic gives (float32 for bf16 x); as praxis's layer."""
    angle = position[:, :, jnp.newaxis, jnp.newaxis] / timescale
    sin, cos = jnp.sin(angle), jnp.cos(angle)
    if attention_factor != 1.0:
        sin, cos = sin * attention_factor, cos * attention_factor
    first, second = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


class ScaledRotaryPositionalEmbedding(embedding_softmax.RotaryPositionalEmbedding):
    """praxis's RotaryPositionalEmbedding with RoPE scaling (a RopeScaling's fields).

    Only the frequencies (and the factor on cos and sin) change: praxis's `extend_step`
    calls `__call__`, so incremental decoding scales too.
    """

    kind: str = NONE.kind
    factor: float = NONE.factor
    low_freq_factor: float = NONE.low_freq_factor
    high_freq_factor: float = NONE.high_freq_factor
    original_max_position_embeddings: int = NONE.original_max_position_embeddings
    beta_fast: float = NONE.beta_fast
    beta_slow: float = NONE.beta_slow

    def __call__(self, inputs, position=None):
        """inputs [B, S, N, H] rotated by position [B, S] (None: 0 .. S-1), as praxis's."""
        if inputs.ndim != 4 or inputs.shape[3] != self.embedding_dims:
            raise ValueError(f"rotary embedding of {self.embedding_dims} dims expects inputs "
                             f"[batch, sequence, heads, {self.embedding_dims}], got "
                             f"{inputs.shape}")
        timescale, attention_factor = timescales(
            self.embedding_dims, self.min_timescale, self.max_timescale, scaling_of(self))
        if position is None:
            position = jnp.arange(inputs.shape[1], dtype=jnp.float32)[jnp.newaxis, :]
        out = rotate(inputs, position, timescale, attention_factor)
        return out.astype(self.fprop_dtype) if self.cast_as_fprop_dtype else out


def scaling_of(rope) -> RopeScaling:
    """The RopeScaling of a rotary embedding layer or its config: none for praxis's own."""
    cls = fdl.get_callable(rope) if isinstance(rope, fdl.Buildable) else type(rope)
    if not issubclass(cls, ScaledRotaryPositionalEmbedding):
        return NONE
    return RopeScaling(**{name: getattr(rope, name) for name in _FIELDS})


def template(max_timescale: float, scaling: RopeScaling = NONE) -> pax_fiddle.Config:
    """The rotary embedding config of a model: praxis's own without scaling (the config
    unscaled models have always had), this module's layer with it."""
    if scaling.kind == "none":
        return pax_fiddle.Config(embedding_softmax.RotaryPositionalEmbedding,
                                 max_timescale=max_timescale)
    return pax_fiddle.Config(ScaledRotaryPositionalEmbedding, max_timescale=max_timescale,
                             **dataclasses.asdict(scaling))
