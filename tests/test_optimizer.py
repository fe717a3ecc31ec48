"""The optimizer and schedule equal praxis's own (what the Pax GPU configs train with)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from praxis import optimizers, pax_fiddle, schedules

from paxloom.runner.state import optimizer

SCHEDULES = [
    # GPT126M's (paxml/contrib/gpu/scripts_gpu/configs.py)
    dict(warmup_steps=636, decay_start=637, decay_end=500000, min_ratio=0.1),
    # no warmup, a flat stretch
    dict(warmup_steps=0, decay_start=1000, decay_end=5000, min_ratio=0.2),
]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_schedule_equals_praxis_linear_rampup_cosine_decay(schedule):
    ours = optimizer.linear_rampup_cosine_decay(learning_rate=6e-4, **schedule)
    theirs = pax_fiddle.instantiate(
        pax_fiddle.Config(schedules.LinearRampupCosineDecay, max=1.0, **schedule))
    for step in (0, 1, 300, 635, 636, 637, 638, 999, 1000, 1001, 3000, 10_000, 250_000,
                 499_999, 500_000, 600_000):
        np.testing.assert_allclose(float(ours(step)), 6e-4 * float(theirs.value_at(step)),
                                   rtol=2e-5, atol=1e-12, err_msg=f"step {step}")


@pytest.mark.parametrize("weight_decay,epsilon_root,clip_threshold,peak", [
    (0.0, 0.0, 0.0, 1.0),
    (0.1, 0.0, 0.0, 1.0),
    # Pax's ADAM_EPSILON_ROOT, ADAM_CLIP_THRESHOLD (sharded_adam's update capping) and
    # LR_COS_MAX (the schedule's peak).
    (0.1, 1e-6, 0.5, 0.5),
])
def test_adam_update_equals_praxis_sharded_adam(weight_decay, epsilon_root, clip_threshold,
                                                peak):
    schedule = optimizer.linear_rampup_cosine_decay(learning_rate=1e-2, warmup_steps=2,
                                                    decay_start=2, decay_end=10, min_ratio=0.1,
                                                    peak=peak)
    ours = optimizer.adamw(schedule=schedule, beta1=0.9, beta2=0.95, epsilon=1e-8,
                           weight_decay=weight_decay, clip_gradient_norm_to_value=0.0,
                           epsilon_root=epsilon_root, clip_threshold=clip_threshold)
    theirs = optimizers.sharded_adam(schedule, beta1=0.9, beta2=0.95, epsilon=1e-8,
                                     epsilon_root=epsilon_root, update_capping=clip_threshold,
                                     weight_decay=weight_decay)
    keys = jax.random.split(jax.random.key(0), 8)
    params = {"w": jax.random.normal(keys[0], (4, 3)), "b": jax.random.normal(keys[1], (3,))}
    ours_state, theirs_state = ours.init(params), theirs.init(params)
    for i in range(5):
        grads = jax.tree_util.tree_map(lambda p, k=keys[2 + i]: jax.random.normal(k, p.shape),
                                       params)
        ours_update, ours_state = ours.update(grads, ours_state, params)
        theirs_update, theirs_state = theirs.update(grads, theirs_state, params)
        for name in params:
            np.testing.assert_allclose(ours_update[name], theirs_update[name], rtol=1e-5,
                                       atol=1e-9, err_msg=f"step {i} {name}")
        params = jax.tree_util.tree_map(jnp.add, params, ours_update)
