"""Adam as praxis's optimizers.Adam in the Pax GPU configs, and Pax's learning-rate schedule.

Same update as praxis's sharded_adam (bias-corrected moments, epsilon outside the
square root, epsilon_root 0, no update clipping) plus global-norm gradient
clipping, on optax; tests/test_optimizer.py checks both against praxis.
"""

import jax.numpy as jnp
import optax


def linear_rampup_cosine_decay(
    *, learning_rate: float, warmup_steps: int, decay_start: int, decay_end: int, min_ratio: float
) -> optax.Schedule:
    """0 -> lr linearly over warmup_steps, flat until decay_start, cosine to lr*min_ratio at decay_end."""

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        # No warmup starts at the peak (as praxis), not at 0.
        warmup = jnp.minimum(step / warmup_steps, 1.0) if warmup_steps else 1.0
        span = max(decay_end - decay_start, 1)
        progress = jnp.clip((step - decay_start) / span, 0.0, 1.0)
        cosine = min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        return learning_rate * warmup * cosine

    return schedule


def adamw(
    *,
    schedule: optax.Schedule,
    beta1: float,
    beta2: float,
    epsilon: float,
    weight_decay: float,
    clip_gradient_norm_to_value: float,
) -> optax.GradientTransformation:
    parts = []
    if clip_gradient_norm_to_value > 0:
        parts.append(optax.clip_by_global_norm(clip_gradient_norm_to_value))
    parts.append(
        optax.adamw(
            learning_rate=schedule,
            b1=beta1,
            b2=beta2,
            eps=epsilon,
            # Decoupled and scaled by the learning rate, on every parameter, as praxis's
            # Adam(weight_decay=) in the Pax configs (its LayerNorm scales are stored as
            # offsets from 1, so decay pulls them towards 1).
            weight_decay=weight_decay,
        )
    )
    return optax.chain(*parts)
