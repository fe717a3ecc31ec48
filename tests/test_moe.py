"""The dropless mixture of experts (layers/moe.py) against a per-expert loop written here,
its capacity path, its expert-parallel sharding, and the run around it (issue 32)."""

import importlib.metadata
import importlib.util
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from praxis import base_layer, pax_fiddle
from praxis.layers import normalizations

from experiments import registry
from experiments.llama import LlamaBase
from layers import moe
from paxloom.core.errors import UserError
from paxloom.runner.training import throughput
from tests.support.processes import assert_one_line, run_main
from tests.support.training import make_trainer, train_losses

pytestmark = pytest.mark.usefixtures("exact_matmuls")

D, H, E, K = 16, 24, 4, 2
EPSILON = 1e-6
# The grouped-matmul backends: tokamax, an optional extra (setup.cfg [moe]), is in the test
# environment, so its rows run here, on the CPU, against the same references.
GROUPED = ["ragged_dot", "tokamax"]


def layer_config(**fields):
    return pax_fiddle.Config(
        moe.MoeFeedForward, name="moe", input_dims=D, expert_hidden_dims=H, num_experts=E,
        num_experts_per_token=K, ln_tpl=pax_fiddle.Config(normalizations.RmsNorm,
                                                          epsilon=EPSILON, direct_scale=False),
        **fields)


def init(config, x, paddings):
    layer = pax_fiddle.instantiate(config)
    with base_layer.JaxContext.new_context():
        variables = layer.init(jax.random.key(1), x, paddings)
    # A non-trivial norm scale, so the reference has to apply it.
    params = dict(variables["params"])
    params["layer_norm"] = {"scale": 0.1 * jax.random.normal(jax.random.key(2), (D,))}
    return layer, params


def apply(layer, params, x, paddings):
    with base_layer.JaxContext.new_context():
        out, collections = layer.apply({"params": params}, x, paddings,
                                       mutable=[base_layer.AUX_LOSS, base_layer.SUMMARIES])
    return out, collections


def silu(a):
    return a / (1 + np.exp(-a))


def reference(params, x, paddings, *, renormalize=True, capacity_factor=0.0, shared=False):
    """The layer's output, token by token and expert by expert, in float64 numpy.

    Routing: softmax of the normalised token times the router, the k largest, renormalised
    to sum to 1 (Mixtral). With a capacity factor, each expert of each sequence takes the
    top-1 choices of its tokens in order, then the top-2 ones, up to its capacity."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    x = np.asarray(x, np.float64)
    b, length, _ = x.shape
    normed = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + EPSILON) * (
        1 + p["layer_norm"]["scale"])
    out = np.zeros_like(x)
    for row in range(b):
        choices = []  # per token: [(expert, weight)] best first
        for t in range(length):
            logits = normed[row, t] @ p["router"]
            probs = np.exp(logits - logits.max())
            probs /= probs.sum()
            best = np.argsort(-probs, kind="stable")[:K]
            weights = probs[best] / (probs[best].sum() if renormalize else 1.0)
            choices.append(list(zip(best, weights, strict=True)))
        kept = np.ones((length, K), bool)
        if capacity_factor:
            capacity = math.ceil(capacity_factor * length * K / E)
            load = np.zeros(E, int)
            for slot in range(K):
                for t in range(length):
                    expert = choices[t][slot][0]
                    kept[t, slot] = load[expert] < capacity and not paddings[row, t]
                    load[expert] += kept[t, slot]
        for t in range(length):
            h = normed[row, t]
            for slot, (e, w) in enumerate(choices[t]):
                if kept[t, slot]:
                    inner = silu(h @ p["wi_gate"][e]) * (h @ p["wi_up"][e])
                    out[row, t] += w * (inner @ p["wo"][e])
            if shared:
                inner = silu(h @ p["shared_gate"]) * (h @ p["shared_up"])
                gate = 1 / (1 + np.exp(-(h @ p["shared_expert_gate"])))
                out[row, t] += gate[0] * (inner @ p["shared_down"])
            out[row, t] *= 1.0 - paddings[row, t]
    return x + out


def inputs(b=2, length=8):
    x = jax.random.normal(jax.random.key(0), (b, length, D))
    paddings = jnp.zeros((b, length)).at[1, -2:].set(1.0)
    return x, paddings


@pytest.mark.parametrize("backend", GROUPED)
def test_dropless_output_equals_a_per_expert_loop(backend):
    x, paddings = inputs()
    layer, params = init(layer_config(backend=backend), x, paddings)
    out, _ = apply(layer, params, x, paddings)
    np.testing.assert_allclose(out, reference(params, x, np.asarray(paddings)), rtol=1e-5,
                               atol=1e-5)


def test_the_reference_tells_routing_apart():
    """The check above can fail: the same weights routed without renormalisation differ."""
    x, paddings = inputs()
    layer, params = init(layer_config(), x, paddings)
    out, _ = apply(layer, params, x, paddings)
    other = reference(params, x, np.asarray(paddings), renormalize=False)
    assert np.max(np.abs(np.asarray(out) - other)) > 1e-3


def test_shared_expert_and_unnormalised_routing_equal_the_loop():
    x, paddings = inputs()
    config = layer_config(renormalize_top_k=False, shared_hidden_dims=12,
                          gate_shared_expert=True)
    layer, params = init(config, x, paddings)
    out, _ = apply(layer, params, x, paddings)
    np.testing.assert_allclose(
        out, reference(params, x, np.asarray(paddings), renormalize=False, shared=True),
        rtol=1e-5, atol=1e-5)


def dense_loop(params, x, paddings):
    """The layer's maths with every expert run on every token and masked: no sorting, no
    grouped matmul; differentiable, for the gradient check."""
    scale = 1 + params["layer_norm"]["scale"]
    normed = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + EPSILON) * scale
    probs = jax.nn.softmax(normed @ params["router"], axis=-1)
    top, experts = jax.lax.top_k(probs, K)
    top = top / top.sum(-1, keepdims=True)
    gates = jnp.sum(jax.nn.one_hot(experts, E) * top[..., None], axis=-2)  # [B, L, E]
    out = 0.0
    for e in range(E):
        inner = jax.nn.silu(normed @ params["wi_gate"][e]) * (normed @ params["wi_up"][e])
        out = out + gates[..., e:e + 1] * (inner @ params["wo"][e])
    return x + out * (1.0 - paddings[..., None])


@pytest.mark.parametrize("backend", GROUPED)
def test_dropless_gradients_equal_the_dense_loop(backend):
    x, paddings = inputs()
    layer, params = init(layer_config(backend=backend), x, paddings)
    np.testing.assert_allclose(dense_loop(params, x, paddings),
                               reference(params, x, np.asarray(paddings)), rtol=1e-5, atol=1e-5)
    probe = jax.random.normal(jax.random.key(3), x.shape)

    def layer_objective(p):
        return jnp.sum(apply(layer, p, x, paddings)[0] * probe)

    grads = jax.grad(layer_objective)(params)
    expected = jax.grad(lambda p: jnp.sum(dense_loop(p, x, paddings) * probe))(params)
    for name in ("router", "wi_gate", "wi_up", "wo"):
        np.testing.assert_allclose(grads[name], expected[name], rtol=1e-4, atol=1e-6,
                                   err_msg=name)


def test_capacity_path_equals_dropless_when_nothing_is_dropped():
    x, paddings = inputs()
    layer, params = init(layer_config(), x, paddings)
    # Capacity E/K times the mean load = a whole sequence: no expert can overflow.
    roomy, _ = init(layer_config(capacity_factor=E / K), x, paddings)
    out, _ = apply(layer, params, x, paddings)
    capped, collections = apply(roomy, params, x, paddings)
    np.testing.assert_array_equal(out, capped)
    dropped = collections[base_layer.SUMMARIES]["step_metric:moe/dropped_fraction_scalar"]
    assert float(dropped) == 0.0


@pytest.mark.parametrize("backend", GROUPED)
def test_capacity_path_drops_what_the_loop_drops(backend):
    """Dropped assignments sort past every expert's rows: the grouped matmul leaves them."""
    x, paddings = inputs(length=16)
    tight, params = init(layer_config(capacity_factor=0.5, backend=backend), x, paddings)
    out, collections = apply(tight, params, x, paddings)
    np.testing.assert_allclose(
        out, reference(params, x, np.asarray(paddings), capacity_factor=0.5), rtol=1e-5,
        atol=1e-5)
    dropped = collections[base_layer.SUMMARIES]["step_metric:moe/dropped_fraction_scalar"]
    assert 0.4 < float(dropped) < 0.6  # half the mean load fits: about half is dropped


@pytest.mark.parametrize("capacity_factor", [0.5, E / K])
def test_padded_backend_computes_what_the_grouped_matmuls_do(capacity_factor):
    """MOE_BACKEND='padded' (each expert's capacity as a buffer, batched matmuls) against
    'ragged_dot' on the same capacity path: with drops and without."""
    x, paddings = inputs(length=16)
    grouped, params = init(layer_config(capacity_factor=capacity_factor), x, paddings)
    padded, _ = init(layer_config(capacity_factor=capacity_factor, backend="padded"), x,
                     paddings)
    np.testing.assert_allclose(apply(padded, params, x, paddings)[0],
                               apply(grouped, params, x, paddings)[0], rtol=1e-6, atol=1e-6)


def test_router_losses_are_aux_losses():
    x, paddings = inputs()
    layer, params = init(layer_config(load_balancing_weight=0.1, router_z_loss_weight=0.01),
                         x, paddings)
    _, collections = apply(layer, params, x, paddings)
    summaries, aux = collections[base_layer.SUMMARIES], collections[base_layer.AUX_LOSS]
    balance = float(summaries["step_metric:moe/load_balancing_loss_scalar"])
    z = float(summaries["step_metric:moe/router_z_loss_scalar"])
    assert balance >= 1.0 - 1e-6  # E * sum(f * p): k (here 2) when f and p are uniform
    np.testing.assert_allclose(aux["moe_load_balancing_loss"].value, 0.1 * balance, rtol=1e-6)
    np.testing.assert_allclose(aux["moe_router_z_loss"].value, 0.01 * z, rtol=1e-6)


# ----- the run: sharding, losses, metrics ---------------------------------------------------

MOE = dict(NUM_EXPERTS=8, NUM_EXPERTS_PER_TOKEN=2, MOE_HIDDEN_DIMS=32, NUM_KV_HEADS=4,
           LOAD_BALANCING_WEIGHT=0.01, ROUTER_Z_LOSS_WEIGHT=1e-3, MAX_STEPS=3)


def moe_losses(tmp_path, mesh, devices=None, **overrides):
    trainer = make_trainer(tmp_path, devices=devices, experiment=LlamaBase,
                           ICI_MESH_SHAPE=mesh, **{**MOE, **overrides})
    return train_losses(trainer, 3)


@pytest.fixture(scope="module")
def unsharded(tmp_path_factory):
    """capacity factor -> the one-device losses (the same 8 rows), each computed once."""
    losses = {}

    def of(capacity_factor):
        if capacity_factor not in losses:
            losses[capacity_factor] = moe_losses(
                tmp_path_factory.mktemp("one"), [1, 1, 1], jax.devices()[:1],
                CAPACITY_FACTOR=capacity_factor, PERCORE_BATCH_SIZE=8)
        return losses[capacity_factor]

    return of


@pytest.mark.parametrize("mesh", [[1, 8, 1], [2, 4, 1], [1, 4, 2]],
                         ids=["experts-over-8", "experts-over-4-dp2", "experts-over-4-tp2"])
@pytest.mark.parametrize("capacity_factor", [
    0.0, pytest.param(1.0, marks=pytest.mark.slow)], ids=["dropless", "capacity"])
def test_sharded_experts_train_to_the_unsharded_losses(tmp_path, unsharded, mesh,
                                                       capacity_factor):
    losses = moe_losses(tmp_path, mesh, CAPACITY_FACTOR=capacity_factor)
    np.testing.assert_allclose(losses, unsharded(capacity_factor), rtol=1e-4)


@pytest.mark.slow  # the layer tests above check tokamax's matmuls; this, their sharding
@pytest.mark.parametrize("backend", GROUPED[1:])
def test_other_grouped_backends_train_sharded_to_the_unsharded_losses(tmp_path, unsharded,
                                                                     backend):
    losses = moe_losses(tmp_path, [1, 4, 2], MOE_BACKEND=backend)
    np.testing.assert_allclose(losses, unsharded(0.0), rtol=1e-4)


def first_step_metrics(job_dir, mesh, **overrides) -> dict:
    """The step metrics of a tiny mixture's first train step on `mesh`."""
    trainer = make_trainer(job_dir, experiment=LlamaBase, ICI_MESH_SHAPE=mesh,
                           **{**MOE, **overrides})
    state = trainer.init_state()
    batch = trainer.to_device(trainer.make_train_input().next_batch())
    with jax.set_mesh(trainer.mesh):
        return jax.device_get(trainer.train_step(state, batch)[1])


def test_a_bounded_exchange_buffer_drops_only_what_overflows_it(tmp_path, unsharded):
    """MOE_BUFFER_FACTOR: 3x a peer's mean share holds this routing (the losses of the
    unbounded exchange, nothing dropped); half of it cannot, and the drops are counted."""
    roomy, tight = (first_step_metrics(tmp_path / str(factor), [1, 4, 2],
                                       MOE_BUFFER_FACTOR=factor) for factor in (3.0, 0.5))
    assert roomy["moe/dropped_fraction"] == 0.0
    np.testing.assert_allclose(roomy["loss"], unsharded(0.0)[0], rtol=1e-5)
    assert tight["moe/dropped_fraction"] > 0.1
    assert abs(tight["loss"] - roomy["loss"]) > 1e-4


@pytest.mark.slow  # with the capacity rows above
def test_padded_backend_with_experts_over_4_and_tp2_trains_like_grouped_on_one_device(
        tmp_path, unsharded):
    losses = moe_losses(tmp_path, [1, 4, 2], CAPACITY_FACTOR=1.0, MOE_BACKEND="padded")
    np.testing.assert_allclose(losses, unsharded(1.0), rtol=1e-4)


@pytest.mark.slow  # about 20 s
def test_every_other_layer_scanned_trains_sharded_like_one_device(tmp_path):
    """MOE_LAYER_INTERVAL=2 in a repeated stack: blocks of [dense, MoE] scanned twice."""
    every_other = dict(MOE_LAYER_INTERVAL=2, NUM_LAYERS=4, USE_REPEATED_LAYER=True)
    trainer = make_trainer(tmp_path / "one", devices=jax.devices()[:1], experiment=LlamaBase,
                           ICI_MESH_SHAPE=[1, 1, 1], PERCORE_BATCH_SIZE=8,
                           **{**MOE, **every_other})
    block = trainer.abstract_state["params"]["lm"]["transformer"]["repeat"]["sub"]
    assert "router" not in block["x_layers_0"]["ff_layer"]
    assert block["x_layers_1"]["ff_layer"]["wi_gate"].shape == (2, 8, 64, 32)  # [x_times, E, D, H]
    one_device = train_losses(trainer, 3)
    np.testing.assert_allclose(moe_losses(tmp_path / "eight", [1, 4, 2], **every_other),
                               one_device, rtol=1e-4)


def test_router_losses_enter_the_loss_and_the_step_metrics(tmp_path):
    """loss(weight w) - loss(weight 0) = w x the load-balancing loss of each MoE layer,
    summed over the layers (2), on the same first step."""
    without, with_balance = (
        first_step_metrics(tmp_path / str(weight), [1, 8, 1], LOAD_BALANCING_WEIGHT=weight,
                           ROUTER_Z_LOSS_WEIGHT=0.0) for weight in (0.0, 0.5))
    assert {"moe/load_balancing_loss", "moe/router_z_loss", "moe/dropped_fraction",
            "moe/max_expert_load"} <= set(with_balance)
    np.testing.assert_allclose(with_balance["loss"] - without["loss"],
                               0.5 * 2 * with_balance["moe/load_balancing_loss"], rtol=1e-4)


@pytest.mark.slow
def test_accumulated_sub_batches_train_like_one_pass(tmp_path):
    one = moe_losses(tmp_path / "one", [1, 8, 1], PERCORE_BATCH_SIZE=2)
    accumulated = moe_losses(tmp_path / "two", [1, 8, 1], PERCORE_BATCH_SIZE=2,
                             GRADIENT_ACCUMULATION_STEPS=2)
    # The router losses are per sub-batch statistics, so they differ a little.
    np.testing.assert_allclose(accumulated, one, rtol=2e-3)


# ----- bad input ----------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (dict(NUM_EXPERTS=6), "does not split over the 8-way EXPERT_AXIS='data'"),
    (dict(CAPACITY_FACTOR=-1.0), "CAPACITY_FACTOR=-1.0 must be >= 0"),
    (dict(MOE_BUFFER_FACTOR=-2.0), "MOE_BUFFER_FACTOR=-2.0 must be >= 0"),
    (dict(NUM_EXPERTS_PER_TOKEN=9), "NUM_EXPERTS_PER_TOKEN=9 must be between 1 and"),
    (dict(MOE_BACKEND="te"), "Transformer Engine's grouped GEMM is not wired into Paxloom; "
                             "use one of ragged_dot, padded, tokamax"),
    (dict(MOE_BACKEND="cutlass"), "MOE_BACKEND='cutlass'"),
    (dict(MOE_LAYER_INTERVAL=3), "MOE_LAYER_INTERVAL=3 must be >= 1 and divide"),
    (dict(MOE_BACKEND="padded"), "set CAPACITY_FACTOR > 0"),
    (dict(USE_FP8=True), "USE_FP8"),
    (dict(USE_LORA=True), "LORA_TARGET_LAYERS='attention'"),
    (dict(ICI_MESH_SHAPE=[2, 1, 4, 1], NUM_MICROBATCHES=2, NUM_LAYERS=2, MOE_LAYER_INTERVAL=2),
     "every block must hold whole runs of 2 layers; make NUM_LAYERS a multiple of 4"),
])
def test_bad_moe_settings_get_one_line(overrides, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace("[", r"\[")) as info:
        LlamaBase(**{**MOE, "ICI_MESH_SHAPE": [1, 8, 1], **overrides})
    assert "\n" not in str(info.value)


def test_tokamax_is_refused_on_a_jax_it_fails_on(monkeypatch):
    """The lock's tokamax runs on the lock's jax; a user's older tokamax beside it (0.0.12
    on jax 0.11, seen on an H200) gets one line before anything compiles."""
    assert moe.tokamax_problem(importlib.metadata.version("tokamax"),
                               importlib.metadata.version("jax")) is None
    assert moe.tokamax_problem("0.0.12", "0.10.2") is None
    assert "'out_shape'" in moe.tokamax_problem("0.0.12", "0.11.2")
    real = importlib.metadata.version
    older = {"jax": "0.11.2", "tokamax": "0.0.12"}
    monkeypatch.setattr(importlib.metadata, "version", lambda name: older.get(name) or real(name))
    with pytest.raises(UserError, match=r"tokamax 0.0.12 fails on jax 0.11.2: .*"
                                        r"use MOE_BACKEND='ragged_dot'") as info:
        LlamaBase(**{**MOE, "ICI_MESH_SHAPE": [1, 8, 1], "MOE_BACKEND": "tokamax"})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name, needs", [
    ("MoELarge", "needs its 16 experts padded with empty variables to fill the 32-way data"),
    ("GLaM64B64EProxy_EP", "needs praxis's expert mesh axis 'data_expert'"),
    ("Grok_Proxy", "'data_expert' (set_sharding_params_with_expert_parallelism, after praxis "
                   "1.4.0) and praxis/layers/grok.py"),
    ("NVIDIA5B", "Paxloom does not carry NVIDIA's nvidia.py"),
])
def test_nvidia_pax_experiments_are_refused_naming_what_they_need(name, needs):
    with pytest.raises(UserError) as info:
        registry.resolve(f"paxml.tasks.lm.params.nvidia.{name}")
    assert needs in str(info.value) and "\n" not in str(info.value)


def test_tokamax_not_installed_gets_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokamax", None)  # what an absent package looks like
    with pytest.raises(UserError, match=r"tokamax is not installed; pip install '\.\[moe\]'"):
        LlamaBase(**{**MOE, "ICI_MESH_SHAPE": [1, 8, 1], "MOE_BACKEND": "tokamax"})


def test_the_gpt_family_refuses_experts():
    import experiments

    with pytest.raises(UserError, match="the GPT family has no mixture of experts"):
        experiments.BaseExperiment(NUM_EXPERTS=8).validate()


@pytest.mark.process
def test_main_refuses_an_uneven_expert_split_in_one_line(tmp_path):
    out = run_main("--fdl_config=experiments.MixtralTiny", "--fdl.NUM_EXPERTS=5",
                   f"--job_log_dir={tmp_path}")
    assert_one_line(out, "NUM_EXPERTS=5 does not split over the 2-way EXPERT_AXIS='data'")


def test_flops_count_the_experts_a_token_uses(tmp_path):
    """MFU's N (paxloom/runner/training/throughput.py): each expert weight counts k/E of its size."""
    trainer = make_trainer(tmp_path, experiment=LlamaBase, ICI_MESH_SHAPE=[1, 8, 1], **MOE)
    params = trainer.abstract_state["params"]
    every = throughput.matmul_param_count(params)
    layers = params["lm"]["transformer"]
    experts = sum(layers[f"x_layers_{i}"]["ff_layer"][name].size
                  for i in range(2) for name in ("wi_gate", "wi_up", "wo"))
    assert experts == 2 * 3 * 8 * 64 * 32
    active = every - experts + experts * 2 // 8
    assert throughput.matmul_param_count(params, expert_share=2 / 8) == active
    assert trainer.flops_per_token == throughput.flops_per_token(
        num_params=active, num_layers=2, num_heads=8, dims_per_head=8, seq_len=64)
