"""Pax's GLaM experiments (experiments/glam.py, layers/glam.py): praxis's GShard mixture layer
against a top-2 routing written here from the papers, the experiments' values as Pax sets
them, their refusals, and GLaMTiny training through main.py (issue 32)."""

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from praxis import base_layer, pax_fiddle
from praxis.layers import activations, attentions, embedding_softmax, glam, transformers

import experiments
from experiments.glam import GLaMTiny
from layers import glam as glam_layers
from paxloom.core.errors import UserError
from tests.support.processes import assert_one_line, run_main

pytestmark = pytest.mark.usefixtures("exact_matmuls")

D, H, E = 16, 32, 4  # model width, expert width, experts
B, L, G = 2, 16, 2  # batch, length, routing groups: 16 tokens per group
EPSILON = 1e-6  # praxis's RmsNorm epsilon, which GLaM keeps


# ----- The mixture layer against the papers ---------------------------------------------------


def moe_config(gated: bool) -> pax_fiddle.Config:
    """GLaMTiny's mixture layer at test sizes: ReLU experts, not gated, as praxis's GLaM
    helper leaves them (and Pax trains them); `gated`: experts with the gated GELU of GLaM's
    dense layers instead (praxis's `use_gated_activation`)."""
    stack = GLaMTiny().model_template().lm_tpl.stacked_transformer_tpl
    config = stack.moe_layer_tpl.clone()
    assert config.activation_tpl.cls is activations.ReLU and not config.use_gated_activation
    config.set(name="moe", input_dims=D, hidden_dims=H, num_experts=E, num_groups=G)
    if gated:
        config.set(use_gated_activation=True,
                   activation_tpl=pax_fiddle.Config(activations.GELU, approximate=False))
    return config


def inputs_and_params(config):
    """Tokens sharing a direction the router favours for expert 0, so that routing
    overflows its capacity; two padded tokens; a non-trivial norm scale."""
    keys = jax.random.split(jax.random.key(0), 4)
    direction = jax.random.normal(keys[0], (D,))
    x = jax.random.normal(keys[1], (B, L, D)) + 0.7 * direction
    paddings = jnp.zeros((B, L)).at[1, -2:].set(1.0)
    layer = pax_fiddle.instantiate(config)
    with base_layer.JaxContext.new_context():
        params = dict(layer.init(jax.random.key(1), x, paddings)["params"])
    params["gate"] = params["gate"].at[:, 0].add(direction / jnp.linalg.norm(direction))
    params["layer_norm"] = {"scale": 1 + 0.1 * jax.random.normal(keys[2], (D,))}
    return layer, params, x, paddings


def apply(layer, params, x, paddings):
    """(output, the layer's weighted aux loss)."""
    with base_layer.JaxContext.new_context():
        out, collections = layer.apply({"params": params}, x, paddings,
                                       mutable=[base_layer.AUX_LOSS, base_layer.SUMMARIES])
    return out, collections[base_layer.AUX_LOSS]["aux_moe_load_balance_loss"].value


def gelu(a):
    from math import erf

    return 0.5 * a * (1 + np.vectorize(erf)(a / np.sqrt(2)))


def reference(params, x, paddings, *, capacity_factor, gated, perturb=None):
    """(output, load-balancing loss, (top-1, top-2) assignments dropped), in float64 numpy.

    GShard (Lepikhin et al. 2020, section 2.2, algorithms 1 and 2): the tokens are split into
    G groups of S; in each, a token's gates are the softmax of its normed input times the
    router, its experts the best two, their gates divided by their sum. The second expert is
    always dispatched (praxis's second_expert_policy='all', which GLaM keeps; the paper's
    random routing dispatches it with probability 2 x its gate). Each expert takes at most
    C = capacity_factor x S / E tokens of a group: every token's top-1 choice first, in token
    order, then the top-2 choices; what does not fit is dropped, its gate is not moved onto
    the other expert. Padded tokens go nowhere. The load-balancing loss is the paper's
    (1/E) sum_e f_e m_e (f_e: share of the group's tokens whose top-1 is e, m_e: the group's
    mean gate of e) times E^2, so that uniform routing gives 1, averaged over groups. Around the
    experts, as GLaM's layers have it (praxis glam.py): RMSNorm first (its scale applied
    directly), a residual connection after; no biases.

    `perturb` changes one rule, for the test that this reference tells them apart.
    """
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    tokens = np.asarray(x, np.float64).reshape(-1, D)
    pads = np.asarray(paddings).reshape(-1) > 0
    normed = tokens / np.sqrt(np.mean(tokens**2, -1, keepdims=True) + EPSILON)
    normed = normed * p["layer_norm"]["scale"]
    size = len(tokens) // G
    capacity = int(capacity_factor * size / E)
    assert capacity % 4 == 0, "praxis pads the capacity to a multiple of 4: pick sizes that fill it"

    def expert(e, h):
        if gated:
            return (gelu(h @ p["wi_gate_0"][e]) * (h @ p["wi_0"][e])) @ p["wo_0"][e]
        return np.maximum(h @ p["wi_0"][e], 0) @ p["wo_0"][e]

    out, balance, dropped = np.zeros_like(tokens), [], [0, 0]
    for group in np.split(np.arange(len(tokens)), G):
        logits = normed[group] @ p["gate"]
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        order = np.argsort(-probs, -1, kind="stable")[:, :2]  # [S, 2] best first
        gates = np.take_along_axis(probs, order, -1)
        if perturb != "top2_as_is":
            gates /= gates.sum(-1, keepdims=True)
        live = ~pads[group]
        f = np.bincount(order[live, 0], minlength=E) / size
        balance.append(E * np.sum(f * (probs * live[:, None]).mean(0)))
        kept = np.zeros((size, 2), bool)
        load = np.zeros(E, int)
        slots = ([(s, k) for s in range(size) for k in (0, 1)] if perturb == "interleaved"
                 else [(s, k) for k in (0, 1) for s in range(size)])
        for s, k in slots:
            fits = perturb == "no_capacity" or load[order[s, k]] < capacity
            kept[s, k] = live[s] and fits and not (perturb == "top1_only" and k == 1)
            load[order[s, k]] += kept[s, k]
            dropped[k] += live[s] and not fits
        if perturb == "renormalise_kept":  # the kept experts' gates sum to 1
            kept_gates = np.where(kept, gates, 0)
            gates = kept_gates / np.maximum(kept_gates.sum(-1, keepdims=True), 1e-30)
        for s, token in enumerate(group):
            for k in (0, 1):
                if kept[s, k]:
                    out[token] += gates[s, k] * expert(order[s, k], normed[token])
    out *= ~pads[:, None]
    return (tokens + out).reshape(np.shape(x)), np.mean(balance), dropped


@pytest.mark.parametrize("gated", [False, True], ids=["glam_relu_experts", "gated_gelu_experts"])
def test_praxis_gshard_layer_equals_top2_routing_from_the_papers(gated):
    config = moe_config(gated)
    layer, params, x, paddings = inputs_and_params(config)
    out, aux = apply(layer, params, x, paddings)
    expected, balance, dropped = reference(
        params, x, paddings, capacity_factor=config.unadjusted_expert_capacity_factor,
        gated=gated)
    assert dropped[0] > 0 and dropped[1] > 0, dropped  # the capacity is exercised
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-4)
    np.testing.assert_allclose(aux, config.moe_load_balance_loss_weight * balance, rtol=1e-5)


@pytest.mark.parametrize("perturb", ["top2_as_is", "interleaved", "no_capacity", "top1_only",
                                     "renormalise_kept"])
def test_the_reference_tells_the_routing_rules_apart(perturb):
    """The check above can fail: with any one routing rule changed, the reference no
    longer matches praxis's output."""
    config = moe_config(gated=False)
    layer, params, x, paddings = inputs_and_params(config)
    out, _ = apply(layer, params, x, paddings)
    changed, _, _ = reference(params, x, paddings, gated=False, perturb=perturb,
                              capacity_factor=config.unadjusted_expert_capacity_factor)
    assert np.max(np.abs(np.asarray(out) - changed)) > 1e-3, perturb


# ----- The experiments, value for value -------------------------------------------------------

# Literals of paxml's configs.py (head): GLaM126M64EBase, GLaM64B64EBase, and what they
# inherit from its GPT126MBase.
PAX_GLAM126M64E = dict(
    NUM_GPUS=64, NUM_EXPERTS=64, ICI_MESH_SHAPE=[1, 64, 1], DCN_MESH_SHAPE=[1, 1, 1],
    USE_REPEATED_LAYER=False, PERCORE_BATCH_SIZE=4, LOAD_BALANCING_WEIGHT=0.01,
    Z_LOSS_WEIGHT=0.0, NUM_LAYERS=12, NUM_HEADS=12, MODEL_DIMS=768, HIDDEN_DIMS=3072,
    DIMS_PER_HEAD=64, VOCAB_SIZE=50304, MAX_SEQ_LEN=2048, PACKED_INPUT=True,
    FPROP_DTYPE="bfloat16", INIT_STD=0.023, MAX_STEPS=600000, LEARNING_RATE=6e-4,
    ADAM_BETA1=0.9, ADAM_BETA2=0.95, ADAM_EPSILON=1e-8, WEIGHT_DECAY=0.1,
    CLIP_GRADIENT_NORM_TO_VALUE=1.0, LR_COS_WARMUP=636, LR_COS_DECAY_START=637,
    LR_COS_DECAY_END=500000, LR_COS_MIN_RATIO=0.1, LR_COS_MAX=1.0)
PAX_GLAM64B64E = dict(
    PAX_GLAM126M64E, MAX_SEQ_LEN=1024, NUM_GPUS=512, DCN_MESH_SHAPE=[1, 64, 1],
    ICI_MESH_SHAPE=[1, 1, 8], NUM_LAYERS=64, NUM_HEADS=64, DIMS_PER_HEAD=128, MODEL_DIMS=8192,
    HIDDEN_DIMS=32768, NUM_EXPERTS=64, USE_REPEATED_LAYER=True, ADAM_BETA1=0.0,
    ADAM_BETA2=0.99, CLIP_GRADIENT_NORM_TO_VALUE=1.0, PERCORE_BATCH_SIZE=4, LEARNING_RATE=2e-5,
    LR_COS_WARMUP=398, LR_COS_DECAY_START=399, LR_COS_DECAY_END=162900, LR_COS_MAX=1.0,
    LR_COS_MIN_RATIO=0.1, EVAL_INTERVAL_STEPS=100, SUMMARY_INTERVAL_STEPS=10,
    CHECKPOINT_EVERY_N_STEPS=100, CHECKPOINT_MAX_TO_KEEP=2)
# What their task() derives: the routing groups (every mesh axis but the tensor one), each
# mixture layer's load-balancing weight (the total over NUM_LAYERS / 2 of them).
PAX_DERIVED = {"126M64E": dict(num_groups=64, moe_load_balance_loss_weight=0.01 / 6),
               "64B64E": dict(num_groups=64, moe_load_balance_loss_weight=0.01 / 32)}


@pytest.mark.parametrize("name,values,size", [
    ("PileGLaM126M64E", PAX_GLAM126M64E, "126M64E"),
    ("LambadaGLaM126M64E", PAX_GLAM126M64E, "126M64E"),
    ("PileGLaM64B64E", PAX_GLAM64B64E, "64B64E"),
    ("LambadaGLaM64B64E", PAX_GLAM64B64E, "64B64E")])
def test_print_config_shows_pax_glam_values(name, values, size):
    from paxloom.launch.record import config_report

    exp = experiments.resolve(f"paxml.contrib.gpu.scripts_gpu.configs.{name}")()
    assert type(exp) is experiments.resolve(f"experiments.{name}")
    text = config_report(exp, exp.run_config())  # what --print_config prints
    lines = text.splitlines()
    dataset = dict(DATASET="none", LAMBADA_EVAL=True) if name.startswith("Lambada") else dict(
        DATASET="pile", LAMBADA_EVAL=True)
    for key, value in {**values, **dataset}.items():
        assert f"{key} = {value!r}" in lines, f"{name}.{key}"
    stack = "model.lm_tpl.stacked_transformer_tpl" + (".block" if values["USE_REPEATED_LAYER"]
                                                      else "")
    moe = f"{stack}.moe_layer_tpl"
    for field, value in PAX_DERIVED[size].items():
        assert f"{moe}.{field}: {type(value).__name__} = {value!r}" in lines, field
    for line in (f"{moe}.unadjusted_expert_capacity_factor: float = 2.0",
                 f"{moe}.num_experts: int = 64", f"{moe}.gating_func: str = 'top2'",
                 "model.lm_tpl.softmax_tpl = GShardSharedEmbeddingSoftmax",
                 "model.lm_tpl.softmax_tpl.z_loss_weight: float = 0.0"):
        assert line in lines, line


def effective(config, path: str = "") -> dict:
    """{path: value} over a Fiddle config tree, defaults included: two trees are the same
    model when these are equal, whichever fields were set explicitly."""
    if isinstance(config, fdl.Buildable):
        found = {path: fdl.get_callable(config)}
        for name, value in fdl.ordered_arguments(config, include_defaults=True).items():
            found.update(effective(value, f"{path}.{name}"))
        return found
    if isinstance(config, (list, tuple)):
        return {k: v for i, item in enumerate(config) for k, v in
                effective(item, f"{path}[{i}]").items()}
    return {path: config}


def pax_glam_lm(exp):
    """The TransformerLm of paxml's GLaM126M64EBase.task(), its arguments copied from there,
    with praxis head's `repeat` (praxis 1.4.0's helper has no such argument: its
    repeat=False branch is written out as praxis head has it)."""
    lm = glam.GlamUniTransformerLmHParams(
        name="glam_lm", vocab_size=exp.VOCAB_SIZE, num_transformer_layers=exp.NUM_LAYERS,
        moe=True, model_dim=exp.MODEL_DIMS, ff_dim=exp.HIDDEN_DIMS,
        moe_hidden_dim=exp.HIDDEN_DIMS, attention_num_heads=exp.NUM_HEADS,
        attention_key_value_dim=exp.MODEL_DIMS // exp.NUM_HEADS, attention_extra_logit=0.0,
        use_tgt_labels_size_as_loss_denominator=True,
        moe_load_balance_loss_weight=exp.LOAD_BALANCING_WEIGHT / (exp.NUM_LAYERS / 2),
        z_loss_weight=exp.Z_LOSS_WEIGHT, moe_gating_func="top2",
        moe_gating_embedding_level="token", c_dim=None, capacity_factor=2.0,
        e_dim=exp.NUM_EXPERTS,
        num_groups=np.prod(exp.ICI_MESH_SHAPE[:-1]) * np.prod(exp.DCN_MESH_SHAPE[:-1]),
        use_gated_activation=True)
    if not exp.USE_REPEATED_LAYER:
        glam_p = lm.stacked_transformer_tpl.block
        glam_p.num_layers = exp.NUM_LAYERS
        glam_p.moe_layers = list(range(0, glam_p.num_layers, 2))
        lm.stacked_transformer_tpl = glam_p
    return lm


@pytest.mark.parametrize("name", ["PileGLaM126M64E", "PileGLaM64B64E"])
def test_the_model_is_what_paxs_glam_task_builds(name):
    exp = experiments.resolve(f"experiments.{name}")()
    pax_lm = pax_glam_lm(exp)
    # The one difference: praxis's GShard layer as the subclass that also reports its
    # routing figures as step metrics (same fields, same maths).
    block = pax_lm.stacked_transformer_tpl
    block = block.block if exp.USE_REPEATED_LAYER else block
    fdl.update_callable(block.moe_layer_tpl, glam_layers.GShardFeedForward)
    ours, pax = effective(exp.model_template().lm_tpl), effective(pax_lm)
    assert ours == pax, {k: (ours.get(k), pax.get(k)) for k in ours.keys() | pax.keys()
                         if ours.get(k) != pax.get(k)}
    layer = ours[".stacked_transformer_tpl" + (".block" if exp.USE_REPEATED_LAYER else "")
                 + ".transformer_layer_params_tpl.tr_atten_tpl.relative_bias_tpl"]
    assert layer is attentions.RelativeBias


def test_the_runtime_shards_glam_as_paxs_set_sharding_params_v1():
    """The experts on `data` (each GPU holds 1 of the 64), the tied GShard softmax like
    the GPT's; the relative position biases stay replicated, as in Pax."""
    lm = experiments.resolve("experiments.PileGLaM126M64E")().run_config().model.lm_tpl
    moe = lm.stacked_transformer_tpl.moe_layer_tpl
    assert issubclass(fdl.get_callable(moe), transformers.TransformerFeedForwardMoe)
    assert moe.weight_split_dims_mapping.emh == ["data", None, "mdl"]
    assert moe.activation_split_dims_mapping.egcm == ["data", None, None, "mdl"]
    assert fdl.get_callable(lm.softmax_tpl) is embedding_softmax.GShardSharedEmbeddingSoftmax
    assert lm.softmax_tpl.weight_split_dims_mapping.wt == ["mdl", "data"]


@pytest.mark.parametrize("overrides,message", [
    (dict(NUM_LAYERS=3), "NUM_LAYERS=3: GLaM's layers come in [MoE, dense] pairs"),
    (dict(NUM_EXPERTS=0), "NUM_EXPERTS=0: GLaM's blocks hold a mixture of experts"),
    (dict(CAPACITY_FACTOR=0.0), "it has no dropless mode"),
    (dict(LOAD_BALANCING_WEIGHT=0.0), "needs a positive load-balancing weight"),
    (dict(Z_LOSS_WEIGHT=-1.0), "Z_LOSS_WEIGHT=-1.0 must be >= 0"),
    (dict(ATTENTION_IMPL="cudnn"), "relative position biases, which only 'praxis' computes"),
    (dict(USE_LORA=True, LORA_TARGET_LAYERS="attention"), "USE_LORA: GLaM's attention"),
    (dict(ICI_MESH_SHAPE=[2, 2, 2, 1], NUM_MICROBATCHES=2),
     "2 pipeline stages: praxis's GShard layer routes in groups"),
    (dict(LAYERNORM_EPSILON=1e-6), "do not read LAYERNORM_EPSILON; leave it at 1e-05"),
    (dict(USE_BIAS=False), "do not read USE_BIAS"),
    (dict(MOE_LAYER_INTERVAL=2), "do not read MOE_LAYER_INTERVAL"),
    (dict(NUM_EXPERTS_PER_TOKEN=1), "do not read NUM_EXPERTS_PER_TOKEN"),
])
def test_glam_refuses_what_it_cannot_build(overrides, message):
    with pytest.raises(UserError) as error:
        GLaMTiny(**overrides)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.process
def test_main_refuses_an_odd_number_of_glam_layers_in_one_line(tmp_path):
    out = run_main("--fdl_config=experiments.GLaMTiny", "--fdl.NUM_LAYERS=3",
                   f"--job_log_dir={tmp_path}")
    assert_one_line(out, "NUM_LAYERS=3: GLaM's layers come in [MoE, dense] pairs")


# ----- Training ---------------------------------------------------------------------------------


@pytest.mark.slow  # about 20 s
def test_glam_tiny_trains_with_the_load_balancing_loss_in_its_loss(tmp_path):
    from paxloom.runner.state.train_state import as_model_batch, praxis_context
    from tests.support.training import make_trainer, run_steps

    trainer = make_trainer(tmp_path, experiment=GLaMTiny, LAMBADA_EVAL=False, LR_COS_WARMUP=1,
                           LR_COS_DECAY_START=1)
    losses, state = run_steps(trainer, 4)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    # The training loss is the cross-entropy plus each mixture layer's weighted balance loss
    # (E sum_e f_e p_e, between 0 and E); the tiny model's 2 layers hold one mixture layer.
    key = jax.random.key(0)
    batch = trainer.to_device(trainer.make_train_input().next_batch())

    def with_and_without_aux_losses(params, batch):
        loss, step_metrics = trainer._loss(params, batch, key)
        with praxis_context(do_eval=False):  # the aux-loss collection not mutable: no aux
            (metrics, _), _ = trainer.model.apply(
                {"params": params}, as_model_batch(batch, trainer.model.fprop_dtype),
                rngs={"random": key}, mutable=[base_layer.SUMMARIES])
        return loss, metrics.total_loss[0], step_metrics

    # One compiled program: op-by-op execution of sharded collectives can stall XLA:CPU's
    # rendezvous on a loaded 2-core machine (a worker aborted that way in CI).
    with jax.set_mesh(trainer.mesh):
        loss, without, step_metrics = jax.device_get(
            jax.jit(with_and_without_aux_losses)(state["params"], batch))
    balance = (float(loss) - float(without)) / GLaMTiny.LOAD_BALANCING_WEIGHT
    assert 0.5 < balance <= GLaMTiny.NUM_EXPERTS, balance
    # ... and what the step metrics report: the mean over the mixture layers of the
    # unweighted loss (each layer weighs its own by LOAD_BALANCING_WEIGHT / (NUM_LAYERS / 2)).
    np.testing.assert_allclose(step_metrics["moe/load_balancing_loss"], balance, rtol=1e-3)
    assert 0 <= step_metrics["moe/dropped_fraction"] < 1
    assert 0 <= step_metrics["moe/unrouted_fraction"] <= step_metrics["moe/dropped_fraction"]


@pytest.mark.process
@pytest.mark.slow  # the same training as above, through main.py, with both evaluations
def test_glam_tiny_runs_through_main(tmp_path):
    out = run_main("--fdl_config=experiments.GLaMTiny", f"--job_log_dir={tmp_path}",
                   "--fdl.MAX_STEPS=4", "--fdl.EVAL_INTERVAL_STEPS=4",
                   "--fdl.LAMBADA_MAX_EXAMPLES=8", "--fdl.SUMMARY_INTERVAL_STEPS=2", check=True)
    assert "step      4 | eval lambada" in out.stdout and "step      4 | loss" in out.stdout
