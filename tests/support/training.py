"""A real Trainer on the 8 fake CPU devices, and its steps."""

import jax
from praxis import pax_fiddle

import experiments
from paxloom.runner.cluster import mesh as mesh_lib
from paxloom.runner.training.trainer import Trainer
from tests.support.tiny import TINY


def make_trainer(tmp_path, devices=None, experiment=experiments.BaseExperiment, **overrides):
    """A Trainer of `experiment` with the tiny model (TINY and `overrides`) writing to tmp_path."""
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
