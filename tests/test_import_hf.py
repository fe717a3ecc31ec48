"""Hugging Face checkpoints into Paxloom (paxloom/runner/state/hf_format.py, paxloom/tools/import_hf.py):
the real client's models (transformers) compute the logits Paxloom computes from their
import; a sharded or bfloat16 checkpoint reads as one float32 file; export then import
gives back the parameters and export again the same tensors; what Paxloom does not model
is refused in one line naming the config.json key."""

import json
import os

import jax
import numpy as np
import pytest
import torch
from praxis import pax_fiddle
from safetensors.numpy import load_file
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

import experiments
from experiments.llama import LlamaBase
from layers import architecture
from paxloom.core.data import BATCH_DTYPES
from paxloom.core.errors import UserError
from paxloom.runner.cluster import mesh as mesh_lib
from paxloom.runner.inference.model import abstract_params
from paxloom.runner.state import checkpoints, hf_format
from paxloom.runner.state.train_state import as_model_batch, praxis_context
from paxloom.tools import export_hf, import_hf
from tests.support.inference import praxis_logits, save_job
from tests.support.processes import run_python, session_env
from tests.support.tiny import TINY

pytestmark = pytest.mark.usefixtures("compilation_cache")

SEQ_LEN = 32  # MAX_SEQ_LEN of the transformers models: positions 0..31 all tested
ON_8_DEVICES = dict(ICI_MESH_SHAPE=[2, 2, 2], FPROP_DTYPE="float32")
FAMILIES = {"gpt": experiments.BaseExperiment, "llama": LlamaBase}


def key(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator="/")


def randomized(model, seed: int = 0):
    """`model` with every parameter drawn far from transformers' init (norm weights of 1,
    biases of 0), so that a misplaced bias, a wrong scale convention, a swapped projection
    or a missing query scale moves the logits well beyond the tolerance."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm = p.ndim == 1 and name.endswith("weight")
            p.copy_(float(is_norm) + 0.2 * torch.randn(p.shape, generator=generator))
    return model.eval()


def gpt2(**config):
    return randomized(GPT2LMHeadModel(GPT2Config(
        n_layer=2, n_embd=64, n_head=4, n_inner=128, vocab_size=256, n_positions=SEQ_LEN,
        bos_token_id=0, eos_token_id=0, **config)))


def llama(num_heads: int, num_kv_heads: int, head_dim: int, **config):
    return randomized(LlamaForCausalLM(LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, vocab_size=256,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, head_dim=head_dim,
        rms_norm_eps=1e-5, **{
            "max_position_embeddings": SEQ_LEN,
            # a base far from the default: a RoPE base that is not mapped shows
            "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}, **config})))


def paxloom(hf_dir, **overrides):
    """(experiment, arch, model, mesh, abstract params) of the run hyperparameters() makes
    of `hf_dir`, on the 8 CPU devices as [2, 2, 2]."""
    family, hyperparameters = hf_format.hyperparameters(hf_dir)
    exp = FAMILIES[family](**{**hyperparameters, **ON_8_DEVICES, **overrides})
    config = exp.run_config()
    arch = architecture.architecture_of(config.model)
    model = pax_fiddle.build(config.model)
    mesh_spec = pax_fiddle.build(config.mesh)
    mesh = mesh_lib.create_mesh(mesh_spec.ici_mesh_shape, mesh_spec.dcn_mesh_shape)
    return exp, arch, model, mesh, abstract_params(model, mesh, exp.MAX_SEQ_LEN)


def placed(flat: dict, like: dict) -> dict:
    assert sorted(flat) == sorted(key(p) for p, _ in jax.tree_util.tree_leaves_with_path(like))
    return jax.tree_util.tree_map_with_path(
        lambda path, a: jax.device_put(flat[key(path)], a.sharding), like)


def paxloom_logits(model, mesh, params, ids: np.ndarray) -> np.ndarray:
    """praxis's LanguageModel.compute_predictions logits [B, T, V] of the rows of `ids`,
    each one document at positions 0..T-1."""
    rows, length = ids.shape
    ones = np.ones((rows, length))
    batch = {"ids": ids, "labels": ids, "weights": ones, "paddings": 0 * ones,
             "segment_ids": ones, "segment_pos": np.broadcast_to(np.arange(length), ids.shape)}
    batch = {k: np.asarray(v, BATCH_DTYPES[k]) for k, v in batch.items()}

    def forward(params, batch):
        with praxis_context(do_eval=True):
            return model.apply({"params": params}, as_model_batch(batch),
                               method=model.compute_predictions).logits

    with jax.set_mesh(mesh), jax.default_matmul_precision("highest"):
        return np.asarray(jax.jit(forward)(params, batch))


def assert_imported_logits_equal(hf_model, hf_dir, **overrides):
    """Save `hf_model` (transformers) to `hf_dir`, import it into the run hyperparameters()
    makes of it (with `overrides`), and check praxis's logits equal transformers'. Returns
    (the run's experiment, its Architecture)."""
    hf_model.save_pretrained(hf_dir)
    exp, arch, model, mesh, like = paxloom(hf_dir, **overrides)
    params = placed(hf_format.read_params(hf_dir, arch, like), like)

    # 8 rows, 2 per batch shard, as a run's batch (PERCORE_BATCH_SIZE=1). On this mesh
    # with exactly one row per shard (4 rows), XLA:CPU gives wrong logits for rows 1 and 2
    # with the parameters sharded (and right ones with them replicated): not the import's.
    ids = np.random.default_rng(0).integers(0, 256, (8, SEQ_LEN))
    with torch.no_grad():
        want = hf_model(torch.tensor(ids)).logits.numpy()
    got = paxloom_logits(model, mesh, params, ids)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return exp, arch


@pytest.mark.parametrize("make,overrides", [
    (gpt2, {}),
    # 4 query heads over 2 key/value heads: separate query, key and value projections
    (lambda: llama(4, 2, 16), {}),
    # heads of 32 over a width of 64: praxis scales queries by (64 // 4) ** -0.5, not by
    # 32 ** -0.5, so the import divides the query weights by the ratio; combined QKV
    # (no grouping), and the layers stacked for a scan
    (lambda: llama(4, 4, 32), dict(USE_REPEATED_LAYER=True)),
], ids=["gpt", "llama_gqa", "llama_wide_heads_repeated"])
def test_paxloom_computes_the_logits_of_a_transformers_checkpoint(make, overrides, tmp_path):
    assert_imported_logits_equal(make(), tmp_path, **overrides)


def test_a_sharded_or_bfloat16_checkpoint_reads_as_the_float32_file(tmp_path):
    hf_model = llama(4, 2, 16)
    hf_model.save_pretrained(tmp_path / "one")
    hf_model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert len([n for n in os.listdir(tmp_path / "sharded") if n.endswith(".safetensors")]) > 2
    assert hf_format.is_hf_model_dir(tmp_path / "sharded")
    _, arch, _, _, like = paxloom(tmp_path / "one")
    one = hf_format.read_params(tmp_path / "one", arch, like)
    sharded = hf_format.read_params(tmp_path / "sharded", arch, like)
    assert sharded.keys() == one.keys()
    for name in one:
        np.testing.assert_array_equal(sharded[name], one[name], err_msg=name)
        assert sharded[name].dtype == np.float32

    # bfloat16 weights are widened exactly: as a float32 file of the same values
    hf_model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    hf_model.to(torch.float32).save_pretrained(tmp_path / "widened")
    bf16 = hf_format.read_params(tmp_path / "bf16", arch, like)
    widened = hf_format.read_params(tmp_path / "widened", arch, like)
    for name in widened:
        np.testing.assert_array_equal(bf16[name], widened[name], err_msg=name)


def test_adapters_are_left_out_and_a_tied_llama_feeds_both_ends(tmp_path):
    llama(4, 2, 16, tie_word_embeddings=True).save_pretrained(tmp_path)
    _, arch, _, _, like = paxloom(tmp_path)
    base = hf_format.read_params(tmp_path, arch, like)
    # Paxloom's Llama is untied: the embedding goes to the input and the output layer
    np.testing.assert_array_equal(base["lm/softmax/logits_ffn/linear/w"],
                                  base["lm/embedding_lookup/emb_var"].T)

    # LoRA adapters (layers/lora.py) sit beside the weights they adapt; no checkpoint of
    # the base model has them
    adapted = jax.tree_util.tree_map(lambda a: a, like)
    layer = adapted["lm"]["transformer"]["x_layers_1"]
    for projection in (layer["self_attention"]["query"], layer["ff_layer"]["ffn_layer2"]["linear"]):
        projection["lora_a"] = projection["lora_b"] = jax.ShapeDtypeStruct((64, 8), np.float32)
    with_adapters = hf_format.read_params(tmp_path, arch, adapted)
    assert with_adapters.keys() == base.keys()


def test_tensors_that_contradict_the_config_are_one_line(tmp_path):
    llama(4, 2, 16).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    _, arch, _, _, like = paxloom(tmp_path)
    with pytest.raises(UserError) as error:
        hf_format.read_params(tmp_path, arch, like)
    assert str(error.value) == (f"{tmp_path / 'model.safetensors'}: "
                                f"model.layers.0.mlp.gate_proj.weight has shape (128, 64), "
                                f"config.json makes it (96, 64)")


@pytest.mark.parametrize("experiment,overrides", [
    (experiments.BaseExperiment, {}),  # LayerNorm scales stored as offsets from 1, biases
    # RMSNorm offsets, 8 heads over 4 key/value heads, layers stacked for a scan
    (LlamaBase, dict(NUM_KV_HEADS=4, USE_REPEATED_LAYER=True)),
], ids=["gpt", "llama_gqa_repeated"])
def test_export_then_import_gives_back_the_parameters(experiment, overrides, tmp_path):
    exp = experiment(**{**TINY, **ON_8_DEVICES, **overrides})
    _, family, _ = assert_export_round_trips(exp, tmp_path)
    assert FAMILIES[family] is experiment


# Two rows of token ids, of two lengths, on which an export's logits are compared.
PROBE_SEQUENCES = ([5, 6, 7, 8, 9, 10, 11, 12], [300, 2, 45, 7])


def assert_export_round_trips(exp, tmp_path, transformers_class: str | None = None,
                              sequences: tuple = ()):
    """Export a checkpoint of `exp` with random parameters: config.json maps back to its
    hyperparameters; transformers reads it (as `transformers_class`, where given) and
    computes praxis's logits on `sequences`; the import gives back its parameters and
    exporting those writes the same tensors, bit for bit. Returns (the export's directory,
    its family, its hyperparameters)."""
    params, trainer = save_job(tmp_path / "run", exp)
    out = export_hf.export(str(tmp_path / "run"), str(tmp_path / "hf"))
    if transformers_class or sequences:
        hf_model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        assert type(hf_model).__name__ == (transformers_class or type(hf_model).__name__)
        for ids, want in zip(sequences, praxis_logits(trainer, params, sequences), strict=True):
            with torch.no_grad():
                got = hf_model(torch.tensor([ids])).logits[0].numpy()
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    family, hyperparameters = hf_format.hyperparameters(out)
    assert hyperparameters == {name: getattr(exp, name) for name in hyperparameters}
    assert_import_gives_back_and_reexports_bitwise(exp, out, params, trainer, family)
    return out, family, hyperparameters


def assert_import_gives_back_and_reexports_bitwise(exp, out, params, trainer, family: str):
    """Importing the export `out` of `exp`'s checkpoint (`params`, `trainer`) gives back its
    parameters, and exporting those writes the same tensors, bit for bit."""
    arch = architecture.architecture_of(exp.run_config().model)
    imported = hf_format.read_params(out, arch, trainer.abstract_state["params"])
    original = {key(p): np.asarray(v)
                for p, v in jax.tree_util.tree_leaves_with_path(jax.device_get(params))}
    assert imported.keys() == original.keys()
    for name, value in original.items():
        if name.endswith("/scale"):
            # Stored as an offset s from 1, exported as the multiplier 1 + s (float32):
            # the import gives back that multiplier bit for bit, though not the low bits
            # of s that 1 + s rounded away.
            np.testing.assert_array_equal(1 + imported[name], 1 + value, err_msg=name)
        else:
            np.testing.assert_array_equal(imported[name], value, err_msg=name)

    # Exporting the imported parameters writes the same tensors, bit for bit.
    canonical = architecture.canonical_weights(checkpoints.nested_params(imported), arch)
    tensors = (hf_format.gpt2_tensors if family == "gpt" else hf_format.llama_tensors)(
        arch, canonical)
    written = load_file(str(out / "model.safetensors"))
    assert tensors.keys() == written.keys()
    for name, value in written.items():
        np.testing.assert_array_equal(np.asarray(tensors[name], np.float32), value,
                                      err_msg=name)


def write_config(directory, **config):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


# What an unknown model_type is told.
KNOWN = ("Paxloom imports gpt2 (GPT2LMHeadModel), llama (LlamaForCausalLM), mixtral "
         "(MixtralForCausalLM), qwen2_moe (Qwen2MoeForCausalLM), qwen3 (Qwen3ForCausalLM), "
         "qwen3_moe (Qwen3MoeForCausalLM) models")
LLAMA = dict(model_type="llama", num_hidden_layers=2, hidden_size=64, intermediate_size=128,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
             max_position_embeddings=32, rms_norm_eps=1e-5)
GPT2 = dict(model_type="gpt2", n_layer=2, n_embd=64, n_head=4, vocab_size=256,
            n_positions=32)


@pytest.mark.parametrize("config,message", [
    # linear, llama3 and yarn scaling map (tests/test_rope.py); what changes with the
    # sequence's length or needs per-frequency lists does not
    (dict(LLAMA, rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
     'config.json rope_scaling={"rope_type": "dynamic", "factor": 2.0}: Paxloom scales RoPE '
     "as rope_type linear, llama3, yarn, or not at all"),
    (dict(LLAMA, rope_parameters={"rope_type": "longrope", "rope_theta": 5e5, "factor": 8.0}),
     'config.json rope_parameters={"rope_type": "longrope", "rope_theta": 500000.0, '
     '"factor": 8.0}: Paxloom scales RoPE as rope_type linear, llama3, yarn, or not at all'),
    (dict(LLAMA, attention_bias=True),
     "config.json attention_bias=true: Paxloom's Llama has no attention biases"),
    (dict(LLAMA, hidden_act="gelu"),
     'config.json hidden_act="gelu": Paxloom\'s Llama gates its feed-forward with SiLU'),
    (dict(GPT2, tie_word_embeddings=False),
     "config.json tie_word_embeddings=false: Paxloom's GPT ties its output layer to the "
     "input embedding (an untied GPT-2 has no Paxloom model)"),
    (dict(GPT2, scale_attn_by_inverse_layer_idx=True),
     "config.json scale_attn_by_inverse_layer_idx=true: Paxloom's attention does not scale "
     "by the layer index"),
    (dict(GPT2, activation_function="relu"),
     'config.json activation_function="relu": Paxloom\'s GPT uses the tanh-approximated '
     "GELU (gelu_new)"),
    (dict(LLAMA, model_type="mistral"),
     'config.json model_type="mistral": ' + KNOWN),
], ids=["dynamic_rope", "longrope", "attention_bias", "llama_gelu", "untied_gpt2",
        "layer_idx_scaling", "gpt2_relu", "mistral"])
def test_what_paxloom_does_not_model_is_refused_in_one_line(config, message, tmp_path):
    with pytest.raises(UserError) as error:
        hf_format.hyperparameters(write_config(tmp_path, **config))
    assert str(error.value) == message


def test_older_rope_keys_and_transformers_defaults_map(tmp_path):
    # transformers 4.x's keys; no head_dim and no num_key_value_heads: their defaults
    config = {k: v for k, v in LLAMA.items() if k != "num_key_value_heads"}
    path = write_config(tmp_path, **config, rope_theta=5e5, rope_scaling=None)
    assert hf_format.hyperparameters(path) == ("llama", dict(
        NUM_LAYERS=2, MODEL_DIMS=64, HIDDEN_DIMS=128, NUM_HEADS=4, DIMS_PER_HEAD=16,
        VOCAB_SIZE=256, MAX_SEQ_LEN=32, LAYERNORM_EPSILON=1e-5, NUM_KV_HEADS=4,
        ROPE_MAX_WAVELENGTH=5e5))
    assert hf_format.hyperparameters(write_config(tmp_path / "gpt", **GPT2)) == ("gpt", dict(
        NUM_LAYERS=2, MODEL_DIMS=64, HIDDEN_DIMS=256, NUM_HEADS=4, DIMS_PER_HEAD=16,
        VOCAB_SIZE=256, MAX_SEQ_LEN=32, LAYERNORM_EPSILON=1e-5))


def test_a_missing_or_incomplete_directory_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"^\S+/nope: no such directory; pass a Hugging Face "
                                        r"model directory \(config.json \+ model.safetensors"):
        hf_format.hyperparameters(tmp_path / "nope")
    with pytest.raises(UserError, match=r"has no config.json: not a Hugging Face model"):
        hf_format.hyperparameters(tmp_path)
    assert not hf_format.is_hf_model_dir(write_config(tmp_path / "no_weights", **LLAMA))


def test_check_config_names_the_value_that_differs_and_the_flag(tmp_path):
    path = write_config(tmp_path, **LLAMA)
    model = LlamaBase(**{**hf_format.hyperparameters(path)[1], "NUM_LAYERS": 3})
    with pytest.raises(UserError) as error:
        hf_format.check_config(path, architecture.architecture_of(model.model_template()))
    assert str(error.value) == ("config.json num_hidden_layers=2 differs from the run's model "
                                "(NUM_LAYERS=3); set --fdl.NUM_LAYERS=2")
    gpt = experiments.BaseExperiment(**TINY)
    with pytest.raises(UserError, match=r'^config.json model_type="llama": the run\'s model is '
                                        r"a GPT \(GPT2LMHeadModel\); run a Llama, e.g. "
                                        r"--fdl_config=experiments.llama.LlamaBase"):
        hf_format.check_config(path, architecture.architecture_of(gpt.model_template()))


def test_import_hf_prints_the_flags_of_the_matching_run(tmp_path):
    path = write_config(tmp_path, **LLAMA, rope_parameters={"rope_type": "default",
                                                            "rope_theta": 500.0})
    (path / "model.safetensors").touch()  # the flags come from config.json alone
    (path / "tokenizer.json").touch()
    assert import_hf.run_flags(str(path)) == [
        "--fdl_config=experiments.llama.LlamaBase", "--fdl.NUM_LAYERS=2",
        "--fdl.MODEL_DIMS=64", "--fdl.HIDDEN_DIMS=128", "--fdl.NUM_HEADS=4",
        "--fdl.DIMS_PER_HEAD=16", "--fdl.VOCAB_SIZE=256", "--fdl.MAX_SEQ_LEN=32",
        "--fdl.LAYERNORM_EPSILON=1e-05", "--fdl.NUM_KV_HEADS=2",
        "--fdl.ROPE_MAX_WAVELENGTH=500.0", f"--fdl.CHECKPOINT_RESTORE_PATH={path}",
        f"--vocab_path={path / 'tokenizer.json'}"]


@pytest.mark.process
def test_import_hf_of_a_bad_directory_is_one_line_and_exit_2(tmp_path):
    path = write_config(tmp_path, **LLAMA, attention_bias=True)
    out = run_python("-m", "paxloom.tools.import_hf", f"--hf_dir={path}",
                     env=session_env(JAX_PLATFORMS="cpu"), timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr == ("error: config.json attention_bias=true: Paxloom's Llama has no "
                          "attention biases\n")
    assert out.stdout == ""
