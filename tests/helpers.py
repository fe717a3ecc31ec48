"""Shared helpers for tests that build a real Trainer on the 8 fake CPU devices."""

import hashlib
import os

import jax
from praxis import pax_fiddle

import experiments
from runner.cluster import mesh as mesh_lib
from runner.training.trainer import Trainer

# A model every test mesh can shard: 8 heads split over up to 8 TP devices.
TINY = dict(
    NUM_LAYERS=2, MODEL_DIMS=64, HIDDEN_DIMS=256, NUM_HEADS=8, DIMS_PER_HEAD=8,
    MAX_SEQ_LEN=64, VOCAB_SIZE=512, FPROP_DTYPE="float32", DATASET="synthetic",
    EVAL_INTERVAL_STEPS=0,
)


def make_trainer(tmp_path, devices=None, experiment=experiments.BaseExperiment, **overrides):
    exp = experiment(**{**TINY, **overrides})
    devices = jax.devices() if devices is None else devices
    run = pax_fiddle.build(exp.run_config())
    mesh = mesh_lib.create_mesh(run.mesh.ici_mesh_shape, run.mesh.dcn_mesh_shape,
                                devices=devices)
    return Trainer(run, mesh, str(tmp_path))


def run_steps(trainer, steps: int, params=None):
    """(per-step losses, final state) of `steps` steps from a fresh state (with `params`
    instead of the initial parameters, if given), each loss read after its step."""
    state = trainer.init_state()
    if params is not None:
        state["params"] = jax.device_put(params, trainer.state_shardings["params"])
    data = trainer.make_train_input()
    losses = []
    for _ in range(steps):
        with jax.set_mesh(trainer.mesh):
            state, metrics = trainer.train_step(state, trainer.to_device(data.next_batch()))
        losses.append(float(metrics["loss"]))
    return losses, state


def train_losses(trainer, steps: int) -> list[float]:
    return run_steps(trainer, steps)[0]


def tree_digest(directory) -> dict:
    """{relative path: sha256} of every file under `directory`: proof nothing was written."""
    return {os.path.relpath(os.path.join(root, name), directory):
            hashlib.sha256(open(os.path.join(root, name), "rb").read()).hexdigest()
            for root, _, names in os.walk(directory) for name in names}
