"""Gradient accumulation: one optimizer update's global batch run as K sub-batches.

GRADIENT_ACCUMULATION_STEPS = K splits the global batch [B, T] (the batch of one update,
PERCORE_BATCH_SIZE x devices) into K sub-batches of B/K rows that a jax.lax.scan runs one
after another inside the jitted step, so the activations alive at once are one
sub-batch's. The input pipeline still loads the whole global batch, so the data order
and resuming do not depend on K.

Layout. The global batch is sharded by rows over the data-parallel axes
(mesh_lib.batch_sharding). [B, T] -> [B/K, K, T] -> [K, B/K, T]: sub-batch k is rows
k, K+k, 2K+k, ..., so each device's contiguous rows hold rows of every sub-batch and no
data moves between devices (B must split into batch shards x K: paxloom/core/batch.py checks it).

Exactness. praxis's metrics.total_loss is (mean over the weighted target tokens, their
total weight). Summing mean_k x weight_k and weight_k over the sub-batches, then dividing
once at the end, gives the same loss and gradient as one pass over the global batch, up
to float rounding; the sums are kept in float32. The backward pass runs on
mean_k x weight_k / W', where W' is the batch's total token weight (its `weights`, which
is praxis's total weight for a language model): each token's gradient is then the one a
single pass gives it, so values seen in the backward pass (FP8's output-gradient amaxes)
keep their scale, and the sum over sub-batches is the gradient itself (times W' / W,
exactly 1 when the model weighs tokens by `weights`).

Randomness. Sub-batch k draws from jax.random.fold_in(step key, k), so sub-batches get
different dropout masks. (K = 1 does not come here: the trainer keeps its single pass
with the step key itself.)
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from paxloom.runner.cluster import mesh as mesh_lib


def split(batch: dict, steps: int, mesh: Mesh) -> dict:
    """Each [B, ...] array -> [K, B/K, ...]; [k] is sub-batch k (rows k, K+k, 2K+k, ...),
    still sharded as the input was (rows over the batch axes, tokens over context)."""
    sharding = NamedSharding(mesh, P(None, *mesh_lib.batch_sharding(mesh).spec))

    def one(x):
        x = x.reshape(x.shape[0] // steps, steps, *x.shape[1:])  # [B/K, K, ...]
        return jax.lax.with_sharding_constraint(jnp.swapaxes(x, 0, 1), sharding)

    return jax.tree_util.tree_map(one, batch)


def loss_and_grads(weighted_loss: Callable, params, batch: dict, key, steps: int, mesh: Mesh,
                   grad_shardings=None, overwritten=None):
    """(loss, gradients, per-sub-batch losses [K], step metrics) of the global `batch`, run as `steps`
    sub-batches in sequence.

    `weighted_loss(params, sub_batch, key)` -> ((mean loss, weight), step metrics): praxis's
    total_loss and what the layers reported (paxloom/core/step_metrics.py), which come back
    averaged over the sub-batches.
    The loss and gradients are those of the whole batch's weighted mean; the gradients
    have the parameters' dtypes, summed in float32 (laid out as `grad_shardings`, the
    parameters' shardings, when given). `overwritten` (a tree of bools like `params`)
    marks "gradients" that are next values (the FP8 scaling state: amax histories whose
    newest entry is the sub-batch's amax): those take the elementwise maximum over the
    sub-batches, the whole batch's amax, instead of a sum.
    """
    if overwritten is None:
        overwritten = jax.tree_util.tree_map(lambda _: False, params)
    sub_batches = split(batch, steps, mesh)
    row_sharding = mesh_lib.batch_sharding(mesh)

    # W' (see the module's docstring); 1 for a batch without weighted tokens.
    batch_weight = jnp.sum(batch["weights"].astype(jnp.float32))
    batch_weight = jnp.where(batch_weight > 0, batch_weight, 1.0)

    def share(p, sub_batch, sub_key):
        (mean, weight), layer_metrics = weighted_loss(p, sub_batch, sub_key)
        weight = jax.lax.stop_gradient(weight).astype(jnp.float32)
        return mean.astype(jnp.float32) * (weight / batch_weight), (mean, weight, layer_metrics)

    grad_fn = jax.value_and_grad(share, has_aux=True)

    def body(carry, xs):
        loss_sum, weight_sum, grad_sum = carry
        sub_batch, k = xs
        sub_batch = jax.tree_util.tree_map(
            lambda x: jax.lax.with_sharding_constraint(x, row_sharding), sub_batch)
        (_, (mean, weight, layer_metrics)), grads = grad_fn(params, sub_batch,
                                                           jax.random.fold_in(key, k))
        grad_sum = jax.tree_util.tree_map(
            lambda a, g, o: jnp.maximum(a, g) if o else a + g.astype(jnp.float32),
            grad_sum, grads, overwritten)
        return (loss_sum + mean * weight, weight_sum + weight, grad_sum), (mean, layer_metrics)

    zeros = jax.tree_util.tree_map(
        lambda p, o: jnp.full(p.shape, -jnp.inf if o else 0.0, jnp.float32), params, overwritten)
    if grad_shardings is not None:
        zeros = jax.lax.with_sharding_constraint(zeros, grad_shardings)
    init = (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), zeros)
    (loss_sum, weight_sum, grad_sum), (sub_losses, layer_metrics) = jax.lax.scan(
        body, init, (sub_batches, jnp.arange(steps)))
    # No weighted token at all (K = 1 gives 0 then too): 0 rather than 0 / 0.
    denominator = jnp.where(weight_sum > 0, weight_sum, 1.0)
    correction = batch_weight / denominator  # W' / W: 1.0 for a language model
    grads = jax.tree_util.tree_map(
        lambda g, p, o: (g if o else g * correction).astype(p.dtype), grad_sum, params,
        overwritten)
    layer_metrics = {name: jnp.mean(values) for name, values in layer_metrics.items()}
    return loss_sum / denominator, grads, sub_losses, layer_metrics
