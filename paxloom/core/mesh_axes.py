"""The mesh's named axes, the one vocabulary of code and docs.

Pax's ICI_MESH_SHAPE and DCN_MESH_SHAPE are `[replica, data, mdl]` (the Pax README's
`[data, fsdp, tensor]`: data parallelism, fully sharded data parallelism, tensor
parallelism); a four-entry shape puts the pipeline `stage` count first, and a five-entry
shape `[stage, replica, data, context, mdl]` adds context parallelism: each sequence split
over `context` (docs/guides/long-context.md). Shorter shapes have 1 for what they leave out.
"""

import math

# (PP, DP, FSDP, CP, TP). Decoder layers are split over stage; model weights are laid out
# on (data, context, mdl) and replicated over replica; sequences are split over context.
MESH_AXIS_NAMES = ("stage", "replica", "data", "context", "mdl")
CONTEXT_AXIS = "context"

# The input batch is split over these axes (DP and FSDP, and the stages: outside the
# pipelined layers, the embedding and softmax run data-parallel over them, as in Pax);
# the tensor-parallel axis sees the whole batch, and the context axis a part of each row.
BATCH_AXES = ("stage", "replica", "data")


def full_shape(shape) -> list[int]:
    """A mesh shape as the user writes it (3, 4 or 5 entries) -> one over MESH_AXIS_NAMES:
    [replica, data, mdl] gets stage 1 and context 1, [stage, replica, data, mdl] context 1."""
    shape = list(shape)
    if len(shape) == 3:
        shape = [1, *shape]
    if len(shape) == 4:
        shape = [*shape[:3], 1, shape[3]]
    return shape


def written_shapes(*shapes) -> list[list[int]]:
    """The inverse of full_shape for messages: shapes over MESH_AXIS_NAMES in the fewest
    entries that say them all (no context axis: four; no stage either: three)."""
    shapes = [full_shape(s) for s in shapes]
    if all(s[3] == 1 for s in shapes):
        shapes = [[*s[:3], s[4]] for s in shapes]
        if all(s[0] == 1 for s in shapes):
            shapes = [s[1:] for s in shapes]
    return shapes


def written_like(original, shape) -> list[int]:
    """`shape` (over MESH_AXIS_NAMES) in as many entries as `original`, a shape as the user
    wrote it, which had 1 for every axis it left out."""
    shape = list(shape)
    if len(original) < 5:
        shape = [*shape[:3], shape[4]]
    return shape[1:] if len(original) < 4 else shape


def axis_size(ici_mesh_shape, dcn_mesh_shape, name: str) -> int:
    """The mesh's size along axis `name` (ICI x DCN)."""
    index = MESH_AXIS_NAMES.index(name)
    return full_shape(ici_mesh_shape)[index] * full_shape(dcn_mesh_shape)[index]


def mesh_size(ici_mesh_shape, dcn_mesh_shape) -> list[int]:
    """The whole mesh's shape over MESH_AXIS_NAMES (ICI x DCN per axis)."""
    return [i * d for i, d in zip(full_shape(ici_mesh_shape), full_shape(dcn_mesh_shape),
                                  strict=True)]


def num_devices(ici_mesh_shape, dcn_mesh_shape) -> int:
    return math.prod(mesh_size(ici_mesh_shape, dcn_mesh_shape))
