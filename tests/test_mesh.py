"""Mesh layout and the Pax global-batch rules on 8 fake CPU devices."""

import re

import jax
import pytest

from paxloom.core import batch
from paxloom.core.errors import UserError
from paxloom.core.mesh_axes import full_shape
from paxloom.runner.cluster import mesh as mesh_lib


@pytest.mark.parametrize("ici, full", [
    ([8, 1, 1], (1, 8, 1, 1, 1)), ([1, 8, 1], (1, 1, 8, 1, 1)), ([1, 1, 8], (1, 1, 1, 1, 8)),
    ([2, 2, 2], (1, 2, 2, 1, 2)), ([2, 1, 2, 2], (2, 1, 2, 1, 2)),
    ([1, 1, 2, 4, 1], (1, 1, 2, 4, 1))])
def test_mesh_axes_follow_ici_shape(ici, full):
    mesh = mesh_lib.create_mesh(ici, [1, 1, 1])
    assert mesh.axis_names == ("stage", "replica", "data", "context", "mdl")
    # [replica, data, mdl] has one stage and no context axis; [stage, replica, data, mdl]
    # no context axis.
    assert mesh_lib.mesh_shape(mesh) == full


def test_a_mesh_error_writes_the_shapes_as_short_as_the_user_can():
    with pytest.raises(UserError, match=r"^ICI_MESH_SHAPE=\[1, 1, 2, 2, 1\] x "
                                        r"DCN_MESH_SHAPE=\[1, 1, 1, 1, 1\] covers 4"):
        mesh_lib.create_mesh([1, 1, 2, 2, 1], [1, 1, 1])
    with pytest.raises(UserError, match=r"^ICI_MESH_SHAPE=\[2, 1, 1, 1\] x "
                                        r"DCN_MESH_SHAPE=\[1, 1, 1, 1\] covers 2"):
        mesh_lib.create_mesh([2, 1, 1, 1, 1], [1, 1, 1])


def test_wrong_product_names_count_and_suggests_a_shape():
    with pytest.raises(UserError) as info:
        mesh_lib.create_mesh([3, 1, 1], [1, 1, 1])
    message = str(info.value)
    assert "covers 3 devices, but this job has 8" in message
    assert "--fdl.ICI_MESH_SHAPE=[8,1,1]" in message
    # The user's own three-entry shape, and on CPU the flag that gives more devices.
    assert message.startswith("ICI_MESH_SHAPE=[3, 1, 1] x DCN_MESH_SHAPE=[1, 1, 1] covers")
    assert "XLA_FLAGS=--xla_force_host_platform_device_count=3" in message
    assert "(1 process x 8)" in message
    with pytest.raises(UserError, match=r"covers 1 device, but this job has 8 .* gives each "
                                        r"process 1 device$"):
        mesh_lib.create_mesh([1, 1, 1], [1, 1, 1])


@pytest.mark.parametrize("ici, devices, suggested", [
    ([1, 16, 1], 8, "[1,8,1]"),  # FSDP stays FSDP
    ([1, 1, 16], 8, "[1,1,8]"),
    ([2, 2, 2], 4, "[1,2,2]"),  # data parallelism gives way before FSDP and tensor parallelism
    ([1, 4, 2], 4, "[1,2,2]"),  # the largest axis shrinks
    ([2, 3, 1], 8, "[2,4,1]"),
    ([2, 1, 2, 2], 4, "[2,1,1,2]"),  # four entries: the stages are kept
    ([1, 1, 2, 4, 1], 4, "[1,1,2,2,1]"),  # five: so is the context axis
    ([1, 1, 1], 8, "[8,1,1]"),  # no axis to scale: data parallelism
])
def test_wrong_product_suggests_the_nearest_shape(ici, devices, suggested):
    with pytest.raises(UserError) as info:
        mesh_lib.create_mesh(ici, [1, 1, 1], devices=jax.devices()[:devices])
    # DCN is written in as many entries as the suggested ICI shape.
    dcn = "[" + ",".join(["1"] * suggested.count(",")) + ",1]"
    assert (f"try --fdl.ICI_MESH_SHAPE={suggested} --fdl.DCN_MESH_SHAPE={dcn}"
            in str(info.value)), info.value
    # main.py hands create_mesh five-entry shapes: the suggestion is written as short.
    with pytest.raises(UserError, match=f"try --fdl.ICI_MESH_SHAPE={re.escape(suggested)} "):
        mesh_lib.create_mesh(full_shape(ici), [1] * 5, devices=jax.devices()[:devices])


def test_wrong_product_across_processes_keeps_a_dcn_shape_that_fits():
    # 2 processes x 4 devices: a DCN shape over the processes stays, ICI fits each process.
    error = mesh_lib._size_error([1, 8, 1], [1, 2, 1], jax.devices(), num_processes=2)
    assert "try --fdl.ICI_MESH_SHAPE=[1,4,1] --fdl.DCN_MESH_SHAPE=[1,2,1]" in str(error)
    error = mesh_lib._size_error([1, 4, 1], [1, 4, 1], jax.devices(), num_processes=2)
    assert "try --fdl.ICI_MESH_SHAPE=[1,4,1] --fdl.DCN_MESH_SHAPE=[1,2,1]" in str(error)


def test_dcn_must_match_process_count():
    with pytest.raises(UserError, match="DCN_MESH_SHAPE=\\[2, 1, 1\\] has 2 slices, but there are 1"):
        mesh_lib.create_mesh([4, 1, 1], [2, 1, 1])


@pytest.mark.parametrize("ici,percore,expected", [
    ([8, 1, 1], 4, 32),
    ([1, 8, 1], 1, 8),
    ([4, 1, 2], 0.5, 4),   # Pax README: TP=2 with 0.5 -> one sequence per model replica
    ([2, 2, 2], 0.5, 4),
    ([1, 1, 8], 0.125, 1),
    ([2, 1, 2, 2], 0.5, 4),  # pipeline stages split the input batch too (seed: fractional)
])
def test_global_batch_is_percore_times_devices(ici, percore, expected):
    mesh = mesh_lib.create_mesh(ici, [1, 1, 1])
    assert batch.layout(percore, mesh_lib.mesh_shape(mesh)).global_batch == expected


def test_fractional_batch_without_tensor_parallelism_is_an_error():
    mesh = mesh_lib.create_mesh([8, 1, 1], [1, 1, 1])
    with pytest.raises(UserError, match="does not split over 8 data-parallel shards.*smallest "
                                        "PERCORE_BATCH_SIZE for this mesh is 1"):
        batch.layout(0.5, mesh_lib.mesh_shape(mesh))


def test_non_integer_global_batch_is_an_error():
    mesh = mesh_lib.create_mesh([1, 1, 8], [1, 1, 1])
    with pytest.raises(UserError, match="is not a whole number of sequences"):
        batch.layout(0.3, mesh_lib.mesh_shape(mesh))


def test_single_process_loads_the_whole_batch():
    mesh = mesh_lib.create_mesh([2, 2, 2], [1, 1, 1])
    assert mesh_lib.process_batch_rows(mesh, 8) == (0, 8)


def test_mesh_over_a_subset_of_devices():
    mesh = mesh_lib.create_mesh([1, 1, 1], [1, 1, 1], devices=jax.devices()[:1])
    assert mesh.devices.size == 1
