"""layers/softmax.py: the chunked training cross-entropy gives praxis's own softmax's losses,
metrics and gradients (the reference here is praxis's FullSoftmax / SharedEmbeddingSoftmax,
run on the same parameters), takes praxis's path where a caller may need the logits, and
compiles to a train step with fewer temporary bytes than praxis's one pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from praxis import pax_fiddle
from praxis.layers import embedding_softmax

from experiments.base import BaseExperiment
from experiments.llama import LlamaBase
from layers import architecture
from layers.softmax import ChunkedFullSoftmax, ChunkedSharedEmbeddingSoftmax
from paxloom.core.errors import UserError
from paxloom.runner.state.train_state import as_model_batch, praxis_context
from tests.support.tiny import TINY
from tests.support.training import make_trainer

# The brief's tolerance: float32 results within 1e-6 of praxis's, relative to their size.
RTOL = 1e-6

FAMILIES = {  # name: (praxis's class, the chunked one, experiment)
    "gpt": (embedding_softmax.SharedEmbeddingSoftmax, ChunkedSharedEmbeddingSoftmax,
            BaseExperiment),
    "llama": (embedding_softmax.FullSoftmax, ChunkedFullSoftmax, LlamaBase),
}


def _assert_close(ours, theirs, what):
    """Every leaf within RTOL of praxis's, relative to the leaf's largest magnitude."""
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(ours)[0],
                            jax.tree_util.tree_leaves(theirs), strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert a.shape == b.shape, (what, path)
        scale = max(np.abs(b).max(), 1e-30)
        error = np.abs(a - b).max() / scale
        assert error <= RTOL, f"{what}{jax.tree_util.keystr(path)}: relative error {error:.2e}"


def _layer_inputs(batch=3, length=20, dims=16, vocab=97):
    k = jax.random.split(jax.random.key(0), 3)
    inputs = jax.random.normal(k[0], (batch, length, dims))
    class_ids = jax.random.randint(k[1], (batch, length, 1), 0, vocab)
    weights = (jax.random.uniform(k[2], (batch, length, 1)) > 0.3).astype(jnp.float32)
    weights = weights.at[1].set(0.0)  # a whole padding row, as batch padding is
    return inputs, class_ids, weights


def _layers(family, chunk, has_bias=False, **extra):
    """(praxis's softmax, the chunked one), configured alike."""
    praxis_cls, chunked_cls, _ = FAMILIES[family]
    settings = dict(name="softmax", num_classes=97, input_dims=16, soft_cap_logits=None, **extra)
    configs = (pax_fiddle.Config(praxis_cls, **settings),
               pax_fiddle.Config(chunked_cls, loss_chunk_len=chunk, **settings))
    for config in configs:
        config.feed_forward_tpl.has_bias = has_bias
    return tuple(pax_fiddle.build(config) for config in configs)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("chunk", [5, 8])  # 20 positions: 4 whole chunks; 3 with padding
@pytest.mark.parametrize("has_bias", [False, True])
def test_layer_matches_praxis_outputs_and_gradients(family, chunk, has_bias):
    reference, chunked = _layers(family, chunk, has_bias=has_bias)
    inputs, class_ids, weights = _layer_inputs()
    with praxis_context(do_eval=False):
        variables = reference.init(jax.random.key(1), inputs, weights, class_ids=class_ids)
        # Same parameter tree: checkpoints of either load into the other.
        assert (jax.tree_util.tree_structure(variables) == jax.tree_util.tree_structure(
            chunked.init(jax.random.key(1), inputs, weights, class_ids=class_ids)))
    # An arbitrary cotangent on every per-token loss, not only the mean the model trains on.
    cotangent = jax.random.normal(jax.random.key(2), inputs.shape[:2])

    def run(layer, variables, inputs):
        with praxis_context(do_eval=False):
            out = layer.apply(variables, inputs, weights, class_ids=class_ids)
        return out.avg_xent + jnp.sum(out.per_example_xent * cotangent), out

    grad = jax.value_and_grad(run, argnums=(1, 2), has_aux=True)
    (loss, theirs), their_grads = grad(reference, variables, inputs)
    (our_loss, ours), our_grads = grad(chunked, variables, inputs)
    assert ours.logits is None and ours.log_probs is None  # not materialised
    assert set(ours) == set(theirs)
    for name in ("per_example_xent", "total_xent", "total_weight", "avg_xent", "accuracy"):
        _assert_close(ours[name], theirs[name], name)
    np.testing.assert_array_equal(ours.per_example_argmax, theirs.per_example_argmax)
    _assert_close(our_loss, loss, "loss")
    _assert_close(our_grads, their_grads, "gradient")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_layer_keeps_praxis_path_where_logits_may_be_read(family):
    reference, chunked = _layers(family, 8)
    inputs, class_ids, weights = _layer_inputs()
    with praxis_context(do_eval=False):
        variables = reference.init(jax.random.key(1), inputs, weights, class_ids=class_ids)
    with praxis_context(do_eval=True):  # evaluation: callers may read logits, log_probs
        theirs = reference.apply(variables, inputs, weights, class_ids=class_ids)
        ours = chunked.apply(variables, inputs, weights, class_ids=class_ids)
    np.testing.assert_array_equal(ours.logits, theirs.logits)
    np.testing.assert_array_equal(ours.log_probs, theirs.log_probs)
    with praxis_context(do_eval=False):  # a sequence no longer than one chunk
        short = chunked.apply(variables, inputs[:, :8], weights[:, :8],
                              class_ids=class_ids[:, :8])
    assert short.logits is not None


def test_layer_refuses_settings_it_does_not_compute():
    _, chunked = _layers("llama", 8, label_smoothing_prob=0.1)
    inputs, class_ids, weights = _layer_inputs()
    with praxis_context(do_eval=False), pytest.raises(ValueError, match="label_smoothing_prob"):
        chunked.init(jax.random.key(1), inputs, weights, class_ids=class_ids)


# ----- the whole model ---------------------------------------------------------------------------

MODEL = dict(TINY, MAX_SEQ_LEN=64, ICI_MESH_SHAPE=[1, 1, 1], NUM_KV_HEADS=2)


def _model(family, chunk, **overrides):
    experiment = FAMILIES[family][2]
    settings = {**MODEL, **overrides, "LOSS_CHUNK_LEN": chunk}
    if experiment is BaseExperiment:
        settings.pop("NUM_KV_HEADS")
    return pax_fiddle.build(experiment(**settings).model_template())


def _batch(rows=3, length=64, vocab=512):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, size=(rows, length + 1)).astype(np.int32)
    weights = (rng.random((rows, length)) > 0.2).astype(np.float32)
    weights[-1] = 0.0  # a batch-padding row
    return {"ids": tokens[:, :-1], "labels": tokens[:, 1:], "weights": weights,
            "paddings": np.zeros((rows, length), np.float32),
            "segment_ids": np.ones((rows, length), np.int32),
            "segment_pos": np.tile(np.arange(length, dtype=np.int32), (rows, 1))}


def _train_loss(model):
    """What Trainer._loss differentiates: the LanguageModel's total_loss."""
    def loss(params, batch):
        with praxis_context(do_eval=False):
            metrics, _ = model.apply({"params": params}, as_model_batch(batch))
        return metrics.total_loss[0], metrics
    return loss


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_model_loss_metrics_and_gradients_match_praxis(family):
    reference, chunked = _model(family, 0), _model(family, 16)
    assert not issubclass(reference.lm_tpl.softmax_tpl.cls, (ChunkedFullSoftmax,
                                                            ChunkedSharedEmbeddingSoftmax))
    batch = _batch()
    with praxis_context(do_eval=False):
        params = reference.init(jax.random.key(3), as_model_batch(batch))["params"]
    grad = jax.jit(jax.value_and_grad(_train_loss(reference), has_aux=True))
    (loss, theirs), their_grads = grad(params, batch)
    grad = jax.jit(jax.value_and_grad(_train_loss(chunked), has_aux=True))
    (our_loss, ours), our_grads = grad(params, batch)
    _assert_close(our_loss, loss, "total_loss")
    _assert_close(ours, theirs, "metrics")  # avg_xent, accuracy, num_predictions, ...
    _assert_close(our_grads, their_grads, "gradient")
    # Evaluation reads praxis's path: the same per-token losses and argmax.
    def predict(model):
        with praxis_context(do_eval=True):
            return model.apply({"params": params}, as_model_batch(batch),
                               method=model.compute_predictions)

    theirs, ours = predict(reference), predict(chunked)
    np.testing.assert_array_equal(ours.per_example_xent, theirs.per_example_xent)
    np.testing.assert_array_equal(ours.per_example_argmax, theirs.per_example_argmax)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sharded_training_with_chunks_follows_praxis(family, tmp_path):
    """Vocabulary split over the tensor axis, batch over data: the chunks keep both."""
    experiment = FAMILIES[family][2]
    extra = {"NUM_KV_HEADS": 2} if family == "llama" else {}
    settings = dict(ICI_MESH_SHAPE=[2, 2, 2], PERCORE_BATCH_SIZE=1, **extra)
    chunked = make_trainer(tmp_path / "c", experiment=experiment, LOSS_CHUNK_LEN=16, **settings)
    assert chunked.run.model.lm_tpl.softmax_tpl.cls is FAMILIES[family][1]
    reference = make_trainer(tmp_path / "r", experiment=experiment, LOSS_CHUNK_LEN=0, **settings)
    # One step from the same initial state on the same batch: its loss and gradient norm.
    # (Later steps are no test: Adam's first updates are about lr * sign(gradient), so
    # rounding-level differences in near-zero gradients grow into visible ones.)
    ours, theirs = _first_step_metrics(chunked), _first_step_metrics(reference)
    _assert_close(ours, theirs, "first step")


def _first_step_metrics(trainer):
    state = trainer.init_state()
    batch = trainer.to_device(trainer.make_train_input().next_batch())
    with jax.set_mesh(trainer.mesh):
        _, metrics = trainer.train_step(state, batch)
    return {"loss": metrics["loss"], "grad_norm": metrics["grad_norm"]}


# ----- memory ------------------------------------------------------------------------------------


def _train_temp_bytes(chunk):
    """XLA:CPU's temporaries of loss + gradient (what --mode=plan reads), GPT vocabulary."""
    model = _model("gpt", chunk, VOCAB_SIZE=50304, MAX_SEQ_LEN=512, MODEL_DIMS=128,
                   HIDDEN_DIMS=512, NUM_HEADS=4, DIMS_PER_HEAD=32)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype)
             for k, v in _batch(rows=4, length=512, vocab=50304).items()}
    with praxis_context(do_eval=False):
        params = jax.eval_shape(lambda: model.init(
            jax.random.key(0), as_model_batch({k: jnp.zeros(v.shape, v.dtype)
                                               for k, v in batch.items()}))["params"])
    step = jax.jit(jax.grad(lambda p, b: _train_loss(model)(p, b)[0]))
    return step.lower(params, batch).compile().memory_analysis().temp_size_in_bytes


def test_chunked_loss_compiles_to_fewer_temporary_bytes():
    one_pass, chunked = _train_temp_bytes(0), _train_temp_bytes(128)
    logits_f32 = 4 * 512 * 50304 * 4  # one float32 copy of the [4, 512, 50304] logits
    # praxis's pass holds several float32 copies of the logits; chunks of 128 positions
    # hold a quarter of one at a time.
    assert one_pass - chunked > 2 * logits_f32, (one_pass, chunked)


# ----- the hyperparameter --------------------------------------------------------------------------


def test_loss_chunk_len_is_checked():
    with pytest.raises(UserError, match="LOSS_CHUNK_LEN=-1 must be >= 0"):
        BaseExperiment(LOSS_CHUNK_LEN=-1)
    with pytest.raises(UserError, match="LOSS_CHUNK_LEN"):
        BaseExperiment(LOSS_CHUNK_LEN=1.5)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_loss_chunk_len_picks_the_class_and_decoding_accepts_it(family):
    praxis_cls, chunked_cls, experiment = FAMILIES[family]
    settings = {k: v for k, v in MODEL.items() if family == "llama" or k != "NUM_KV_HEADS"}
    # A chunk as long as the sequence would be one pass: praxis's class stays.
    for chunk in (0, 64, 512):
        softmax = experiment(**settings, LOSS_CHUNK_LEN=chunk).model_template().lm_tpl.softmax_tpl
        assert softmax.cls is praxis_cls
    model = experiment(**settings, LOSS_CHUNK_LEN=16).model_template()
    assert model.lm_tpl.softmax_tpl.cls is chunked_cls
    assert model.lm_tpl.softmax_tpl.loss_chunk_len == 16
    # The cached decoder and the export read the same architecture either way.
    plain = architecture.architecture_of(experiment(**settings, LOSS_CHUNK_LEN=0).model_template())
    assert architecture.architecture_of(model) == plain


def test_embeddings_looked_up_by_index_train_as_the_one_hot_matmul():
    """EMBEDDING_LOOKUP_STYLE="index" (a gather) in place of Pax's one-hot "matmul": the same
    loss and gradients (the step account: two [tokens, vocab] x [vocab, D] matmuls fewer)."""
    one_hot, gather = (_model("gpt", 16, EMBEDDING_LOOKUP_STYLE=style)
                       for style in ("matmul", "index"))
    assert gather.lm_tpl.softmax_tpl.lookup_style == "index"
    batch = _batch()
    with praxis_context(do_eval=False):
        params = one_hot.init(jax.random.key(5), as_model_batch(batch))["params"]
    (loss, theirs), their_grads = jax.jit(jax.value_and_grad(
        _train_loss(one_hot), has_aux=True))(params, batch)
    (our_loss, ours), our_grads = jax.jit(jax.value_and_grad(
        _train_loss(gather), has_aux=True))(params, batch)
    _assert_close(our_loss, loss, "total_loss")
    _assert_close(ours, theirs, "metrics")
    _assert_close(our_grads, their_grads, "gradient")
