"""Each patch in layers/praxis_compat.py, and the praxis call it serves."""

import jax
import jax.numpy as jnp
import numpy as np

import layers  # noqa: F401  (applies the patches)


def test_xla_client_alias_serves_praxis_base_input():
    # praxis/base_input.py does `from jax.lib import xla_client as xc` at import.
    from jax.lib import xla_client
    from praxis import base_input

    assert base_input.xc is xla_client
    assert hasattr(xla_client, "OpSharding")


def test_tree_map_alias_serves_stacked_transformer_repeated():
    assert jax.tree_map is jax.tree_util.tree_map
    # praxis layers/repeats.py uses jax.tree_map inside the scanned layer stack.
    from praxis import base_layer, pax_fiddle
    from praxis.layers import linears, repeats

    tpl = pax_fiddle.Config(
        repeats.Repeat, name="rep", x_times=3,
        sub_tpl=pax_fiddle.Config(linears.FeedForward, input_dims=4, output_dims=4),
    )
    layer = pax_fiddle.instantiate(tpl)
    x = jnp.ones((2, 4))
    with base_layer.JaxContext.new_context():
        variables = layer.init(jax.random.key(0), x)
        out = layer.apply(variables, x)
    assert out.shape == (2, 4)
    leaves = jax.tree_util.tree_leaves(variables)
    assert all(leaf.shape[0] == 3 for leaf in leaves)  # one stacked copy per repeat


def test_tree_flatten_alias_serves_py_utils_update_matched_variables():
    assert jax.tree_flatten is jax.tree_util.tree_flatten
    from praxis import py_utils

    old = py_utils.NestedMap(encoder=py_utils.NestedMap(w=np.zeros(2)), head=np.zeros(3))
    new = py_utils.NestedMap(encoder=py_utils.NestedMap(w=np.ones(2)), head=np.ones(3))
    # praxis py_utils.update_matched_variables flattens both trees with jax.tree_flatten.
    out = py_utils.update_matched_variables(old, new, "encoder.*")
    np.testing.assert_array_equal(out.encoder.w, np.ones(2))
    np.testing.assert_array_equal(out.head, np.zeros(3))


def _sharding_constraints(trainer, context) -> int:
    """Activation sharding constraints in the train step lowered under `context`."""
    example = {k: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=trainer.data_sharding)
               for k, s in trainer.batch_shapes.items()}
    with context:
        text = trainer.train_step.lower(trainer.abstract_state, example).as_text()
    return text.count("sharding_constraint")


def test_praxis_sees_the_mesh_of_jax_set_mesh(tmp_path, monkeypatch):
    """praxis looks for the mesh in jax's legacy resource environment, which only the
    deprecated Mesh context manager fills; the patch makes its activation annotations see the mesh
    of `jax.set_mesh` instead: as many as praxis itself finds under the old context, where
    unpatched praxis under jax.set_mesh finds none (the check fails without the patch)."""
    import warnings

    from praxis import py_utils

    from tests.support.training import make_trainer

    def trainer():  # a fresh one each time: jit caches a trace per context
        return make_trainer(tmp_path, ICI_MESH_SHAPE=[1, 4, 2])

    patched = _sharding_constraints(trainer(), jax.set_mesh(trainer().mesh))

    def praxis_own_check():  # py_utils.global_mesh_defined before the patch
        return py_utils.pxla.thread_resources.env.physical_mesh.devices.shape != ()

    monkeypatch.setattr(py_utils, "global_mesh_defined", praxis_own_check)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        legacy_trainer = trainer()
        legacy = _sharding_constraints(legacy_trainer, legacy_trainer.mesh)  # the old context
        unpatched = _sharding_constraints(trainer(), jax.set_mesh(legacy_trainer.mesh))
    assert patched > 0 and patched == legacy and unpatched == 0
