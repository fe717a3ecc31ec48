"""The model seam and the models behind it: an independent reference forward pass, initial
parameter statistics, sharding of swapped layer templates, and old checkpoints refused."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from praxis import pax_fiddle
from praxis.layers import attentions, normalizations, transformers

from experiments.base import BaseExperiment
from experiments.llama import LlamaBase
from layers.stack import transformer_layer_template
from paxloom.core.errors import UserError
from paxloom.core.spec import Evaluation
from paxloom.runner.state import checkpoints, partitioning
from paxloom.runner.state.train_state import replicated_matrices
from tests.support.tiny import TINY
from tests.support.training import make_trainer, run_steps

# ----- an independent GPT forward pass (numpy, float64) ---------------------------------------


def _layer_norm(x, p, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * (1.0 + p["scale"]) + p["bias"]


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def reference_gpt_logprobs(params, batch, *, num_layers, eps=1e-5):
    """log p(label) per token of a GPT-2/3 style decoder, from the saved parameter arrays.

    Written from the architecture (pre-LN, learned positions, tied embedding, causal
    attention within each packed document, tanh GELU), not from praxis code. The
    parameter layout it reads: combined QKV [3, D, N, H], output projection
    [D, N, H], LayerNorm scale stored as an offset from 1.
    """
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)["lm"]
    ids, labels, seg, pos = (batch[k] for k in ("ids", "labels", "segment_ids", "segment_pos"))
    w_vocab = p["softmax"]["logits_ffn"]["linear"]["w"]  # [D, V]; the embedding is its transpose
    x = w_vocab.T[ids] + p["position_emb"]["emb_var"][pos]  # [B, T, D]
    t = ids.shape[1]
    visible = np.tril(np.ones((t, t), bool))[None] & (seg[:, :, None] == seg[:, None, :])  # [B,T,S]
    for i in range(num_layers):
        layer = p["transformer"][f"x_layers_{i}"]
        att = layer["self_attention"]
        h = _layer_norm(x, layer["layer_norm"], eps)
        q, k, v = (np.einsum("btd,kdnh->kbtnh", h, att["combined_qkv"]["w"])
                   + att["combined_qkv"]["b"][:, None, None])  # each [B, T, N, H]
        scores = np.einsum("btnh,bsnh->bnts", q / np.sqrt(q.shape[-1]), k)
        scores = np.where(visible[:, None], scores, -np.inf)
        probs = np.exp(_log_softmax(scores))  # [B, N, T, S]
        context = np.einsum("bnts,bsnh->btnh", probs, v)
        x = x + np.einsum("btnh,dnh->btd", context, att["post"]["w"]) + att["post"]["b"]
        ff = layer["ff_layer"]
        h = _layer_norm(x, ff["layer_norm"], eps)
        h = _gelu_tanh(h @ ff["ffn_layer1"]["linear"]["w"] + ff["ffn_layer1"]["bias"]["b"])
        x = x + h @ ff["ffn_layer2"]["linear"]["w"] + ff["ffn_layer2"]["bias"]["b"]
    logprobs = _log_softmax(_layer_norm(x, p["final_ln"], eps) @ w_vocab)  # [B, T, V]
    return np.take_along_axis(logprobs, labels[..., None], axis=-1)[..., 0]


@dataclasses.dataclass(frozen=True)
class TokenLogprobs(Evaluation):
    """An evaluation added through the seam: per-token log-likelihoods, no metrics."""

    def batch_outputs(self, predictions, batch):
        return {"logprob": -predictions.per_example_xent.astype(jnp.float32)}


def _packed_batch(rows, seq_len, vocab_size, seed=0):
    """Rows of 2-3 documents each, positions restarting per document."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab_size, size=(rows, seq_len + 1)).astype(np.int32)
    segment_ids = np.zeros((rows, seq_len), np.int32)
    segment_pos = np.zeros((rows, seq_len), np.int32)
    for r in range(rows):
        cuts = sorted(rng.choice(np.arange(5, seq_len - 5), size=r % 2 + 1, replace=False))
        for s, (a, b) in enumerate(zip([0, *cuts], [*cuts, seq_len], strict=True)):
            segment_ids[r, a:b] = s + 1
            segment_pos[r, a:b] = np.arange(b - a)
    ones = np.ones((rows, seq_len), np.float32)
    return {"ids": tokens[:, :-1], "labels": tokens[:, 1:], "weights": ones,
            "paddings": np.zeros_like(ones), "segment_ids": segment_ids,
            "segment_pos": segment_pos}


def test_gpt_matches_an_independent_reference_from_a_trained_checkpoint(tmp_path):
    # A wide init makes activations O(1), where every detail shows above the tolerance
    # (exact instead of tanh GELU, say, moves log-likelihoods by more than 1e-4).
    trainer = make_trainer(tmp_path, ICI_MESH_SHAPE=[2, 2, 2], PERCORE_BATCH_SIZE=1,
                           INIT_STD=0.25, SOFTMAX_INIT_STD=0.25,
                           LEARNING_RATE=3e-3, LR_COS_WARMUP=1, LR_COS_DECAY_START=1)
    _, state = run_steps(trainer, 10)  # trained: no parameter sits at its initial value
    metadata = checkpoints.run_metadata("tests", TINY, trainer.abstract_state["params"])
    with checkpoints.Checkpointer(str(tmp_path / "ckpt"), metadata=metadata, every_n_steps=0,
                                  max_to_keep=1) as ckpt:
        ckpt.save(10, state, {}, final=True)
    _, saved = checkpoints.load_numpy(str(tmp_path / "ckpt"))
    params = checkpoints.restore(str(tmp_path / "ckpt"), None, trainer.abstract_state,
                                 params_only=True).state["params"]

    batch = _packed_batch(trainer.global_batch_size, TINY["MAX_SEQ_LEN"], TINY["VOCAB_SIZE"])
    evaluation = TokenLogprobs(name="token_logprobs", make_input=None)
    with jax.set_mesh(trainer.mesh):
        ours = jax.device_get(trainer.eval_step(evaluation)(params, trainer.to_device(batch)))
    expected = reference_gpt_logprobs(saved["params"], batch, num_layers=TINY["NUM_LAYERS"])
    # Trained: norm scales and biases have left their initial zeros, so the comparison
    # exercises every parameter, the (1 + scale) of LayerNorm included.
    layer = saved["params"]["lm"]["transformer"]["x_layers_1"]
    assert np.abs(layer["layer_norm"]["scale"]).min() > 0
    assert np.abs(layer["self_attention"]["combined_qkv"]["b"]).min() > 0
    np.testing.assert_allclose(ours["logprob"], expected, atol=1e-4, rtol=0)


# ----- initial parameter statistics -------------------------------------------------------------

INIT = dict(MODEL_DIMS=256, HIDDEN_DIMS=512, NUM_HEADS=4, DIMS_PER_HEAD=64, VOCAB_SIZE=1024,
            INIT_STD=0.03, SOFTMAX_INIT_STD=0.011, ICI_MESH_SHAPE=[1, 1, 1],
            PERCORE_BATCH_SIZE=1)


def _init_params(tmp_path, experiment, **overrides):
    trainer = make_trainer(tmp_path, devices=jax.devices()[:1], experiment=experiment,
                           **{**INIT, **overrides})
    params = jax.device_get(trainer.init_state()["params"])
    return {"/".join(str(k.key) for k in path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}


def _assert_std(array, std, name):
    assert abs(array.mean()) < 0.05 * std, name
    assert array.std() == pytest.approx(std, rel=0.03), name


def test_gpt_initial_parameters_follow_init_std_and_softmax_init_std(tmp_path):
    params = _init_params(tmp_path, BaseExperiment)
    layer = "lm/transformer/x_layers_0"
    _assert_std(params["lm/softmax/logits_ffn/linear/w"], 0.011, "tied embedding")
    for name in ("lm/position_emb/emb_var", f"{layer}/self_attention/combined_qkv/w",
                 f"{layer}/self_attention/post/w", f"{layer}/ff_layer/ffn_layer1/linear/w",
                 f"{layer}/ff_layer/ffn_layer2/linear/w"):
        _assert_std(params[name], 0.03, name)
    # LayerNorm scales are stored as offsets from 1 (so start at 0), biases start at 0.
    constants = [n for n in params if n.endswith(("scale", "bias", "/b"))]
    assert len(constants) == 2 + 2 * (4 + 4)  # final LN; per layer 2 LNs x2, 4 biases
    for name in constants:
        assert not params[name].any(), name


def test_llama_initial_parameters_follow_init_std_and_softmax_init_std(tmp_path):
    params = _init_params(tmp_path, LlamaBase, NUM_KV_HEADS=2)
    layer = "lm/transformer/x_layers_0"
    _assert_std(params["lm/softmax/logits_ffn/linear/w"], 0.011, "output layer")
    for name in ("lm/embedding_lookup/emb_var", f"{layer}/self_attention/query/w",
                 f"{layer}/self_attention/key/w", f"{layer}/self_attention/value/w",
                 f"{layer}/self_attention/post/w", f"{layer}/ff_layer/ffn_layer1/linear/w",
                 f"{layer}/ff_layer/ffn_layer1_gate/linear/w",
                 f"{layer}/ff_layer/ffn_layer2/linear/w"):
        _assert_std(params[name], 0.03, name)
    assert params[f"{layer}/self_attention/key/w"].shape == (256, 2, 64)  # 2 key/value heads
    # RMSNorm scales are offsets from 1; there is no bias anywhere.
    norms = [n for n in params if n.endswith("scale")]
    assert len(norms) == 1 + 2 * 2
    for name in norms:
        assert not params[name].any(), name
    assert not [n for n in params if n.endswith(("bias", "/b"))]


# ----- the seam: a swapped layer template is sharded like the one it replaced -------------------


class MyAttention(attentions.DotProductAttention):
    """Stands for a user's attention kernel: same parameters, another class."""


class MyFeedForward(transformers.TransformerFeedForward):
    pass


class SwappedLayers(BaseExperiment):
    def model_template(self):
        model = super().model_template()
        layer = transformer_layer_template(model.lm_tpl.stacked_transformer_tpl)
        layer.tr_atten_tpl = pax_fiddle.Config(MyAttention, use_bias=True, combine_qkv=True,
                                               internal_enable_per_dim_scale=False)
        layer.tr_fflayer_tpl = pax_fiddle.Config(MyFeedForward, has_bias=False)
        layer.tr_fflayer_tpl.ln_tpl = pax_fiddle.Config(normalizations.RmsNorm)
        return model


@pytest.mark.parametrize("ici", [[1, 2, 4], [2, 2, 2]])
def test_swapped_layer_templates_keep_their_shardings(ici, tmp_path):
    trainer = make_trainer(tmp_path, experiment=SwappedLayers, ICI_MESH_SHAPE=ici)
    built = trainer.model.lm_tpl.stacked_transformer_tpl.transformer_layer_params_tpl
    assert built.tr_atten_tpl.cls is MyAttention and built.tr_fflayer_tpl.cls is MyFeedForward
    specs = jax.tree_util.tree_map(lambda s: s.spec, trainer.state_shardings["params"])
    layer = specs["lm"]["transformer"]["x_layers_1"]
    assert layer["self_attention"]["combined_qkv"]["w"] == P(None, "data", "mdl", None)
    assert layer["self_attention"]["post"]["w"] == P("data", "mdl", None)
    assert layer["ff_layer"]["ffn_layer1"]["linear"]["w"] == P("data", "mdl")
    assert layer["ff_layer"]["ffn_layer2"]["linear"]["w"] == P("mdl", "data")
    assert "bias" not in layer["ff_layer"]["ffn_layer1"]  # the swap took effect
    assert replicated_matrices(specs, trainer.abstract_state["params"]) == []
    # Each device holds 1/(data x mdl) of a feed-forward matrix.
    w = trainer.abstract_state["params"]["lm"]["transformer"]["x_layers_1"]["ff_layer"][
        "ffn_layer1"]["linear"]["w"]
    assert w.sharding.shard_shape(w.shape) == (64 // ici[1], 256 // ici[2])


def test_a_template_swapped_after_sharding_is_reported_replicated(tmp_path, capsys):
    exp = BaseExperiment(**{**TINY, "ICI_MESH_SHAPE": [1, 2, 4]})
    sharded = partitioning.shard_model(exp.model_template(), [1, 2, 4])
    layer = transformer_layer_template(sharded.lm_tpl.stacked_transformer_tpl)
    layer.tr_atten_tpl = pax_fiddle.Config(MyAttention, combine_qkv=True)  # too late
    trainer = make_trainer(tmp_path, ICI_MESH_SHAPE=[1, 2, 4])
    with jax.set_mesh(trainer.mesh):
        from paxloom.runner.state.train_state import param_partition_specs

        example = {k: np.zeros(s.shape, s.dtype) for k, s in trainer.batch_shapes.items()}
        specs = param_partition_specs(pax_fiddle.build(sharded), example, trainer.mesh)
    names = replicated_matrices(specs, trainer.abstract_state["params"])
    assert "lm/transformer/x_layers_0/self_attention/combined_qkv/w" in names


# ----- old checkpoints ------------------------------------------------------------------------


class SeparateQKV(BaseExperiment):
    """The layout of checkpoints written before the reference GPT: separate q/k/v."""

    def model_template(self):
        model = super().model_template()
        transformer_layer_template(model.lm_tpl.stacked_transformer_tpl).tr_atten_tpl.set(
            combine_qkv=False)
        return model


def test_a_checkpoint_of_the_old_layout_is_refused_naming_the_parameter(tmp_path):
    old = make_trainer(tmp_path / "old", experiment=SeparateQKV, ICI_MESH_SHAPE=[1, 8, 1])
    metadata = checkpoints.run_metadata("old", TINY, old.abstract_state["params"])
    with checkpoints.Checkpointer(str(tmp_path / "ckpt"), metadata=metadata, every_n_steps=0,
                                  max_to_keep=1) as ckpt:
        ckpt.save(1, old.init_state(), {}, final=True)
    new = make_trainer(tmp_path / "new", ICI_MESH_SHAPE=[1, 8, 1])
    with pytest.raises(UserError) as refused:
        checkpoints.restore(str(tmp_path / "ckpt"), None, new.abstract_state)
    message = str(refused.value)
    assert "\n" not in message
    assert "has no parameter lm/transformer/x_layers_0/self_attention/combined_qkv/b" in message


# ----- the evaluation seam ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WorstTokenEval(Evaluation):
    """A user's evaluation: the lowest per-token log-likelihood of the set."""

    def batch_outputs(self, predictions, batch):
        logprob = -predictions.per_example_xent.astype(jnp.float32)  # [B, T]
        return {"worst": jnp.min(jnp.where(batch["weights"] > 0, logprob, 0.0), axis=1)}

    def metrics(self, outputs):
        return {"worst_token_logprob": float(outputs["worst"].min())}


class WithOwnEvaluation(BaseExperiment):
    def run_config(self, data_dir=None, vocab_path=None, cache_dir=None):
        import fiddle as fdl

        from tasks import synthetic

        config = super().run_config(data_dir=data_dir, vocab_path=vocab_path, cache_dir=cache_dir)
        config.evals.append(fdl.Config(
            WorstTokenEval, name="worst_token",
            make_input=fdl.Partial(synthetic.SyntheticEvalInput, seq_len=self.MAX_SEQ_LEN,
                                   vocab_size=self.VOCAB_SIZE, seed=7, num_batches=2)))
        return config


def test_an_evaluation_added_by_an_experiment_runs_beside_the_builtin_one(tmp_path):
    trainer = make_trainer(tmp_path, experiment=WithOwnEvaluation, ICI_MESH_SHAPE=[2, 2, 2],
                           EVAL_BATCHES=1)
    results = trainer.evaluate(trainer.init_state()["params"], step=0)
    assert set(results) == {"synthetic_eval", "worst_token"}
    # Untrained: no token is much likelier than uniform over 512 (log 1/512 = -6.24).
    assert -9.0 < results["worst_token"]["worst_token_logprob"] < -6.0
    assert results["synthetic_eval"]["loss"] > 6.0
