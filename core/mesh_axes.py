"""The mesh's named axes, the one vocabulary of code and docs.

Pax's ICI_MESH_SHAPE and DCN_MESH_SHAPE are `[replica, data, mdl]` (the Pax README's
`[data, fsdp, tensor]`: data parallelism, fully sharded data parallelism, tensor
parallelism); a four-entry shape puts the pipeline `stage` count first.
"""

# (PP, DP, FSDP, TP). Decoder layers are split over stage; model weights are laid out on
# (data, mdl) and replicated over replica.
MESH_AXIS_NAMES = ("stage", "replica", "data", "mdl")

# The input batch is split over these axes (DP and FSDP, and the stages: outside the
# pipelined layers, the embedding and softmax run data-parallel over them, as in Pax);
# the tensor-parallel axis sees the whole batch.
BATCH_AXES = ("stage", "replica", "data")


def with_stage_axis(shape) -> list[int]:
    """A mesh shape over MESH_AXIS_NAMES: a three-entry [replica, data, mdl] gets stage 1."""
    shape = list(shape)
    return [1, *shape] if len(shape) == len(MESH_AXIS_NAMES) - 1 else shape
