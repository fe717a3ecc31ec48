"""Short trainings of both model families on one device with each attention
implementation, against praxis's own attention: the losses of the first steps agree.
bench/gpu_run.sh runs this file on a GPU. On CPU it is skipped: there only XLA's
implementation runs, which tests/test_attention.py already trains sharded for both families
(XLA's path was checked with this file on CPU too when it was written)."""

import jax
import numpy as np
import pytest

from experiments.base import BaseExperiment
from experiments.llama import LlamaBase
from tests.support.training import make_trainer, train_losses

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
IMPLS = ["xla", "pallas", "cudnn", "auto"]
# cuDNN runs bfloat16 only; the others are compared in float32 at full matmul precision.
STEPS = 10


def _losses(tmp_path, family, impl, dtype):
    settings = dict(ICI_MESH_SHAPE=[1, 1, 1], PERCORE_BATCH_SIZE=4, LEARNING_RATE=3e-3,
                    LR_COS_WARMUP=1, LR_COS_DECAY_START=1, FPROP_DTYPE=dtype,
                    ATTENTION_IMPL=impl, MAX_SEQ_LEN=128)
    if family is LlamaBase:
        settings.update(NUM_HEADS=8, NUM_KV_HEADS=2)  # grouped-query
    trainer = make_trainer(tmp_path / impl, devices=jax.devices()[:1], experiment=family,
                           **settings)
    with jax.default_matmul_precision("highest"):
        return np.asarray(train_losses(trainer, STEPS))


@pytest.mark.parametrize("family", [BaseExperiment, LlamaBase], ids=["gpt", "llama"])
@pytest.mark.parametrize("impl", IMPLS)
def test_short_training_follows_praxis(family, impl, tmp_path):
    dtype = "bfloat16" if impl in ("cudnn", "auto") else "float32"
    want = _losses(tmp_path, family, "praxis", dtype)
    got = _losses(tmp_path, family, impl, dtype)
    # float32: the 20-step bound of test_attention's whole-model test. bfloat16: one bf16
    # ulp (2^-7) of the loss, since ten updates of bf16 activations round differently.
    rtol = 2e-5 if dtype == "float32" else 2.0**-7
    np.testing.assert_allclose(got, want, rtol=rtol)
    assert got[-1] < got[0]  # it learns
