"""Make praxis 1.4.0 run on the jax this project pins (0.10).

praxis 1.4.0, the last release on PyPI, was written against jax 0.4.26. Newer
jax removed a few names it still uses at import or trace time. Each patch below
restores one name, says which praxis call needs it, and is covered by
tests/test_praxis_compat.py. Import this module before anything from praxis;
`layers/__init__.py` does, so `import layers` is enough.
"""

import math

import jax
import jax.lib
import jax.tree_util

# praxis/base_input.py does `from jax.lib import xla_client as xc` at import time
# (it builds an `xc.OpSharding` for host-to-global input layouts). jax 0.5
# stopped re-exporting xla_client from jax.lib; the module itself still exists.
if not hasattr(jax.lib, "xla_client"):
    from jax._src.lib import xla_client as _xla_client

    jax.lib.xla_client = _xla_client

# jax 0.6 removed the `jax.tree_*` aliases of `jax.tree_util.tree_*`. praxis 1.4.0
# still calls two of them:
#   jax.tree_map      layers/repeats.py (StackedTransformerRepeated's scan),
#                     layers/attentions.py, flax_utils.py, py_utils.py
#   jax.tree_flatten  py_utils.py (used by praxis's masked tree helpers)
for _name in ("tree_map", "tree_flatten"):
    if not hasattr(jax, _name):
        setattr(jax, _name, getattr(jax.tree_util, _name))

# praxis 1.4.0 finds the mesh that its activation sharding annotations name in jax's
# legacy resource environment (pxla.thread_resources, deprecated since jax 0.8.2), which
# only the deprecated Mesh context manager fills. Under `jax.set_mesh(mesh)`, which sets the
# abstract mesh instead:
#   py_utils.global_mesh_defined  is False, so py_utils.with_sharding_constraint (behind
#                                 base_layer.maybe_shard, and layers/sharding.derive/shard)
#                                 drops every activation annotation, silently: fewer
#                                 constraints, a different SPMD program, and the wrong
#                                 gradients that layers/softmax.py's gather avoids;
#   sharding.num_shards_on_dim    counts one shard on every axis (the optional "[t]"
#                                 dimensions of grouped-query attention's annotations).
# Both read the abstract mesh that jax.set_mesh sets (inside jit too).
try:
    from praxis import base_layer as _base_layer  # noqa: E402  (after the patches above)
except ModuleNotFoundError as _missing:
    # praxis 1.4.0 pins jax 0.4.26 and TensorFlow 2.9, so it is installed without them.
    from paxloom.core.errors import UserError

    raise UserError(f"{_missing.name} is not installed: it goes in without its stale pins, "
                    f"pip install --no-deps -c constraints.txt -r requirements-nodeps.txt (a "
                    f"Paxloom clone's files; `make install` does it)") from None
from praxis import py_utils as _py_utils  # noqa: E402
from praxis.layers import sharding as _sharding  # noqa: E402


def _global_mesh_defined() -> bool:
    return not jax.sharding.get_abstract_mesh().empty


def _num_shards_on_dim(dim_sharding) -> int:
    mesh = jax.sharding.get_abstract_mesh()
    mapping = None
    if _base_layer.JaxContext.has_context():
        mapping = _base_layer.cur_jax_context().hparams.mesh_axes_transpose
    if dim_sharding is None:
        axes = ()
    elif isinstance(dim_sharding, str):
        axes = (dim_sharding,)
    else:
        axes = tuple(dim_sharding)
    sizes = {} if mesh.empty else dict(mesh.shape)
    return math.prod(sizes.get(_base_layer.transpose_one_axis(a, mapping), 1) for a in axes)


_py_utils.global_mesh_defined = _global_mesh_defined
_sharding.num_shards_on_dim = _num_shards_on_dim

# praxis's circular pipeline (pipeline.CircularLayerwiseShardablePipelined) initialises its
# [circular_repeat, stages, ...] weights with an nn.vmap over the repeats nested around the
# vmap over the stages, both naming the stage mesh axis as spmd_axis_name. jax 0.4.26
# accepted that; newer jax refuses a sharding constraint inside that names an enclosing
# vmap's spmd axis ("vmap spmd_axis_name ('stage',) cannot appear in
# with_sharding_constraint spec"). The repeats' dimension is not sharded (praxis's own
# sub_weight_split_dims_mapping for it is (None,)), so that vmap needs no spmd axis.
import flax.linen as _nn  # noqa: E402
from praxis.layers import pipeline as _pipeline  # noqa: E402


class _PipelineFlax:
    """flax.linen as praxis.layers.pipeline sees it: vmap drops the spmd axis of the
    circular repeats' vmap (the one whose unsharded dimension its metadata says: (None,)).
    The stages' vmap keeps it: the stage dimension of everything inside stays on the stage
    axis (without it, every sharding constraint inside would replicate that dimension)."""

    def __getattr__(self, name):
        return getattr(_nn, name)

    @staticmethod
    def vmap(target, *args, metadata_params=None, spmd_axis_name=None, **kwargs):
        if (metadata_params or {}).get("sub_weight_split_dims_mapping") == (None,):
            spmd_axis_name = None
        return _nn.vmap(target, *args, metadata_params=metadata_params,
                        spmd_axis_name=spmd_axis_name, **kwargs)


_pipeline.nn = _PipelineFlax()
