"""layers/layer_layout.py: where each decoder layer sits in the stack's parameter tree.

Round trips between every pair of layouts (numpy, jax arrays, shape structs, optax's
MaskedNode), layouts read back from shapes, and the layer order measured on real praxis
models: a pipelined model (GPipe and circular, plain and repeated stage bodies) given a
plain model's layers relaid into its layout computes the plain model's loss.
"""

import copy
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from praxis import pax_fiddle
from praxis.layers import transformers

import experiments
from layers import architecture
from layers import layer_layout as ll
from paxloom.runner.state.train_state import as_model_batch, praxis_context
from tests.support.tiny import TINY

L = 8
LAYOUTS = [
    ll.StackLayout(L),
    ll.StackLayout(L, repeated=True),
    ll.StackLayout(L, stages=1),
    ll.StackLayout(L, stages=2),
    ll.StackLayout(L, stages=4),
    ll.StackLayout(L, repeated=True, stages=2),
    ll.StackLayout(L, stages=2, circular_repeat=2),
    ll.StackLayout(L, stages=2, circular_repeat=4),
    ll.StackLayout(L, repeated=True, stages=2, circular_repeat=2),
]


def layer_trees(make=np.full):
    """Per-layer trees whose every value names its layer, with a MaskedNode (a moment that
    an optimizer keeps for no frozen parameter)."""
    return [{"layer_norm": {"scale": make((3,), float(i))},
             "ff_layer": {"w": make((3, 5), float(i)), "frozen": optax.MaskedNode()}}
            for i in range(L)]


def flat_shapes(stack) -> dict:
    return {"lm/transformer/" + jax.tree_util.keystr(path, simple=True, separator="/"):
            leaf.shape for path, leaf in jax.tree_util.tree_flatten_with_path(stack)[0]}


def assert_same_layers(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("source,target", list(itertools.product(LAYOUTS, LAYOUTS)),
                         ids=lambda layout: str(layout).replace(" ", "_"))
def test_every_pair_of_layouts_round_trips(source, target):
    layers = layer_trees()
    stored = ll.from_layers(layers, source)
    assert ll.from_shapes(flat_shapes(stored)) == source
    relaid = ll.relayout(stored, source, target)
    assert ll.from_shapes(flat_shapes(relaid)) == target
    assert_same_layers(ll.to_layers(relaid, target), layers)
    assert_same_layers(ll.to_layers(ll.relayout(relaid, target, source), source), layers)


def test_jax_arrays_and_shape_structs_keep_their_kind():
    source, target = ll.StackLayout(L, stages=2), LAYOUTS[-1]
    stored = ll.from_layers(layer_trees(jnp.full), source)
    relaid = ll.relayout(stored, source, target)
    assert all(isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(relaid))
    assert_same_layers(ll.to_layers(relaid, target), layer_trees())
    shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), stored)
    relaid_shapes = ll.relayout(shapes, source, target)
    assert jax.tree_util.tree_map(lambda a: (a.shape, a.dtype), relaid_shapes) == \
        jax.tree_util.tree_map(lambda a: (a.shape, a.dtype), relaid)
    # Leaves are [R=2, S=2, K=2, ...]: layer r*S*K + s*K + i.
    assert relaid["pipeline"]["body"]["repeat"]["sub"]["x_layers_0"]["layer_norm"]["scale"][
        1, 0, 1, 0] == 5


def test_relayout_tree_relays_params_and_every_moment_and_keeps_the_rest():
    source, target = ll.StackLayout(L, stages=2), ll.StackLayout(L)
    params = {"lm": {"transformer": ll.from_layers(layer_trees(), source),
                     "final_ln": {"scale": np.ones(3)}}}
    state = {"step": np.int32(3), "params": params,
             "opt_state": (optax.ScaleByAdamState(np.int32(3), params, params),
                           optax.EmptyState())}
    relaid = ll.relayout_tree(state, source, target)
    assert isinstance(relaid["opt_state"][0], optax.ScaleByAdamState)
    for tree in (relaid["params"], relaid["opt_state"][0].mu, relaid["opt_state"][0].nu):
        assert sorted(tree["lm"]["transformer"]) == [f"x_layers_{i}" for i in range(L)]
        assert "final_ln" in tree["lm"]
        assert_same_layers(ll.to_layers(tree["lm"]["transformer"], target), layer_trees())
    assert relaid["step"] == 3


def test_descriptions_and_mismatches():
    assert [str(layout) for layout in LAYOUTS[:2] + LAYOUTS[3:4] + LAYOUTS[-1:]] == [
        "8 layers", "8 repeated layers", "8 layers as 2 stages x 4",
        "8 layers as 2 circular repeats x 2 stages x 2 repeated"]
    stored = ll.from_layers(layer_trees(), ll.StackLayout(L, stages=2))
    with pytest.raises(ll.LayoutMismatch, match="not 8 layers as 4 stages x 2"):
        ll.to_layers(stored, ll.StackLayout(L, stages=4))
    with pytest.raises(ll.LayoutMismatch, match="8 layers as 2 stages x 4 cannot be laid out"
                       " as 6 layers"):
        ll.relayout(stored, ll.StackLayout(L, stages=2), ll.StackLayout(6))
    assert ll.from_shapes({"lm/final_ln/scale": (3,)}) is None
    assert ll.from_shapes({"lm/transformer/x_layers_1/w": (3,)}) is None  # no x_layers_0


# ----- real praxis models: the layer order --------------------------------------------


def pipelined(tmpl, stages: int, repeat: int):
    """`tmpl` (a LanguageModel config) with its stack split over pipeline stages."""
    tmpl = copy.deepcopy(tmpl)
    stack = tmpl.lm_tpl.stacked_transformer_tpl
    stage = copy.deepcopy(stack)
    if issubclass(stack.cls, transformers.StackedTransformerRepeated):
        stage.x_times = stack.x_times // (stages * repeat)
    else:
        stage.num_layers = stack.num_layers // (stages * repeat)
    tmpl.lm_tpl.stacked_transformer_tpl = pax_fiddle.Config(
        transformers.PipelinedTransformer, pipeline_stage=stage, num_pipeline_stages=stages,
        circular_repeat=repeat, num_pipeline_microbatches=2)
    return tmpl


B, T = 4, 16
_rng = np.random.default_rng(0)
BATCH = {"ids": _rng.integers(0, 512, (B, T)).astype(np.int32),
         "labels": _rng.integers(0, 512, (B, T)).astype(np.int32),
         "weights": np.ones((B, T), np.float32), "paddings": np.zeros((B, T), np.float32),
         "segment_ids": np.ones((B, T), np.int32),
         "segment_pos": np.tile(np.arange(T, dtype=np.int32), (B, 1))}


def template(repeated: bool):
    exp = experiments.BaseExperiment(**{**TINY, "NUM_LAYERS": L, "USE_REPEATED_LAYER": repeated})
    return exp.model_template()


def loss(model, params) -> float:
    with praxis_context(do_eval=True):
        out, _ = jax.jit(lambda p: model.apply({"params": p}, as_model_batch(BATCH),
                                               rngs={"random": jax.random.key(1)}))(params)
    return float(out.total_loss[0])


@pytest.fixture(scope="module")
def plain():
    """(plain model, its float32 params as numpy, its loss on BATCH)."""
    model = pax_fiddle.build(template(repeated=False))
    with praxis_context(do_eval=False):
        params = jax.device_get(jax.jit(lambda k: model.init(
            {"params": k, "random": k}, as_model_batch(BATCH)))(jax.random.key(0))["params"])
    return model, params, loss(model, params)


@pytest.mark.parametrize("stages,repeat,repeated", [
    (2, 1, False), pytest.param(2, 1, True, marks=pytest.mark.slow), (2, 2, False),
    pytest.param(2, 2, True, marks=pytest.mark.slow)])
def test_a_pipelined_model_with_relaid_layers_computes_the_plain_models_loss(
        plain, stages, repeat, repeated):
    model, params, want = plain
    tmpl = pipelined(template(repeated), stages, repeat)
    layout = ll.of_model(tmpl)
    assert layout == ll.StackLayout(L, repeated, stages, repeat)
    piped = pax_fiddle.build(tmpl)
    with praxis_context(do_eval=False):
        shapes = jax.eval_shape(lambda k: piped.init({"params": k, "random": k},
                                                     as_model_batch(BATCH)),
                                jax.random.key(0))["params"]
    assert ll.from_shapes(flat_shapes(shapes["lm"]["transformer"])) == layout
    relaid = ll.relayout_tree(params, ll.StackLayout(L), layout)
    assert jax.tree_util.tree_map(lambda a: a.shape, relaid) == \
        jax.tree_util.tree_map(lambda a: a.shape, shapes)
    np.testing.assert_allclose(loss(piped, relaid), want, rtol=1e-5)
    if (stages, repeat, repeated) == (2, 2, True):  # the check tells orders apart
        layers = ll.to_layers(params["lm"]["transformer"], ll.StackLayout(L))
        swapped = {**relaid, "lm": {**relaid["lm"], "transformer": ll.from_layers(
            layers[1:] + layers[:1], layout)}}
        assert abs(loss(piped, swapped) - want) > 1e-3 * want
    # canonical_weights reads the pipelined tree as the plain one's layers.
    arch = architecture.architecture_of(tmpl)
    assert arch.stack_layout == layout and arch.num_layers == L
    got = architecture.canonical_weights(relaid, arch)["layers"]
    plain_arch = architecture.architecture_of(template(repeated=False))
    assert_same_layers(got, architecture.canonical_weights(params, plain_arch)["layers"])
    # and praxis_params (the import of canonical weights) writes the pipelined layout.
    back = architecture.praxis_params(
        architecture.canonical_weights(params, plain_arch), arch, shapes)
    assert_same_layers(ll.to_layers(back["lm"]["transformer"], layout),
                       ll.to_layers(params["lm"]["transformer"], ll.StackLayout(L)))


def test_canonical_weights_and_praxis_params_of_a_repeated_stack(plain):
    _, params, _ = plain
    layout = ll.StackLayout(L, repeated=True)
    arch = architecture.architecture_of(template(repeated=True))
    assert arch.layout == layout
    relaid = ll.relayout_tree(params, ll.StackLayout(L), layout)
    canonical = architecture.canonical_weights(relaid, arch)
    back = architecture.praxis_params(canonical, arch, relaid)
    assert_same_layers(ll.to_layers(back["lm"]["transformer"], layout),
                       ll.to_layers(params["lm"]["transformer"], ll.StackLayout(L)))
