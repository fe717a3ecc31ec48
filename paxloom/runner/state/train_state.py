"""The sharded train state: model parameters, optimizer state and the step.

Partition specs come from praxis's weight annotations (the WeightHParams each
layer declares), so the sharding of every parameter and of its Adam moments is
decided by the model config, not by the runner.
"""

import math

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from praxis import base_layer, py_utils

from paxloom.core.errors import UserError
from paxloom.runner.cluster.mesh import mesh_shape


def praxis_context(do_eval: bool):
    """The JaxContext praxis layers read (train vs eval behaviour, e.g. dropout)."""
    return base_layer.JaxContext.new_context(
        hparams=base_layer.JaxContext.HParams(do_eval=do_eval)
    )


def as_model_batch(batch: dict, fprop_dtype=jnp.float32) -> py_utils.NestedMap:
    """The praxis input NestedMap; float inputs (weights, paddings) in the compute dtype.

    As paxml does: a float32 `paddings` would promote bfloat16 activations back
    to float32 inside each layer (and break StackedTransformerRepeated's scan).
    Inputs mark batch-padding rows by all-zero token weights; `eval_sample_weights`
    [B] gives praxis the same as one weight per example (the Pax GPU models set
    `apply_eval_sample_weights`).
    """
    batch = {**batch,
             "eval_sample_weights": (jnp.sum(batch["weights"], axis=1) > 0).astype(jnp.float32)}
    return py_utils.NestedMap({
        k: v.astype(fprop_dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v
        for k, v in batch.items()
    })


def param_partition_specs(model, example_batch: dict, mesh: Mesh):
    """PartitionSpecs of the model's parameters, from praxis's annotations."""
    with praxis_context(do_eval=False):
        var_meta = model.abstract_init_with_metadata(
            as_model_batch(example_batch, model.fprop_dtype)
        )
    specs = base_layer.var_partition_specs(
        var_meta, mesh_shape(mesh), list(mesh.axis_names)
    )
    extra = set(specs) - {"params"}
    if extra:
        raise NotImplementedError(f"model has variable collections besides params: {extra}")
    return specs["params"]


def _named_specs(param_specs, abstract_params):
    """(name, PartitionSpec, abstract array) per parameter; names as checkpoints write them."""
    specs = dict(jax.tree_util.tree_flatten_with_path(
        param_specs, is_leaf=lambda x: isinstance(x, P))[0])
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_params)[0]:
        yield jax.tree_util.keystr(path, simple=True, separator="/"), specs[path], leaf


def replicated_matrices(param_specs, abstract_params) -> list[str]:
    """Names of weight matrices (praxis names them `w` or `emb_var`) without any
    sharding annotation: a full copy on every device. On a mesh that shards weights
    this usually means a layer class praxis's sharding helper does not know
    (paxloom/runner/state/partitioning.py)."""
    return [name for name, spec, _ in _named_specs(param_specs, abstract_params)
            if name.rsplit("/", 1)[-1] in ("w", "emb_var")
            and all(axis is None for axis in spec)]


def check_divisible(param_specs, abstract_params, mesh: Mesh) -> None:
    """UserError naming the first parameter a dimension of which does not split evenly over
    the mesh axes its annotation names (JAX would fail later with a long error)."""
    for name, spec, leaf in _named_specs(param_specs, abstract_params):
        for dim, (size, axes) in enumerate(zip(leaf.shape, spec, strict=False)):
            axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
            ways = math.prod(mesh.shape[axis] for axis in axes)
            if size % ways:
                raise UserError(
                    f"parameter {name} {tuple(leaf.shape)}: dimension {dim} ({size}) does not "
                    f"split over mesh axes {'x'.join(axes)} ({ways} devices); make the model "
                    f"sizes (VOCAB_SIZE, NUM_HEADS, MODEL_DIMS, HIDDEN_DIMS, MAX_SEQ_LEN) "
                    f"multiples of the mesh's data and tensor sizes, or change ICI_MESH_SHAPE")


def state_shardings(tx: optax.GradientTransformation, param_specs, abstract_params, mesh: Mesh):
    """NamedShardings for {'step', 'params', 'opt_state'}: Adam moments follow their parameter."""
    abstract_opt_state = jax.eval_shape(tx.init, abstract_params)
    # A state that holds nothing for some parameters (optimizer.train_only) has optax's
    # MaskedNode (no arrays) in their place: it stays.
    opt_specs = optax.tree_map_params(
        tx,
        lambda moment, spec: moment if isinstance(moment, optax.MaskedNode) else spec,
        abstract_opt_state,
        param_specs,
        transform_non_params=lambda _: P(),
        is_leaf=lambda x: isinstance(x, (P, optax.MaskedNode)),
    )
    specs = {"step": P(), "params": param_specs, "opt_state": opt_specs}
    return jax.tree_util.tree_map(
        lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P)
    )


def make_init_fn(model, tx: optax.GradientTransformation, batch_shapes: dict):
    """init(key) -> train state; jit it with out_shardings to create it already sharded.

    `batch_shapes` maps batch keys to jax.ShapeDtypeStruct: the example batch is
    made inside the function, so no host array is baked into the program.
    """

    def init(key):
        batch = {k: jnp.zeros(s.shape, s.dtype) for k, s in batch_shapes.items()}
        with praxis_context(do_eval=False):
            variables = model.init(
                {"params": key, "random": key}, as_model_batch(batch, model.fprop_dtype)
            )
        params = variables["params"]
        return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}

    return init
