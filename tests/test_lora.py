"""LoRA (USE_LORA, layers/lora.py, paxloom/runner/state/optimizer.py's train_only): an adapted model
starts equal to its base, only the adapters train and only they hold optimizer state, and
the merged weights (export, the cached decoder) compute what the adapted model computes."""

import fiddle as fdl
import jax
import numpy as np
import pytest
from praxis.layers import linears as praxis_linears

import experiments
from experiments.llama import LlamaBase
from layers import architecture, cached_lm, lora
from layers import attention as fused_attention
from layers.stack import transformer_layer_template
from paxloom.core.errors import UserError
from paxloom.runner.state import checkpoints
from tests.support.inference import PARAMETER_STD, praxis_logits
from tests.support.tiny import TINY
from tests.support.training import make_trainer

pytestmark = pytest.mark.usefixtures("compilation_cache")

# Data, FSDP and tensor parallelism: the base weights sharded, the adapters replicated
# (layers/lora.py). No warmup: the first update already moves the adapters.
SETTINGS = dict(ICI_MESH_SHAPE=[2, 2, 2], LR_COS_WARMUP=0, LR_COS_DECAY_START=0,
                LEARNING_RATE=1e-3, MAX_SEQ_LEN=32)
FAMILIES = {
    "gpt": (experiments.BaseExperiment, {}),  # combined QKV projection, biases
    # Separate q/k/v, 8 heads in 4 groups, layers scanned (stacked parameters).
    "llama_gqa": (LlamaBase, dict(NUM_KV_HEADS=4, USE_REPEATED_LAYER=True)),
}
LAYER = {"gpt": "lm/transformer/x_layers_0/",
         "llama_gqa": "lm/transformer/repeat/sub/x_layers_0/"}
RANK = 4


def settings(family: str, target: str | None) -> tuple[type, dict]:
    """The experiment class and overrides of `family`, adapted on `target` (None: the base)."""
    experiment, overrides = FAMILIES[family]
    lora_settings = {} if target is None else dict(
        USE_LORA=True, LORA_RANK=RANK, LORA_TARGET_LAYERS=target)
    return experiment, {**TINY, **SETTINGS, **overrides, **lora_settings}


@pytest.fixture(scope="module")
def trainers(tmp_path_factory):
    """(family, target or None for the base model) -> its Trainer, built once."""
    built = {}

    def get(family, target=None):
        if (family, target) not in built:
            experiment, overrides = settings(family, target)
            built[family, target] = make_trainer(tmp_path_factory.mktemp(family),
                                                 experiment=experiment, **overrides)
        return built[family, target]

    return get


def describe(family: str, target: str | None):
    experiment, overrides = settings(family, target)
    return architecture.architecture_of(experiment(**overrides).run_config().model)


def flat(tree) -> dict:
    return {jax.tree_util.keystr(path, simple=True, separator="/"): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def with_base_params(state, base_params):
    """`state` (an adapted model's) with every parameter its base has taken from `base_params`."""
    base = flat(base_params)
    params = jax.tree_util.tree_map_with_path(
        lambda path, leaf: base.get(jax.tree_util.keystr(path, simple=True, separator="/"), leaf),
        state["params"])
    return {**state, "params": params}


def nbytes(tree) -> int:
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(tree))


def adapted_weights(family: str, target: str) -> set[str]:
    """Names of the weights (within one layer) that `target` adapts."""
    attention = {"gpt": {"self_attention/combined_qkv", "self_attention/post"},
                 "llama_gqa": {f"self_attention/{p}" for p in ("query", "key", "value", "post")}}
    mlp = {f"ff_layer/{p}/linear" for p in ("ffn_layer1", "ffn_layer2")}
    if family == "llama_gqa":
        mlp.add("ff_layer/ffn_layer1_gate/linear")
    return {"attention": attention[family], "mlp": mlp,
            "all": attention[family] | mlp}[target]


# `make test` runs "all" per family (its adapted set is exactly attention's plus mlp's);
# `make test-all` runs every combination.
SLOW = pytest.mark.slow
CASES = [("gpt", "all"), ("llama_gqa", "all")] + [
    pytest.param(family, target, marks=SLOW)
    for family in FAMILIES for target in ("attention", "mlp")]


@pytest.mark.parametrize("family, target", CASES)
def test_starts_equal_to_the_base_and_only_the_adapters_train(trainers, family, target):
    base, adapted = trainers(family), trainers(family, target)
    layer = LAYER[family]
    names = {name[len(layer):].rsplit("/", 1)[0] for name in flat(adapted.abstract_state["params"])
             if name.startswith(layer) and lora.is_adapter(name)}
    assert names == adapted_weights(family, target)

    base_state = base.init_state()
    # Through the host: the base's step donates its buffers.
    state = with_base_params(jax.device_get(adapted.init_state()),
                             jax.device_get(base_state["params"]))
    before = state["params"]
    state = jax.device_put(state, adapted.state_shardings)
    batch = adapted.make_train_input().next_batch()
    with jax.set_mesh(base.mesh):
        _, base_metrics = base.train_step(base_state, base.to_device(batch))
    losses = []
    for _ in range(3):  # the same batch: the adapters must learn it
        with jax.set_mesh(adapted.mesh):
            state, metrics = adapted.train_step(state, adapted.to_device(batch))
        losses.append(float(metrics["loss"]))
    # lora_b starts at zero: the same function as the base, to the bit.
    assert losses[0] == float(base_metrics["loss"])
    after = flat(jax.device_get(state["params"]))
    for name, old in flat(before).items():
        if lora.is_adapter(name):
            if name.endswith("lora_b"):
                assert np.any(after[name] != old), f"{name} did not train"
        else:
            np.testing.assert_array_equal(after[name], old, err_msg=f"{name} changed")
    assert losses[2] < losses[1] < losses[0]


def test_optimizer_state_holds_only_the_adapters_moments(trainers):
    full, adapted = trainers("gpt"), trainers("gpt", "all")
    full_bytes = nbytes(full.abstract_state["opt_state"])
    lora_bytes = nbytes(adapted.abstract_state["opt_state"])
    adapters = {k: v for k, v in flat(adapted.abstract_state["params"]).items()
                if lora.is_adapter(k)}
    # Adam's two moments per adapter, and step counters (Adam's, the schedule's).
    assert 0 < lora_bytes - 2 * nbytes(adapters) <= 16
    print(f"optimizer state: LoRA rank {RANK} {lora_bytes:,} bytes, full fine-tuning "
          f"{full_bytes:,} bytes ({lora_bytes / full_bytes:.1%})")
    assert lora_bytes < 0.1 * full_bytes
    # The adapters are replicated, and so are their moments.
    specs = flat(adapted.state_shardings["opt_state"])
    for name, sharding in flat(adapted.state_shardings["params"]).items():
        if lora.is_adapter(name):
            assert sharding.is_fully_replicated, name
            moments = [s for k, s in specs.items() if k.endswith(name)]
            assert len(moments) == 2 and all(s == sharding for s in moments), name


def random_state(trainer, seed=3):
    """A train state with every parameter (adapters included) drawn at PARAMETER_STD."""
    rng = np.random.default_rng(seed)
    state = jax.tree_util.tree_map(lambda a: np.zeros(a.shape, a.dtype),
                                   trainer.abstract_state)
    state["params"] = jax.tree_util.tree_map(
        lambda a: (PARAMETER_STD * rng.standard_normal(a.shape)).astype(a.dtype),
        trainer.abstract_state["params"])
    return jax.device_put(state, trainer.state_shardings)


@pytest.mark.parametrize("family", FAMILIES)
def test_merged_weights_compute_what_the_adapted_model_computes(trainers, family):
    base, adapted = trainers(family), trainers(family, "all")
    arch = describe(family, "all")
    assert arch == describe(family, None) and arch.repeated == (family == "llama_gqa")
    params = random_state(adapted)["params"]
    host = jax.device_get(params)
    merged = architecture.canonical_weights(host, arch)

    # The canonical weights are the base's plus the low-rank products, in the right layout.
    base_only = {k: v for k, v in flat(host).items() if not lora.is_adapter(k)}
    unmerged = architecture.canonical_weights(
        jax.tree_util.tree_map_with_path(
            lambda path, leaf: base_only[jax.tree_util.keystr(path, simple=True, separator="/")],
            jax.device_get(base.abstract_state["params"])), arch)
    transformer = host["lm"]["transformer"]
    layer = (jax.tree_util.tree_map(lambda leaf: leaf[1], transformer["repeat"]["sub"]["x_layers_0"])
             if arch.repeated else transformer["x_layers_1"])
    ff, atten = layer["ff_layer"], layer["self_attention"]
    d, n, h = arch.model_dims, arch.num_heads, arch.dims_per_head

    def product(p):
        return p["lora_a"] @ p["lora_b"].T

    expected = {
        "up": product(ff["ffn_layer1"]["linear"]), "down": product(ff["ffn_layer2"]["linear"]),
        "o": product(atten["post"]).reshape(d, n, h),
    }
    if family == "gpt":
        qkv = atten["combined_qkv"]
        for i, name in enumerate("qkv"):
            expected[name] = (qkv["lora_a"][i] @ qkv["lora_b"][i].T).reshape(d, n, h)
    else:
        expected["gate"] = product(ff["ffn_layer1_gate"]["linear"])
        for name, praxis_name in zip("qkv", ("query", "key", "value"), strict=True):
            heads = n if name == "q" else arch.num_kv_heads
            expected[name] = product(atten[praxis_name]).reshape(d, heads, h)
    for name, delta in expected.items():
        np.testing.assert_allclose(merged["layers"][1][name],
                                   unmerged["layers"][1][name] + delta, rtol=1e-6, atol=1e-6,
                                   err_msg=name)
        assert np.abs(delta).max() > 0.1  # a real change, not a rounding

    # The adapted model (praxis), the base model with merged parameters (praxis) and the
    # cached decoder on the canonical weights give the same logits.
    sequences = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8]]
    with jax.default_matmul_precision("highest"):
        expected_logits = praxis_logits(adapted, params, sequences)
        merged_params = jax.device_put(lora.merge_adapters(host), base.state_shardings["params"])
        base_logits = praxis_logits(base, merged_params, sequences)
        cache = cached_lm.init_cache(arch, 1, 16, np.float32)
        for seq, want, want_base in zip(sequences, expected_logits, base_logits, strict=True):
            tokens = np.asarray([seq], np.int32)
            positions = np.arange(len(seq), dtype=np.int32)[None]
            hidden, _ = cached_lm.forward(arch, merged, tokens, positions, cache, 0,
                                          np.zeros(1, np.int32))
            np.testing.assert_allclose(want_base, want, rtol=0, atol=1e-5)
            np.testing.assert_allclose(cached_lm.logits(merged, hidden[0]), want, rtol=0,
                                       atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_adapters_work_with_the_fused_attention_layers(trainers, family, tmp_path):
    """ATTENTION_IMPL='xla' runs layers/attention.py's attention classes, which build their
    projections from the same (adapted) templates: praxis's logits, same parameters."""
    experiment, overrides = settings(family, "all")
    overrides = {**overrides, "ATTENTION_IMPL": "xla"}
    model = experiment(**overrides).run_config().model
    attention = transformer_layer_template(model.lm_tpl.stacked_transformer_tpl).tr_atten_tpl
    assert attention.cls in (fused_attention.FusedDotProductAttention,
                             fused_attention.FusedMultiQueryDotProductAttention)
    assert lora.base_class(attention.proj_tpl.cls) is not attention.proj_tpl.cls
    assert architecture.architecture_of(model) == describe(family, "all")
    adapted = trainers(family, "all")
    params = random_state(adapted)["params"]
    sequences = [[3, 1, 4, 1, 5, 9, 2, 6]]
    with jax.default_matmul_precision("highest"):
        want = praxis_logits(adapted, params, sequences)
        got = praxis_logits(make_trainer(tmp_path, experiment=experiment, **overrides), params,
                            sequences)
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-5)


def test_a_lora_train_state_round_trips_through_a_checkpoint(trainers, tmp_path):
    adapted = trainers("llama_gqa", "all")
    state = random_state(adapted, seed=5)
    metadata = checkpoints.run_metadata("test", {}, adapted.abstract_state["params"])
    with checkpoints.Checkpointer(str(tmp_path), metadata=metadata, every_n_steps=0,
                                  max_to_keep=0) as saver:
        saver.save(1, state, None, final=True)
    restored = checkpoints.restore(str(tmp_path), None, adapted.abstract_state).state
    assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(state)
    for got, want in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(state),
                         strict=True):
        assert got.sharding == want.sharding
        np.testing.assert_array_equal(jax.device_get(got), jax.device_get(want))


@pytest.mark.parametrize("overrides, message", [
    (dict(USE_LORA=True, LORA_RANK=0), "LORA_RANK=0 must be >= 1"),
    (dict(USE_LORA=True, LORA_TARGET_LAYERS="attn"), "is not one of all, attention, mlp"),
])
def test_bad_lora_settings_are_one_line(overrides, message):
    with pytest.raises(UserError) as error:
        experiments.BaseExperiment(**overrides)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_projection_lora_does_not_know_is_refused_in_one_line():
    class OwnLinear(praxis_linears.Linear):
        pass

    class OwnFeedForward(experiments.BaseExperiment):
        def model_template(self):
            model = super().model_template()
            layer = transformer_layer_template(model.lm_tpl.stacked_transformer_tpl)
            fdl.update_callable(layer.tr_fflayer_tpl.fflayer_tpl.linear_tpl, OwnLinear)
            return model

    with pytest.raises(UserError, match="USE_LORA: LoRA adapts praxis's Linear.*"
                                        "FeedForward.linear_tpl is OwnLinear"):
        OwnFeedForward(USE_LORA=True, LORA_TARGET_LAYERS="mlp").run_config()
    OwnFeedForward(USE_LORA=True, LORA_TARGET_LAYERS="attention").run_config()
