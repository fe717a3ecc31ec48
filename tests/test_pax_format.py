"""paxloom/runner/state/pax_format.py: a Pax checkpoint (tests/support/pax_checkpoints.py, paxml's files) of known
random weights, read into a Paxloom model, computes the logits and loss that `transformers`
computes from the same weights, mapped to it by hand here (not through Paxloom's export).

The Llama weights start in Meta's original layout and go two independent ways: to Pax's as
saxml's convert_llama_ckpt.py puts them (direct RMSNorm scales, interleaved RoPE pairs, the
float16 of gs://sax-data/pax-llama), and to transformers' as its convert_llama_weights_to_hf
does (its `permute` of the query and key rows). The GPT's start in Pax's own layout (LayerNorm
scales stored as offsets from 1)."""

import os
import subprocess

import jax
import numpy as np
import pytest
import torch
from praxis import pax_fiddle
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import experiments
from experiments.llama import LlamaBase
from layers import architecture
from paxloom.core.errors import UserError
from paxloom.runner.cluster import mesh as mesh_lib
from paxloom.runner.inference.model import abstract_params
from paxloom.runner.state import pax_format
from paxloom.runner.state.train_state import as_model_batch, praxis_context
from tests.support.pax_checkpoints import flatten, stack_layers, write_pax_checkpoint

L, D, F, N, H, V, S = 2, 64, 256, 4, 16, 512, 64  # layers, width, hidden, heads, head, vocab, seq
SIZES = dict(NUM_LAYERS=L, MODEL_DIMS=D, HIDDEN_DIMS=F, NUM_HEADS=N, DIMS_PER_HEAD=H,
             VOCAB_SIZE=V, MAX_SEQ_LEN=S, FPROP_DTYPE="float32", ICI_MESH_SHAPE=[1, 1, 1])
STD = 0.2  # far from the init's scales of 1 and biases of 0: a wrong convention shows
B, T = 2, 24  # the batch the logits are compared on


def normal(rng, *shape) -> np.ndarray:
    return (STD * rng.standard_normal(shape)).astype(np.float32)


# ----- the Paxloom side ----------------------------------------------------------------


class Target:
    """A Paxloom model (an experiment's), its Architecture and abstract parameter tree."""

    def __init__(self, experiment, **overrides):
        config = experiment(**{**SIZES, **overrides}).run_config()
        self.arch = architecture.architecture_of(config.model)
        self.model = pax_fiddle.build(config.model)
        mesh = mesh_lib.create_mesh([1, 1, 1], [1, 1, 1], devices=jax.devices()[:1])
        self.like = abstract_params(self.model, mesh, S)

    def read(self, path, **options) -> dict:
        return pax_format.read_params(path, self.arch, self.like, **options)

    def forward(self, flat: dict, ids: np.ndarray):
        """(logits [B, T, V], mean next-token cross-entropy) of praxis's forward pass."""
        paths, treedef = jax.tree_util.tree_flatten_with_path(self.like)
        names = [jax.tree_util.keystr(p, simple=True, separator="/") for p, _ in paths]
        assert sorted(names) == sorted(flat), "read_params must give exactly the model's leaves"
        params = jax.tree_util.tree_unflatten(treedef, [flat[n] for n in names])
        weights = np.ones(ids.shape, np.float32)
        weights[:, -1] = 0  # the last position has no next token
        batch = {"ids": ids, "labels": np.roll(ids, -1, axis=1), "weights": weights,
                 "paddings": np.zeros(ids.shape, np.float32),
                 "segment_ids": np.ones(ids.shape, np.int32),
                 "segment_pos": np.tile(np.arange(ids.shape[1], dtype=np.int32), (len(ids), 1))}
        with jax.default_matmul_precision("highest"), praxis_context(do_eval=True):
            out = self.model.apply({"params": params}, as_model_batch(batch),
                                   method=self.model.compute_predictions)
        return np.asarray(out.logits), float(out.avg_xent)


def hf_forward(model, ids: np.ndarray):
    """(logits, mean next-token cross-entropy) of a transformers model, float32."""
    with torch.no_grad():
        logits = model(torch.from_numpy(ids).long()).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 torch.from_numpy(ids[:, 1:]).long().reshape(-1))
    return logits.numpy(), float(loss)


def assert_same_outputs(target: Target, flat: dict, hf_model, ids: np.ndarray) -> None:
    logits, loss = target.forward(flat, ids)
    hf_logits, hf_loss = hf_forward(hf_model, ids)
    np.testing.assert_allclose(logits, hf_logits, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(loss, hf_loss, rtol=1e-5)


def token_ids(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, (B, T)).astype(np.int32)


def load_hf(model_class, config, tensors: dict):
    model = model_class(config).eval()
    state = {k: torch.from_numpy(np.ascontiguousarray(v, np.float32)) for k, v in tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return model


# ----- GPT: Pax's layout, and GPT-2's ---------------------------------------------------


def pax_gpt_weights(rng) -> dict:
    """A Pax GPT's params (configs.py GPT126M's layers: LayerNorm with bias, storing
    scale - 1; combined QKV with bias; tied softmax; learned positions)."""

    def norm():
        return {"scale": normal(rng, D), "bias": normal(rng, D)}

    layers = {f"x_layers_{i}": {
        "layer_norm": norm(),
        "self_attention": {"combined_qkv": {"w": normal(rng, 3, D, N, H), "b": normal(rng, 3, N, H)},
                           "post": {"w": normal(rng, D, N, H), "b": normal(rng, D)}},
        "ff_layer": {"layer_norm": norm(),
                     "ffn_layer1": {"linear": {"w": normal(rng, D, F)}, "bias": {"b": normal(rng, F)}},
                     "ffn_layer2": {"linear": {"w": normal(rng, F, D)}, "bias": {"b": normal(rng, D)}}},
    } for i in range(L)}
    return {"lm": {"softmax": {"logits_ffn": {"linear": {"w": normal(rng, D, V)}}},
                   "position_emb": {"emb_var": normal(rng, S, D)},
                   "final_ln": norm(), "transformer": layers}}


def gpt2_model(pax: dict):
    lm = pax["lm"]
    config = GPT2Config(vocab_size=V, n_positions=S, n_embd=D, n_layer=L, n_head=N, n_inner=F,
                        activation_function="gelu_new", layer_norm_epsilon=1e-5,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)
    tensors = {"transformer.wte.weight": lm["softmax"]["logits_ffn"]["linear"]["w"].T,
               "transformer.wpe.weight": lm["position_emb"]["emb_var"],
               "transformer.ln_f.weight": 1 + lm["final_ln"]["scale"],
               "transformer.ln_f.bias": lm["final_ln"]["bias"]}
    for i in range(L):
        layer, p = lm["transformer"][f"x_layers_{i}"], f"transformer.h.{i}."
        attention, ff = layer["self_attention"], layer["ff_layer"]
        qkv = attention["combined_qkv"]
        tensors.update({  # GPT-2's Conv1D weights are [in, out]
            p + "ln_1.weight": 1 + layer["layer_norm"]["scale"],
            p + "ln_1.bias": layer["layer_norm"]["bias"],
            p + "attn.c_attn.weight": np.concatenate([qkv["w"][j].reshape(D, N * H)
                                                      for j in range(3)], axis=1),
            p + "attn.c_attn.bias": qkv["b"].reshape(3 * N * H),
            p + "attn.c_proj.weight": np.einsum("dnh->nhd", attention["post"]["w"]).reshape(N * H, D),
            p + "attn.c_proj.bias": attention["post"]["b"],
            p + "ln_2.weight": 1 + ff["layer_norm"]["scale"],
            p + "ln_2.bias": ff["layer_norm"]["bias"],
            p + "mlp.c_fc.weight": ff["ffn_layer1"]["linear"]["w"],
            p + "mlp.c_fc.bias": ff["ffn_layer1"]["bias"]["b"],
            p + "mlp.c_proj.weight": ff["ffn_layer2"]["linear"]["w"],
            p + "mlp.c_proj.bias": ff["ffn_layer2"]["bias"]["b"],
        })
    return load_hf(GPT2LMHeadModel, config, tensors)


@pytest.fixture(scope="module")
def gpt_target():
    return Target(experiments.BaseExperiment)  # per-layer x_layers_i


@pytest.fixture(scope="module")
def gpt_checkpoint(tmp_path_factory):
    """A Pax GPT job directory whose layers are stored repeated, as Pax's GPT5B stores them."""
    pax = pax_gpt_weights(np.random.default_rng(1))
    stored = {"lm": {**pax["lm"], "transformer": stack_layers(pax["lm"]["transformer"], L)}}
    job = tmp_path_factory.mktemp("pax_gpt")
    write_pax_checkpoint(job, stored, step=12000)
    return job, pax


def test_gpt_repeated_pax_checkpoint_gives_gpt2s_logits(gpt_target, gpt_checkpoint, capsys):
    job, pax = gpt_checkpoint
    assert pax_format.is_pax_checkpoint(job)
    flat = gpt_target.read(job)
    assert "checkpoint_00012000" in capsys.readouterr().out  # the step read is named
    assert all(v.dtype == np.float32 for v in flat.values())
    assert_same_outputs(gpt_target, flat, gpt2_model(pax), token_ids(0))


def test_checkpoint_restore_path_reads_a_pax_job_onto_a_runs_mesh(gpt_target, gpt_checkpoint,
                                                                  tmp_path):
    """CHECKPOINT_RESTORE_PATH=<Pax job directory>: what read_params gives, on [2,2,2]."""
    from paxloom.core.spec import InitialWeights
    from paxloom.runner.state import initial_weights
    from tests.support.training import make_trainer

    job, _ = gpt_checkpoint
    overrides = {**SIZES, "ICI_MESH_SHAPE": [2, 2, 2]}
    trainer = make_trainer(tmp_path, **overrides)
    params = initial_weights.load(
        InitialWeights(str(job)), trainer.init_state()["params"],
        trainer.abstract_state["params"],
        experiments.BaseExperiment(**overrides).run_config().model)
    expected = gpt_target.read(job)
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        assert np.asarray(leaf).tobytes() == expected[name].tobytes(), name


def test_padded_parameters_are_cut_to_their_true_shape(gpt_target, gpt_checkpoint, tmp_path):
    """paxml saves a parameter padded for an even split over the mesh, and its true shape in
    metadata/metadata; what is read is the true one."""
    job, pax = gpt_checkpoint
    padded = write_pax_checkpoint(tmp_path, pax, pad={"lm.softmax.logits_ffn.linear.w": 8})
    want, got = gpt_target.read(job), gpt_target.read(padded)
    assert all(np.array_equal(want[k], got[k]) for k in want)


@pytest.mark.process
@pytest.mark.skipif(not os.environ.get("PAXML_PYTHON"), reason="set PAXML_PYTHON to a Python "
                    "with paxml 1.4.0 (see this test's docstring) to compare with paxml itself")
def test_paxmls_own_checkpoint_reads_like_the_fixture(gpt_target, gpt_checkpoint, tmp_path):
    """The fixture against paxml's own save_checkpoint (CheckpointType.GDA), in a separate
    environment, since paxml's pins cannot be installed beside Paxloom:

        python3 -m venv /tmp/paxenv
        /tmp/paxenv/bin/pip install --no-deps paxml==1.4.0 praxis==1.4.0 lingvo==0.14.2
        /tmp/paxenv/bin/pip install jax==0.4.26 jaxlib==0.4.26 flax==0.8.2 \
            orbax-checkpoint==0.5.9 tensorstore==0.1.55 numpy==1.26.4 etils==1.7.0 \
            absl-py==1.4.0 optax==0.2.2 fiddle==0.3.0 clu==0.0.11 typeguard==2.13.3 \
            jaxtyping==0.2.28 einops==0.7.0 opt-einsum==3.3.0 chex sympy
        PAXML_PYTHON=/tmp/paxenv/bin/python pytest tests/test_pax_format.py
    """
    job, pax = gpt_checkpoint
    stored = {"lm": {**pax["lm"], "transformer": stack_layers(pax["lm"]["transformer"], L)}}
    np.savez(tmp_path / "params.npz", **flatten(stored))
    script = (
        "import sys, numpy as np, jax, jax.numpy as jnp\n"
        "from paxml import checkpoints, train_states\n"
        "params = {}\n"
        "for name, value in np.load(sys.argv[1]).items():\n"
        "    *parents, last = name.split('.')\n"
        "    node = params\n"
        "    for key in parents: node = node.setdefault(key, {})\n"
        "    node[last] = jnp.asarray(value)\n"
        "zeros = jax.tree_util.tree_map(lambda a: jnp.zeros((1,)), params)\n"
        "state = train_states.TrainState(step=jnp.array(12000, jnp.int32),\n"
        "    mdl_vars={'params': params}, opt_states=[{'mu': zeros, 'nu': zeros}])\n"
        "checkpoints.save_checkpoint(state, sys.argv[2],\n"
        "    checkpoint_type=checkpoints.CheckpointType.GDA)\n")
    subprocess.run([os.environ["PAXML_PYTHON"], "-c", script, str(tmp_path / "params.npz"),
                    str(tmp_path / "paxml" / "checkpoints")], check=True, capture_output=True)
    want, got = gpt_target.read(job), gpt_target.read(tmp_path / "paxml")
    assert want.keys() == got.keys() and all(np.array_equal(want[k], got[k]) for k in want)


# ----- Llama: Meta's layout, to Pax's and to transformers' ----------------------------------


def meta_llama_weights(rng, kv_heads: int) -> dict:
    """Llama weights in Meta's original checkpoint layout (torch Linear [out, in]; query and
    key rows in interleaved RoPE order), rounded to float16 as Pax's LLaMA checkpoints hold
    them."""

    def w(*shape, mean=0.0):
        return (mean + normal(rng, *shape)).astype(np.float16).astype(np.float32)

    weights = {"tok_embeddings": w(V, D), "norm": w(D, mean=1), "output": w(V, D)}
    for i in range(L):
        weights.update({f"layers.{i}.{k}": v for k, v in {
            "attention.wq": w(N * H, D), "attention.wk": w(kv_heads * H, D),
            "attention.wv": w(kv_heads * H, D), "attention.wo": w(D, N * H),
            "feed_forward.w1": w(F, D), "feed_forward.w2": w(D, F), "feed_forward.w3": w(F, D),
            "attention_norm": w(D, mean=1), "ffn_norm": w(D, mean=1)}.items()})
    return weights


def pax_llama_weights(meta: dict, kv_heads: int, combine_qkv: bool = True) -> dict:
    """saxml's convert_llama_ckpt.py: Pax's LLaMA params (RMSNorm scales direct; q/k heads
    in Meta's interleaved order; combined QKV for 7B-style multi-head attention unless
    `combine_qkv` is False, separate query/key/value for LLaMA70B-style grouped-query
    attention)."""
    layers = {}
    for i in range(L):
        m = {k.split(".", 2)[2]: v for k, v in meta.items() if k.startswith(f"layers.{i}.")}
        wq, wk, wv = (m[f"attention.{n}"].T for n in ("wq", "wk", "wv"))  # [D, heads * H]
        if kv_heads == N and combine_qkv:
            attention = {"combined_qkv": {"w": np.stack([wq, wk, wv]).reshape(3, D, N, H)}}
        else:
            attention = {"query": {"w": wq.reshape(D, N, H)},
                         "key": {"w": wk.reshape(D, kv_heads, H)},
                         "value": {"w": wv.reshape(D, kv_heads, H)}}
        attention["post"] = {"w": m["attention.wo"].reshape(D, N, H)}
        layers[f"x_layers_{i}"] = {
            "self_attention": attention,
            "layer_norm": {"scale": m["attention_norm"]},
            "ff_layer": {"layer_norm": {"scale": m["ffn_norm"]},
                         "ffn_layer1_gate": {"linear": {"w": m["feed_forward.w1"].T}},
                         "ffn_layer1": {"linear": {"w": m["feed_forward.w3"].T}},
                         "ffn_layer2": {"linear": {"w": m["feed_forward.w2"].T}}}}
    return {"lm": {"embedding_lookup": {"emb_var": meta["tok_embeddings"]},
                   "softmax": {"logits_ffn": {"linear": {"w": meta["output"].T}}},
                   "final_ln": {"scale": meta["norm"]}, "transformer": layers}}


def hf_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """transformers' convert_llama_weights_to_hf `permute`: Meta's interleaved rotary pairs
    to rotate_half's halves, rows of a [heads * H, D] projection."""
    t = torch.from_numpy(w)
    return t.view(heads, H // 2, 2, D).transpose(1, 2).reshape(heads * H, D).numpy()


def llama_model(meta: dict, kv_heads: int):
    config = LlamaConfig(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=L,
                         num_attention_heads=N, num_key_value_heads=kv_heads, head_dim=H,
                         hidden_act="silu", max_position_embeddings=S, rms_norm_eps=1e-5,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                         tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    tensors = {"model.embed_tokens.weight": meta["tok_embeddings"],
               "model.norm.weight": meta["norm"], "lm_head.weight": meta["output"]}
    for i in range(L):
        m = {k.split(".", 2)[2]: v for k, v in meta.items() if k.startswith(f"layers.{i}.")}
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": hf_permute(m["attention.wq"], N),
            p + "self_attn.k_proj.weight": hf_permute(m["attention.wk"], kv_heads),
            p + "self_attn.v_proj.weight": m["attention.wv"],
            p + "self_attn.o_proj.weight": m["attention.wo"],
            p + "mlp.gate_proj.weight": m["feed_forward.w1"],
            p + "mlp.up_proj.weight": m["feed_forward.w3"],
            p + "mlp.down_proj.weight": m["feed_forward.w2"],
            p + "input_layernorm.weight": m["attention_norm"],
            p + "post_attention_layernorm.weight": m["ffn_norm"],
        })
    return load_hf(LlamaForCausalLM, config, tensors)


@pytest.mark.parametrize("kv_heads,repeated,ocdbt", [
    (N, False, False),  # LLaMA7B: multi-head, combined QKV; per-layer both sides
    # LLaMA70B-style grouped-query attention, into a repeated Paxloom stack, OCDBT storage
    (2, True, True),
], ids=["mha_combined_qkv", "gqa_into_repeated_ocdbt"])
def test_llama_pax_checkpoint_gives_transformers_logits(kv_heads, repeated, ocdbt, tmp_path):
    meta = meta_llama_weights(np.random.default_rng(kv_heads), kv_heads)
    step_dir = write_pax_checkpoint(tmp_path, pax_llama_weights(meta, kv_heads), step=0,
                                    dtype=np.float16, ocdbt=ocdbt)
    target = Target(LlamaBase, NUM_KV_HEADS=kv_heads, USE_REPEATED_LAYER=repeated)
    flat = target.read(step_dir)
    assert all(v.dtype == np.float32 for v in flat.values())
    hf_model = llama_model(meta, kv_heads)
    ids = token_ids(kv_heads)
    assert_same_outputs(target, flat, hf_model, ids)
    # The RoPE permutation matters: read as if Pax had paired halves, the logits differ.
    wrong, _ = target.forward(target.read(step_dir, rope_pairs="halves"), ids)
    assert not np.allclose(wrong, hf_forward(hf_model, ids)[0], rtol=1e-2, atol=1e-2)


def test_separate_multi_head_qkv_is_combined(tmp_path):
    """Pax's MultiQueryDotProductAttention with as many key/value heads as query heads keeps
    query/key/value apart; Paxloom's multi-head Llama combines them."""
    meta = meta_llama_weights(np.random.default_rng(5), N)
    combined = pax_llama_weights(meta, N)
    separate = pax_llama_weights(meta, N, combine_qkv=False)
    target = Target(LlamaBase, NUM_KV_HEADS=N)
    want = target.read(write_pax_checkpoint(tmp_path / "combined", combined))
    got = target.read(write_pax_checkpoint(tmp_path / "separate", separate))
    assert all(np.array_equal(want[k], got[k]) for k in want)

    with pytest.raises(UserError) as error:
        target.read(write_pax_checkpoint(tmp_path / "gqa", pax_llama_weights(
            meta_llama_weights(np.random.default_rng(5), 2), 2)))
    assert "self_attention.key.w: shape (64, 2, 16), 2 key/value heads" in one_line(error)
    assert "set NUM_KV_HEADS=2" in one_line(error)


# ----- finding the step, and one-line errors ---------------------------------------------


def test_the_latest_complete_step_is_read(tmp_path, capsys):
    params = {"lm": {"final_ln": {"scale": np.zeros(D, np.float32)}}}
    job = tmp_path / "job"
    done = write_pax_checkpoint(job, params, step=100)
    (job / "checkpoints" / "checkpoint_00000200").mkdir()  # a save that wrote no arrays yet
    (job / "checkpoints" / "checkpoint_00000300.orbax-checkpoint-tmp-1700000000").mkdir()
    assert pax_format.step_directory(job) == done
    assert "skipped incomplete step(s) [200]" in capsys.readouterr().out
    assert pax_format.step_directory(job / "checkpoints") == done
    assert pax_format.step_directory(done) == done

    # In a copy of a GCS directory, a step without commit_success.txt was cut short.
    copy = tmp_path / "copy"
    committed = write_pax_checkpoint(copy, params, step=5, commit_file=True)
    cut_short = write_pax_checkpoint(copy, params, step=6)
    assert pax_format.step_directory(copy) == committed
    with pytest.raises(UserError) as error:
        pax_format.step_directory(cut_short)
    assert "no complete Pax checkpoint step (no commit_success.txt" in one_line(error)


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_a_path_that_is_no_pax_checkpoint_is_one_line(gpt_target, tmp_path):
    missing = tmp_path / "nowhere"
    assert not pax_format.is_pax_checkpoint(missing)
    with pytest.raises(UserError) as error:
        gpt_target.read(missing)
    assert str(missing) in one_line(error) and "no such file or directory" in one_line(error)

    paxloom_run = tmp_path / "run"
    (paxloom_run / "checkpoints" / "100" / "state").mkdir(parents=True)  # Paxloom's own layout
    assert not pax_format.is_pax_checkpoint(paxloom_run)
    with pytest.raises(UserError) as error:
        gpt_target.read(paxloom_run)
    assert "is not a Pax checkpoint" in one_line(error) and str(paxloom_run) in one_line(error)

    empty_step = tmp_path / "job" / "checkpoints" / "checkpoint_00000100"
    empty_step.mkdir(parents=True)
    assert pax_format.is_pax_checkpoint(tmp_path / "job")
    with pytest.raises(UserError) as error:
        gpt_target.read(tmp_path / "job")
    assert "no complete Pax checkpoint step" in one_line(error)


def test_a_mismatched_or_missing_parameter_is_one_line(gpt_checkpoint):
    job, _ = gpt_checkpoint
    wider = Target(experiments.BaseExperiment, VOCAB_SIZE=1024)
    with pytest.raises(UserError) as error:
        wider.read(job)
    assert ("mdl_vars.params.lm.softmax.logits_ffn.linear.w: shape (64, 512), but this "
            "model's lm/softmax/logits_ffn/linear/w is (64, 1024)") in one_line(error)

    deeper = Target(experiments.BaseExperiment, NUM_LAYERS=3)
    with pytest.raises(UserError) as error:
        deeper.read(job)
    assert "has 2 layers and this model 3; set NUM_LAYERS=2" in one_line(error)

    llama = Target(LlamaBase)
    with pytest.raises(UserError) as error:
        llama.read(job)
    assert "mdl_vars.params.lm.embedding_lookup.emb_var: missing" in one_line(error)
