"""The batch layout is derived in one place (paxloom/core/batch.py): the experiment's checks, the
trainer, the planner and --print_config read the same global batch, sub-batches and
microbatches, here for a pipelined, accumulated configuration across two nodes."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from praxis import pax_fiddle

import experiments
from paxloom.core import batch, spec
from paxloom.core.errors import UserError
from paxloom.launch import plan, record
from paxloom.runner.cluster import mesh as mesh_lib
from paxloom.runner.training.trainer import Trainer
from tests.support.tiny import TINY

# 2 nodes (DCN replica axis) x 4 devices: 2 stages x 2 data shards within each node.
ACROSS_NODES = dict(ICI_MESH_SHAPE=[2, 1, 2, 1], DCN_MESH_SHAPE=[1, 2, 1, 1],
                    PERCORE_BATCH_SIZE=2, GRADIENT_ACCUMULATION_STEPS=2, NUM_MICROBATCHES=2)


def test_trainer_planner_and_print_config_read_one_layout(tmp_path):
    exp = experiments.BaseExperiment(**{**TINY, **ACROSS_NODES})
    config = exp.run_config()
    expected = exp.batch_layout()
    assert (expected.global_batch, expected.sub_batch, expected.num_microbatches,
            expected.microbatch_size, expected.batch_shards) == (16, 8, 2, 4, 8)

    run = pax_fiddle.build(config)
    # One process holds the 8 devices, laid out as the two nodes' hybrid mesh would be.
    devices = np.asarray(jax.devices()[:8]).reshape(spec.mesh_size(run.mesh))
    trainer = Trainer(run, Mesh(devices, mesh_lib.MESH_AXIS_NAMES), str(tmp_path))
    planned = plan.plan(exp, config, compiler="cpu")
    assert trainer.batch_layout == planned.batch == spec.batch_layout(run) == expected
    assert expected.summary() in record.config_report(exp, config).splitlines()
    assert expected.summary() == (
        "global batch = PERCORE_BATCH_SIZE 2 x 8 devices = 16 sequences per optimizer "
        "update, run as GRADIENT_ACCUMULATION_STEPS = 2 sub-batches of 8, its rows split "
        "over 8 batch shards, each in 2 pipeline microbatches of 4")


@pytest.mark.parametrize("percore, steps, message", [
    (0.3, 1, "is not a whole number of sequences"),
    (0.5, 1, "does not split over 8 data-parallel shards"),
    (1, 3, "GRADIENT_ACCUMULATION_STEPS=3 does not split GLOBAL_BATCH_SIZE=8"),
])
def test_a_batch_that_does_not_split_is_one_line(percore, steps, message):
    with pytest.raises(UserError, match=message) as info:
        batch.layout(percore, [1, 8, 1], steps)
    assert "\n" not in str(info.value)
    # --print_config still shows such a layout, as the run would compute it.
    assert batch.layout(percore, [1, 8, 1], steps, check=False).num_devices == 8
