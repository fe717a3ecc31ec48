"""Output layers whose training cross-entropy never holds the whole [B, T, vocab] logits.

praxis's FullSoftmax computes the training loss in one pass: bf16 logits, their float32
copy, float32 log-probabilities and a float32 one-hot of the labels, each [B, T, vocab],
plus as many again for the backward pass. With GPT's 50304-piece vocabulary and 2048
tokens per sequence those copies are a large part of a small model's peak memory.

`ChunkedSharedEmbeddingSoftmax` (tied, layers/gpt.py) and `ChunkedFullSoftmax` (untied,
layers/llama.py) keep praxis's parameters, so checkpoints are unchanged, and return the
NestedMap fields praxis's softmax returns. In training (praxis's `do_eval` False) they
compute the cross-entropy over chunks of `loss_chunk_len` positions of every sequence
under `lax.scan`, each chunk rematerialised (`jax.checkpoint`): one chunk's [B, chunk,
vocab] logits are alive at a time, in the forward pass and in the backward pass, which
recomputes them (one more [tokens, D] x [D, vocab] matmul per step). The chunks cut the
sequence axis, not the flattened B*T tokens, so every chunk still holds every batch row
and keeps the batch's sharding over the data axes (a chunk of flattened tokens would sit
on one data shard). The log-sum-exp is taken in float32, and no one-hot of the labels or
[.., vocab] log-probabilities are written; the gradient of the cross-entropy is written out
(cross_entropy), one pass over a chunk's logits.

The chunked path returns no `logits` or `log_probs` (None, as praxis's own `chunk_size`
path does): the LanguageModel's loss and metrics read only the per-token cross-entropy
and argmax. Evaluation (`do_eval` True), whose callers may read the logits, and any call
the chunked maths does not cover (class probabilities instead of ids, a sequence no
longer than one chunk) take praxis's path unchanged.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from praxis import base_layer, py_utils
from praxis.layers import embedding_softmax

NestedMap = py_utils.NestedMap


def _check_supported(layer) -> None:
    """Refuse softmax settings whose maths the chunked loss does not reproduce."""
    if layer.loss_chunk_len < 0:
        raise ValueError(f"loss_chunk_len={layer.loss_chunk_len} must be >= 0 (0: praxis's path)")
    if layer.loss_chunk_len == 0:
        return
    unsupported = {
        "label_smoothing_prob": layer.label_smoothing_prob > 0,
        "z_loss_weight": layer.z_loss_weight > 0,
        "bi_tempered_loss_tpl": layer.bi_tempered_loss_tpl is not None,
        "chunk_size": bool(layer.chunk_size),  # praxis's own chunking; one kind at a time
    }
    named = [name for name, used in unsupported.items() if used]
    if named:
        raise ValueError(f"a chunked training loss (loss_chunk_len={layer.loss_chunk_len}) "
                         f"does not implement {', '.join(named)}; set loss_chunk_len=0")


def _uses_chunks(layer, inputs, class_ids, class_probabilities) -> bool:
    return (layer.loss_chunk_len > 0 and not layer.do_eval and class_ids is not None
            and class_probabilities is None and inputs.ndim == 3
            and inputs.shape[1] > layer.loss_chunk_len)


def _chunk_xent(layer, inputs, labels):
    """(cross-entropy float32, argmax int32), each [B, chunk], of one [B, chunk, D] chunk."""
    logits = layer.get_logits(inputs)  # [B, chunk, V], the compute dtype
    argmax = jax.lax.stop_gradient(jnp.argmax(logits, axis=-1))
    return cross_entropy(logits, labels), argmax


@jax.custom_vjp
def cross_entropy(logits, labels):
    """Per-position cross-entropy, float32, of `logits` [..., V] (any float dtype) against
    integer `labels` [...], computed in float32 as praxis's _compute_xent does (the same
    arithmetic as jax.nn.log_softmax: shifted by the maximum, then the log of the summed
    exponentials), the label's entry by a gather (no [..., V] one-hot).

    Its gradient is written out, (softmax - one-hot of the label) x the incoming gradient,
    in the logits' dtype: one pass over the logits, which XLA fuses into the matmuls'
    operands. Autodiff of the same forward would write a float32 [..., V] zero array and
    scatter-add the label's gradient into it, and keep float32 copies of the logits (the
    step account's "loss" group: bench/step_account.py)."""
    return _cross_entropy_forward(logits, labels)[0]


def _cross_entropy_forward(logits, labels):
    wide = logits.astype(jnp.float32)
    shifted = wide - jnp.max(wide, axis=-1, keepdims=True)
    log_sum = jnp.log(jnp.sum(jnp.exp(shifted), axis=-1))
    label_shifted = jnp.take_along_axis(shifted, labels[..., None], axis=-1)[..., 0]
    # The log-sum-exp of the unshifted logits: all the backward pass needs besides them.
    lse = log_sum + (wide - shifted)[..., 0]
    return log_sum - label_shifted, (logits, labels, lse)


def _cross_entropy_backward(residuals, grad):
    logits, labels, lse = residuals
    probs = jnp.exp(logits.astype(jnp.float32) - lse[..., None])
    vocab = jax.lax.broadcasted_iota(labels.dtype, logits.shape, logits.ndim - 1)
    one_hot = (vocab == labels[..., None]).astype(jnp.float32)
    grad_logits = ((probs - one_hot) * grad[..., None]).astype(logits.dtype)
    # Integer labels have no gradient: float0 zeros of their shape, as jax requires.
    return grad_logits, np.zeros(labels.shape, dtype=jax.dtypes.float0)


cross_entropy.defvjp(_cross_entropy_forward, _cross_entropy_backward)


def _chunked_xent(layer, inputs, labels):
    """Per-token cross-entropy and argmax [B, T] over chunks of the sequence axis (of each
    shard's part of it, when a context axis splits the sequence: a chunk is then a slice
    of every shard's tokens, and no token leaves its device)."""
    chunk = layer.loss_chunk_len
    batch, length, dims = inputs.shape
    # Every chunk's matmul needs its rows' whole model dimension (the tensor axis splits the
    # vocabulary), so gather it once, before chunking. This also avoids wrong gradients:
    # with the model dimension still split over the tensor axis, XLA's SPMD partitioner
    # (jax 0.10.2) miscomputes the gradient of sequence slices' inputs on meshes with
    # replica, data and tensor axes all > 1 (tests/test_softmax.py, the sharded test).
    logits_sharding = layer.activation_split_dims_mapping.out  # [batch, seq, tensor] axes
    seq_axes = None if logits_sharding is None else logits_sharding[1]
    if logits_sharding is not None:
        inputs = base_layer.maybe_shard(inputs, [logits_sharding[0], seq_axes, None],
                                        layer.mesh_axis_names)
    shards = _mesh_size(layer, seq_axes)
    local = length // shards
    extra = -local % chunk  # pad the last chunk; its padding positions are dropped below
    num_chunks = (local + extra) // chunk
    # [B, T, D] -> [chunks, B, shards, chunk, D]: scan runs over the leading axis.
    xs = jnp.pad(inputs.reshape(batch, shards, local, dims), ((0, 0), (0, 0), (0, extra), (0, 0)))
    ys = jnp.pad(labels.reshape(batch, shards, local), ((0, 0), (0, 0), (0, extra)))
    xs = jnp.moveaxis(xs.reshape(batch, shards, num_chunks, chunk, dims), 2, 0)
    ys = jnp.moveaxis(ys.reshape(batch, shards, num_chunks, chunk), 2, 0)
    # Flax sets a layer's children up (and, at init, creates their variables) lazily, on
    # first use, which must not happen inside a jax transform (it leaks tracers): one small
    # call outside the scan does it first. Its result is unused; XLA drops it.
    layer.get_logits(xs[0, :, 0, :1])

    def body(carry, chunk_inputs):
        x, y = chunk_inputs  # [B, shards, chunk, D], [B, shards, chunk]
        xent, argmax = _chunk_xent(layer, x.reshape(batch, shards * chunk, dims),
                                   y.reshape(batch, shards * chunk))
        return carry, (xent.reshape(y.shape), argmax.reshape(y.shape))

    # jax.checkpoint: the backward pass recomputes each chunk's logits instead of the
    # scan saving [chunks, B, chunk, V] of them for it.
    _, per_chunk = jax.lax.scan(jax.checkpoint(body), None, (xs, ys))
    xent, argmax = (jnp.moveaxis(x, 0, 2).reshape(batch, shards, num_chunks * chunk)
                    [:, :, :local].reshape(batch, length) for x in per_chunk)
    return xent, argmax


def _mesh_size(layer, axes) -> int:
    """The number of shards the mesh axes `axes` (a name, names or None) make."""
    if axes is None or not layer.mesh_axis_names:
        return 1
    names = (axes,) if isinstance(axes, str) else axes
    return math.prod(layer.mesh_shape[layer.mesh_axis_names.index(n)] for n in names)


def _outputs(per_example_xent, per_example_argmax, class_ids, class_weights) -> NestedMap:
    """The NestedMap praxis's FullSoftmax.__call__ returns, from per-token values."""
    total_xent = jnp.sum(per_example_xent[..., None] * class_weights, dtype=jnp.float32)
    total_weight = jnp.sum(class_weights, dtype=jnp.float32)
    accuracy = jnp.sum((per_example_argmax[..., None] == class_ids) * class_weights
                       ) / total_weight
    return NestedMap(
        logits=None,
        log_probs=None,
        per_example_argmax=per_example_argmax,
        per_example_xent=per_example_xent.astype(jnp.float32),
        total_xent=total_xent,
        total_weight=total_weight,
        avg_xent=(total_xent / (total_weight + 1e-6)).astype(jnp.float32),
        accuracy=accuracy,
    )


class _ChunkedLoss:
    """The chunked training loss shared by both output layers, which declare its setting as
    their field (a layer's fields must be declared on the layer class):

      loss_chunk_len: positions of each sequence per chunk of the training loss;
        0 computes it in one pass, as praxis does.
    """

    def setup(self) -> None:
        _check_supported(self)
        super().setup()

    def __call__(self, inputs, class_weights, class_ids=None, class_probabilities=None,
                 input_ids=None) -> NestedMap:
        if not _uses_chunks(self, inputs, class_ids, class_probabilities):
            return super().__call__(inputs, class_weights, class_ids=class_ids,
                                    class_probabilities=class_probabilities,
                                    input_ids=input_ids)
        xent, argmax = _chunked_xent(self, inputs, jnp.squeeze(class_ids, axis=-1))
        return _outputs(xent, argmax, class_ids, class_weights)


class ChunkedFullSoftmax(_ChunkedLoss, embedding_softmax.FullSoftmax):
    """praxis's FullSoftmax with a chunked training cross-entropy (see the module doc)."""

    loss_chunk_len: int = 0


class ChunkedSharedEmbeddingSoftmax(_ChunkedLoss, embedding_softmax.SharedEmbeddingSoftmax):
    """praxis's SharedEmbeddingSoftmax (tied embedding) with a chunked training
    cross-entropy (see the module doc)."""

    loss_chunk_len: int = 0
