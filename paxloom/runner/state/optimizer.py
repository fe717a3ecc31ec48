"""Adam as praxis's optimizers.Adam in the Pax GPU configs, and Pax's learning-rate schedule.

Same update as praxis's sharded_adam (bias-corrected moments, epsilon outside the
square root, epsilon_root and update clipping as ADAM_EPSILON_ROOT and
ADAM_CLIP_THRESHOLD say: 0 and off in the Pax GPU configs) plus global-norm gradient
clipping, on optax; tests/test_optimizer.py checks both against praxis. Pax's 'constant'
schedule (LR_SCHEDULE) is the learning rate throughout. `train_only`
restricts an optimizer to some parameters (USE_LORA: the adapters), the rest frozen;
`overwrite_with_gradient` leaves some to the backward pass (USE_FP8's scaling state).
"""

import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from paxloom.runner.state.checkpoints import param_path


def linear_rampup_cosine_decay(
    *, learning_rate: float, warmup_steps: int, decay_start: int, decay_end: int, min_ratio: float,
    peak: float = 1.0,
) -> optax.Schedule:
    """0 -> lr linearly over warmup_steps, flat until decay_start, cosine to lr*min_ratio at decay_end.

    `peak` is praxis LinearRampupCosineDecay's `max` (Pax's LR_COS_MAX): the whole schedule
    times it (praxis ramps to max and decays to max * min_ratio)."""

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        # No warmup starts at the peak (as praxis), not at 0.
        warmup = jnp.minimum(step / warmup_steps, 1.0) if warmup_steps else 1.0
        span = max(decay_end - decay_start, 1)
        progress = jnp.clip((step - decay_start) / span, 0.0, 1.0)
        cosine = min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        return learning_rate * peak * warmup * cosine

    return schedule


def constant(*, learning_rate: float) -> optax.Schedule:
    """Pax's LR_SCHEDULE='constant' (praxis schedules.Constant, value 1): the learning rate
    at every step, without warmup or decay."""

    def schedule(step):
        return jnp.full_like(jnp.asarray(step, jnp.float32), learning_rate)

    return schedule


def adamw(
    *,
    schedule: optax.Schedule,
    beta1: float,
    beta2: float,
    epsilon: float,
    weight_decay: float,
    clip_gradient_norm_to_value: float,
    epsilon_root: float = 0.0,
    clip_threshold: float = -1.0,
) -> optax.GradientTransformation:
    """`epsilon_root` and `clip_threshold` are praxis Adam's (Pax's ADAM_EPSILON_ROOT and
    ADAM_CLIP_THRESHOLD): m / (sqrt(v + epsilon_root) + epsilon), and, if clip_threshold > 0,
    each tensor's update divided by max(1, rms(update) / clip_threshold) before weight decay,
    as sharded_adam's update capping."""
    parts = []
    if clip_gradient_norm_to_value > 0:
        parts.append(optax.clip_by_global_norm(clip_gradient_norm_to_value))
    if clip_threshold > 0:  # praxis's order: Adam step, capping, decay, learning rate
        parts += [optax.scale_by_adam(b1=beta1, b2=beta2, eps=epsilon, eps_root=epsilon_root),
                  _cap_update_rms(clip_threshold),
                  optax.add_decayed_weights(weight_decay),
                  optax.scale_by_learning_rate(schedule)]
        return optax.chain(*parts)
    parts.append(
        optax.adamw(
            learning_rate=schedule, b1=beta1, b2=beta2, eps=epsilon, eps_root=epsilon_root,
            # Decoupled and scaled by the learning rate, on every parameter, as praxis's
            # Adam(weight_decay=) in the Pax configs (its LayerNorm scales are stored as
            # offsets from 1, so decay pulls them towards 1).
            weight_decay=weight_decay,
        )
    )
    return optax.chain(*parts)


def _cap_update_rms(threshold: float) -> optax.GradientTransformation:
    """praxis's `clip_update`: each tensor / max(1, rms / threshold), an infinite rms NaN."""
    def update(updates, state, params=None):
        def cap(u):
            rms = jnp.sqrt(jnp.mean(jnp.square(u)))
            rms = jnp.where(jnp.isinf(rms), jnp.nan, rms)
            return u / jnp.maximum(1.0, rms / jnp.asarray(threshold, u.dtype))
        return jax.tree_util.tree_map(cap, updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


class TrainOnly(NamedTuple):
    """An optax GradientTransformation (init, update) that trains only the parameters whose
    path ("lm/transformer/x_layers_0/.../lora_a") matches the regex `trainable`, as Pax's
    `bprop_variable_inclusion`; it has its `init` and `update` and the pattern, so the
    trainer can skip computing the frozen parameters' gradients (stop_frozen_gradients)."""

    init: optax.TransformInitFn
    update: optax.TransformUpdateFn
    trainable: str


def train_only(tx: optax.GradientTransformation, trainable: str) -> TrainOnly:
    """`tx` on the parameters matching `trainable` (see TrainOnly) and nothing on the others:
    their updates are zero and the optimizer state holds nothing for them (no Adam moments),
    and gradient clipping and weight decay in `tx` see only the trainable ones."""
    def labels(params):
        return jax.tree_util.tree_map(lambda train: "trainable" if train else "frozen",
                                      _matching(trainable, params))

    masked = optax.multi_transform({"trainable": tx, "frozen": optax.set_to_zero()}, labels)
    return TrainOnly(masked.init, masked.update, trainable)


class OverwriteWithGradient(NamedTuple):
    """An optax GradientTransformation that applies `tx` to every parameter but those whose
    path matches the regex `overwritten`: praxis's OVERWRITE_WITH_GRADIENT variables (the
    FP8 scaling state, layers/fp8.py), whose backward pass returns their next value as
    their "gradient". Their updates are zero; the trainer then writes the "gradient" in
    (apply_overwrites). They have no Adam moments, and no part in gradient clipping,
    weight decay or the gradient norm."""

    init: optax.TransformInitFn
    update: optax.TransformUpdateFn
    tx: optax.GradientTransformation
    overwritten: str


def overwrite_with_gradient(tx: optax.GradientTransformation,
                            overwritten: str) -> OverwriteWithGradient:
    def labels(params):
        return jax.tree_util.tree_map(lambda o: "overwritten" if o else "optimized",
                                      _matching(overwritten, params))

    split = optax.multi_transform({"optimized": tx, "overwritten": optax.set_to_zero()},
                                  labels)
    return OverwriteWithGradient(split.init, split.update, tx, overwritten)


def overwritten_mask(tx, params):
    """A tree of bools like `params`: which ones take their gradient as their value."""
    if isinstance(tx, OverwriteWithGradient):
        return _matching(tx.overwritten, params)
    return jax.tree_util.tree_map(lambda _: False, params)


def apply_overwrites(tx, params, grads):
    """`params` with the overwritten ones (OverwriteWithGradient) set to their gradient."""
    return jax.tree_util.tree_map(lambda p, g, o: g.astype(p.dtype) if o else p,
                                  params, grads, overwritten_mask(tx, params))


def optimized_gradients(tx, grads):
    """`grads` with zeros for the overwritten parameters: what the gradient norm measures."""
    return jax.tree_util.tree_map(lambda g, o: jnp.zeros_like(g) if o else g,
                                  grads, overwritten_mask(tx, grads))


def trainable_mask(tx, params):
    """A tree of bools like `params`: which parameters get a gradient: all, unless TrainOnly
    freezes some (the overwritten ones always do: it carries their next value)."""
    if isinstance(tx, OverwriteWithGradient):
        return jax.tree_util.tree_map(lambda o, t: o or t, overwritten_mask(tx, params),
                                      trainable_mask(tx.tx, params))
    if isinstance(tx, TrainOnly):
        return _matching(tx.trainable, params)
    return jax.tree_util.tree_map(lambda _: True, params)


def stop_frozen_gradients(tx, params):
    """`params` with the parameters `tx` does not train behind stop_gradient: their gradient
    is zero and XLA never computes it (for LoRA, about a third of a step's FLOPs)."""
    return jax.tree_util.tree_map(lambda p, train: p if train else jax.lax.stop_gradient(p),
                                  params, trainable_mask(tx, params))


def _matching(pattern: str, params):
    """A tree of bools like `params`: whose path (checkpoints.param_path) matches `pattern`."""
    regex = re.compile(pattern)
    return jax.tree_util.tree_map_with_path(
        lambda path, _: regex.match(param_path(path)) is not None, params)
