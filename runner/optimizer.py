"""AdamW with global-norm clipping and Pax's linear-rampup-cosine-decay schedule."""

import jax
import jax.numpy as jnp
import optax


def linear_rampup_cosine_decay(
    *, learning_rate: float, warmup_steps: int, decay_start: int, decay_end: int, min_ratio: float
) -> optax.Schedule:
    """0 -> lr linearly over warmup_steps, flat until decay_start, cosine to lr*min_ratio at decay_end."""

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        warmup = jnp.minimum(step / max(warmup_steps, 1), 1.0)
        span = max(decay_end - decay_start, 1)
        progress = jnp.clip((step - decay_start) / span, 0.0, 1.0)
        cosine = min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        return learning_rate * warmup * cosine

    return schedule


def _decay_mask(params):
    # Decoupled weight decay on matrices only; biases, norms and scales are left alone (GPT-3).
    return jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)


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
            weight_decay=weight_decay,
            mask=_decay_mask,
        )
    )
    return optax.chain(*parts)
