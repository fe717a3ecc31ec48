"""Fused attention (layers/attention.py) equals praxis's attention: layer outputs and
gradients on packed, padded and causal rows, whole-model losses, and checkpoints that move
between implementations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from praxis import base_layer, pax_fiddle
from praxis.layers import attentions, transformers

from layers import attention
from runner import checkpoints
from runner.errors import UserError
from runner.train_state import praxis_context
from tests.helpers import TINY, make_trainer, train_losses

B, T, D, N, H = 2, 64, 32, 4, 8
ON_GPU = jax.default_backend() == "gpu"  # bench/gpu_run.sh runs this file on a GPU too
# cuDNN attention is causal only (exact on causal and end-padded rows), in bf16/fp16, GPU only.
CASES = [(kind, impl, dtype) for kind in ("packed", "padded", "causal")
         for impl in ("xla", "pallas", "cudnn") for dtype in (jnp.float32, jnp.bfloat16)
         if impl != "cudnn" or (ON_GPU and kind != "packed" and dtype == jnp.bfloat16)]


def _rows(kind: str):
    """(segment_ids, paddings) [B, T] of packed, padded or plain causal rows."""
    segment_ids = np.ones((B, T), np.int32)
    paddings = np.zeros((B, T), np.float32)
    if kind == "packed":
        segment_ids[0, 20:] = 2
        segment_ids[1, 9:40], segment_ids[1, 40:] = 2, 3
    elif kind == "padded":
        segment_ids[0, 50:], paddings[0, 50:] = 0, 1.0
        segment_ids[1, 30:], paddings[1, 30:] = 0, 1.0
    return jnp.asarray(segment_ids), jnp.asarray(paddings)


def _mask(inputs, segment_ids, paddings):
    """The mask praxis's StackedTransformer gives its layers (packed input, causal)."""
    segment_mask = attentions.segment_mask(segment_ids, segment_ids, inputs.dtype)
    mask, _ = transformers.compute_attention_masks_for_fprop(
        inputs, paddings, causal_attention=True, segment_mask=segment_mask)
    return mask


def _layer(cls, dtype, **fields):
    return base_layer.instantiate(pax_fiddle.Config(
        cls, name="attention", input_dim=D, hidden_dim=D, num_heads=N, dim_per_head=H,
        use_bias=True, combine_qkv=True, internal_enable_per_dim_scale=False,
        fprop_dtype=dtype, **fields))


@pytest.mark.parametrize("kind,impl,dtype", CASES)
def test_fused_attention_equals_praxis_forward_and_gradients(kind, impl, dtype):
    reference = _layer(attentions.DotProductAttention, dtype)
    fused = _layer(attention.FusedDotProductAttention, dtype, attention_impl=impl,
                   pallas_interpret=not ON_GPU)
    inputs = jax.random.normal(jax.random.key(1), (B, T, D), jnp.float32).astype(dtype)
    segment_ids, paddings = _rows(kind)
    mask = _mask(inputs, segment_ids, paddings)
    real = (1.0 - paddings)[:, :, None]  # padding positions' outputs carry no weight
    cotangent = jax.random.normal(jax.random.key(2), (B, T, D), jnp.float32) * real

    with praxis_context(do_eval=True):
        params = reference.init(jax.random.key(0), inputs, inputs, inputs, mask)

        def loss(layer, params, x):
            out, _ = layer.apply(params, x, x, x, mask)
            return jnp.sum(out.astype(jnp.float32) * cotangent), out

        (_, want), want_grads = jax.value_and_grad(
            lambda p, x: loss(reference, p, x), argnums=(0, 1), has_aux=True)(params, inputs)
        (_, got), got_grads = jax.value_and_grad(
            lambda p, x: loss(fused, p, x), argnums=(0, 1), has_aux=True)(params, inputs)

    # float32: 1e-5. bfloat16 (8 bits of mantissa, ulp 2^-7 near 1): a few ulps of the
    # largest values, since both round intermediate products differently.
    tolerance = 1e-5 if dtype == jnp.float32 else 4 * 2.0**-7
    got, want = (np.asarray(x, np.float32) * np.asarray(real) for x in (got, want))
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, atol=tolerance * scale, rtol=0)
    for g, w in zip(jax.tree_util.tree_leaves(got_grads), jax.tree_util.tree_leaves(want_grads),
                    strict=True):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        np.testing.assert_allclose(g, w, atol=tolerance * max(1.0, float(np.abs(w).max())),
                                   rtol=0)


def test_segment_ids_from_the_mask_reproduce_the_documents():
    inputs = jnp.zeros((B, T, D))
    segment_ids, paddings = _rows("packed")
    derived = attention.segment_ids_from_mask(_mask(inputs, segment_ids, paddings), B)
    np.testing.assert_array_equal(derived, segment_ids)


# Whole models on a [2,2,2] mesh: the 8 simulated CPU devices (not a single GPU).
needs_8_devices = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices")
MESH = dict(ICI_MESH_SHAPE=[2, 2, 2], PERCORE_BATCH_SIZE=1, LEARNING_RATE=3e-3,
            LR_COS_WARMUP=1, LR_COS_DECAY_START=1)


@pytest.fixture(scope="module")
def praxis_run(tmp_path_factory):
    trainer = make_trainer(tmp_path_factory.mktemp("praxis"), **MESH)
    return trainer, train_losses(trainer, 20)


@needs_8_devices
@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_whole_model_losses_equal_for_20_steps(impl, tmp_path, praxis_run):
    _, want = praxis_run
    trainer = make_trainer(tmp_path, ATTENTION_IMPL=impl, **MESH)
    layer = trainer.model.lm_tpl.stacked_transformer_tpl.transformer_layer_params_tpl
    assert layer.tr_atten_tpl.cls is attention.FusedDotProductAttention
    got = train_losses(trainer, 20)
    np.testing.assert_allclose(got, want, rtol=2e-5)


@needs_8_devices
def test_a_checkpoint_moves_between_implementations(tmp_path, praxis_run):
    source, _ = praxis_run
    state = source.init_state()
    metadata = checkpoints.run_metadata("tests", TINY, source.abstract_state["params"])
    with checkpoints.Checkpointer(str(tmp_path / "ckpt"), metadata=metadata, every_n_steps=0,
                                  max_to_keep=1) as ckpt:
        ckpt.save(1, state, {}, final=True)
    fused = make_trainer(tmp_path / "fused", ATTENTION_IMPL="xla", **MESH)
    restored = checkpoints.restore(str(tmp_path / "ckpt"), None, fused.abstract_state)
    for a, b in zip(jax.tree_util.tree_leaves(restored.state["params"]),
                    jax.tree_util.tree_leaves(state["params"]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@needs_8_devices
def test_auto_and_refusals():
    assert attention.resolve("auto", packed_input=True, platform="cpu",
                             atten_dropout_prob=0.0) == "praxis"
    assert attention.resolve("auto", packed_input=True, platform="gpu",
                             atten_dropout_prob=0.0) == "pallas"
    assert attention.resolve("auto", packed_input=False, platform="gpu",
                             atten_dropout_prob=0.0) == "cudnn"
    assert attention.resolve("auto", packed_input=True, platform="gpu",
                             atten_dropout_prob=0.1) == "praxis"
    with pytest.raises(ValueError, match="cannot mask packed rows"):
        attention.resolve("cudnn", packed_input=True, platform="gpu", atten_dropout_prob=0.0)
    with pytest.raises(ValueError, match="needs a GPU"):
        attention.resolve("cudnn", packed_input=False, platform="cpu", atten_dropout_prob=0.0)
    with pytest.raises(UserError, match="ATTENTION_IMPL='pallas' has no attention dropout"):
        make_trainer("/tmp/unused", ATTENTION_IMPL="pallas", DROPOUT_PROB=0.1, **MESH)

