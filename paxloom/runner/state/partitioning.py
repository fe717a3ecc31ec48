"""Sharding a model template for the mesh: applied once, last, whatever the template holds.

Experiments build unsharded praxis templates (BaseExperiment.model_template); this
adds praxis's canonical "v1" annotations for the (stage, replica, data, mdl) mesh:
weights laid out on (data, mdl) and replicated over replica, activations split on the
batch over (replica, data) and on model dimensions over mdl. A pipelined stack
(praxis PipelinedTransformer) also has its stage dimension on stage, and the layers
outside it (embedding, softmax) split the batch over stage too, as paxml's
TransformerLmSpmdPipelineAdafactor lays them out. Because it runs after the
experiment has swapped any layer template (attention, feed-forward, norm), the
swapped layers are annotated like the ones they replaced.
"""

import copy

import fiddle as fdl
from praxis import pax_fiddle
from praxis.layers import embedding_softmax, transformers

from paxloom.core.mesh_axes import BATCH_AXES, CONTEXT_AXIS, MESH_AXIS_NAMES, full_shape


def shard_model(template: pax_fiddle.Config, mesh_shape) -> pax_fiddle.Config:
    """A copy of the LanguageModel `template` annotated for a mesh of `mesh_shape`.

    `mesh_shape` is the whole mesh (ICI x DCN per axis) over MESH_AXIS_NAMES (or written
    shorter: mesh_axes.full_shape). With a context axis, activations split their sequence
    dimension over it and weights their `data` dimension over (data, context), as praxis's
    `seq_axis` lays them out (context parallelism shards weights like FSDP, as MaxText's).
    """
    model = copy.deepcopy(template)
    mesh_shape = full_shape(mesh_shape)
    stage, replica, data, _, mdl = MESH_AXIS_NAMES
    seq = CONTEXT_AXIS if mesh_shape[MESH_AXIS_NAMES.index(CONTEXT_AXIS)] > 1 else None
    lm = model.lm_tpl
    # praxis's helper also switches shared embeddings to one-hot matmul lookups;
    # the template's own choice of lookup is kept.
    lookups = {name: getattr(lm, name).lookup_style for name in ("softmax_tpl",
                                                                 "separate_embedding_tpl")
               if _has_lookup_style(getattr(lm, name, None))}
    # praxis's helper knows FullSoftmax by identity, not subclasses (SharedEmbeddingSoftmax
    # subclasses it does accept): annotate a subclass, such as layers/softmax.py's chunked
    # one, as its praxis base and put its class back afterwards.
    softmax_cls = fdl.get_callable(lm.softmax_tpl) if lm.softmax_tpl is not None else None
    as_full_softmax = (softmax_cls is not None
                       and issubclass(softmax_cls, embedding_softmax.FullSoftmax)
                       and not issubclass(softmax_cls, embedding_softmax.SharedEmbeddingSoftmax)
                       and softmax_cls is not embedding_softmax.FullSoftmax)
    if as_full_softmax:
        own_args = dict(lm.softmax_tpl.__arguments__)  # the subclass's fields are dropped
        fdl.update_callable(lm.softmax_tpl, embedding_softmax.FullSoftmax,
                            drop_invalid_args=True)
    lm = lm.cls.set_sharding_params_v1(
        lm, replica_axis=replica, data_axis=data, mdl_axis=mdl, seq_axis=seq,
        ici_mesh_shape=mesh_shape, dcn_mesh_shape=None, mesh_axis_names=list(MESH_AXIS_NAMES),
        training_optimized=True,
    )
    if as_full_softmax:
        fdl.update_callable(lm.softmax_tpl, softmax_cls)
        for name, value in own_args.items():
            if name not in lm.softmax_tpl.__arguments__:
                setattr(lm.softmax_tpl, name, value)
    for name, style in lookups.items():
        getattr(lm, name).lookup_style = style
    if issubclass(lm.stacked_transformer_tpl.cls, transformers.PipelinedTransformer):
        _shard_pipeline(lm, stage, seq, mdl)
    model.lm_tpl = lm
    model.ici_mesh_shape = mesh_shape
    model.mesh_axis_names = list(MESH_AXIS_NAMES)
    return model


def _shard_pipeline(lm: pax_fiddle.Config, stage: str, seq: str | None, mdl: str) -> None:
    """The stage dimension of the pipelined layers' weights on `stage`, and the embedding
    lookup (the separate embedding, or the tied softmax) in data parallelism over every
    batch axis.

    paxml also pins the pipeline's output (`final_out`) to that layout. Here it is left to
    XLA: with it, the Llama family's gradients on a [2 stages, 2 data, 2 model] CPU mesh
    came out wrong (against a one-device reference; the GPT's did not), and without it
    both match (tests/test_pipeline.py)."""
    lm.stacked_transformer_tpl.weight_split_dims_mapping.stages = [stage]
    activations = [BATCH_AXES, seq, mdl]
    embedding = lm.separate_embedding_tpl or lm.softmax_tpl
    embedding.activation_split_dims_mapping.emb_out_split_dims_mapping = activations
    embedding.activation_split_dims_mapping.out = activations


def _has_lookup_style(layer) -> bool:
    return layer is not None and issubclass(
        layer.cls, (embedding_softmax.SharedEmbeddingSoftmax, embedding_softmax.Embedding))
