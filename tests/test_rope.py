"""RoPE scaling (layers/rope.py) for a context longer than training's: its frequencies are
transformers' own (an independent implementation) for linear, Llama 3.1's and YaRN's rules;
without scaling the layer computes praxis's bits; a Llama 3.x model from transformers,
imported, computes transformers' logits beyond its original context (and does not when the
scaling is dropped), decodes as transformers' generate does with the cache, and exports
back bit for bit; what no Paxloom model computes is refused in one line."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from praxis import base_layer, pax_fiddle
from praxis.layers import embedding_softmax
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from experiments.llama import LlamaBase
from layers import architecture, rope
from paxloom.core.errors import UserError
from paxloom.runner.state import hf_format
from paxloom.tools import import_hf
from tests.support.inference import (
    assert_greedy_continuations_equal_transformers,
)
from tests.support.processes import assert_one_line, run_main
from tests.support.tiny import TINY
from tests.test_import_hf import (
    LLAMA,
    ON_8_DEVICES,
    assert_export_round_trips,
    llama,
    paxloom,
    paxloom_logits,
    placed,
    write_config,
)

pytestmark = pytest.mark.usefixtures("compilation_cache")

THETA = 500.0  # as tests/test_import_hf.py's models: heads of 16 span all three llama3 bands
ORIGINAL = 32  # the "original" context: the tests run 64-128 tokens, beyond it
LONG = 128  # the models' max_position_embeddings
# Each scaling as Hugging Face's rope_parameters; with THETA and heads of 16, llama3 keeps
# pair 0, mixes pairs 1 and 2 and divides the rest, and YaRN ramps over pairs 0 to 3.
SCALED = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL,
             "beta_fast": 32.0, "beta_slow": 1.0},
}


def scaling(parameters: dict) -> rope.RopeScaling:
    return rope.RopeScaling(kind=parameters["rope_type"], **{
        k: v for k, v in parameters.items() if k not in ("rope_type", "rope_theta")})


@pytest.mark.parametrize("name,head_dim,theta,parameters", [
    ("none", 16, THETA, {"rope_type": "default"}),
    ("linear", 16, THETA, SCALED["linear"]),
    ("llama3", 16, THETA, SCALED["llama3"]),
    ("yarn", 16, THETA, SCALED["yarn"]),
    # the published models' own: Llama 3.1 8B, and Qwen2.5's YaRN for 128k
    ("llama3", 128, 5e5, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    ("yarn", 128, 1e6, {"rope_type": "yarn", "factor": 4.0,
                        "original_max_position_embeddings": 32768}),
], ids=["none", "linear", "llama3", "yarn", "llama3.1_8b", "qwen2.5_yarn"])
def test_the_frequencies_are_transformers(name, head_dim, theta, parameters):
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=head_dim,
                         max_position_embeddings=4 * 32768,
                         rope_parameters={**parameters, "rope_theta": theta})
    if name == "none":  # transformers' LlamaRotaryEmbedding's own
        want, want_factor = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        want, want_factor = ROPE_INIT_FUNCTIONS[name](config)
    # (RopeScaling's defaults are transformers' YaRN betas, 32 and 1)
    ours = rope.NONE if name == "none" else scaling(parameters)
    timescale, attention_factor = rope.timescales(head_dim, 1.0, theta, ours)
    np.testing.assert_allclose(1 / np.asarray(timescale, np.float64), want.numpy(), rtol=1e-6)
    assert attention_factor == pytest.approx(want_factor, rel=1e-12)
    unscaled, _ = rope.timescales(head_dim, 1.0, theta)
    changed = ~np.isclose(np.asarray(timescale), np.asarray(unscaled), rtol=1e-6)
    assert changed.any() == (name != "none")  # the comparison saw a scaling at work


def test_the_scaled_layer_without_scaling_computes_praxis_bits():
    assert rope.template(THETA) == pax_fiddle.Config(
        embedding_softmax.RotaryPositionalEmbedding, max_timescale=THETA)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8, 3, 16)).astype(np.float32)
    position = rng.integers(0, 300, (2, 8)).astype(np.int32)
    for dtype in (jnp.float32, jnp.bfloat16):
        outputs = []
        for cls in (embedding_softmax.RotaryPositionalEmbedding,
                    rope.ScaledRotaryPositionalEmbedding):
            layer = base_layer.instantiate(pax_fiddle.Config(
                cls, name="rope", embedding_dims=16, max_timescale=THETA, fprop_dtype=dtype))
            outputs.append([
                jax.jit(lambda x, layer=layer: layer.apply({}, x))(x),
                jax.jit(lambda x, p, layer=layer: layer.apply({}, x, p))(x, position),
                jax.jit(lambda x, layer=layer: layer.apply(
                    {}, x, 11, method=layer.extend_step))(x[:, :3]),
            ])
        for praxis_out, ours in zip(*outputs, strict=True):
            assert ours.dtype == praxis_out.dtype == dtype
            np.testing.assert_array_equal(np.asarray(ours, np.float32),
                                          np.asarray(praxis_out, np.float32))


def imported(tmp_path, parameters: dict):
    """A random small LlamaForCausalLM with RoPE `parameters` (max_position_embeddings
    LONG), saved in tmp_path and read into Paxloom: (hf model, arch, model, mesh, abstract
    params, params on the mesh)."""
    hf_model = llama(4, 2, 16, max_position_embeddings=LONG,
                     rope_parameters={**parameters, "rope_theta": THETA})
    hf_model.save_pretrained(tmp_path)
    _, arch, model, mesh, like = paxloom(tmp_path)
    return hf_model, arch, model, mesh, like, placed(
        hf_format.read_params(tmp_path, arch, like), like)


@pytest.mark.parametrize("name", ["llama3", "linear", "yarn"])
def test_an_imported_scaled_llama_computes_transformers_logits_beyond_its_context(
        name, tmp_path):
    hf_model, arch, model, mesh, like, params = imported(tmp_path, SCALED[name])
    assert arch.rope_scaling == scaling(SCALED[name])
    ids = np.random.default_rng(0).integers(0, 256, (8, LONG))  # 4x the original context
    with torch.no_grad():
        want = hf_model(torch.tensor(ids)).logits.numpy()
    got = paxloom_logits(model, mesh, params, ids)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if name != "llama3":
        return
    # The comparison sees the scaling: the same weights in the unscaled model are far off.
    _, _, unscaled, _, _ = paxloom(tmp_path, ROPE_SCALING_TYPE="none")
    ignored = paxloom_logits(unscaled, mesh, params, ids)
    assert np.max(np.abs(ignored - want)) > 0.1


def test_cached_greedy_decoding_of_an_imported_llama3_continues_as_transformers(tmp_path):
    hf_model, arch, _, mesh, like, params = imported(tmp_path, SCALED["llama3"])
    hf_model.generation_config.eos_token_id = None  # as eos_id=None: every step is a token
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 256, n).tolist() for n in (50, 23, 41)]  # 50 + 12 > ORIGINAL
    assert_greedy_continuations_equal_transformers(hf_model, arch, mesh, like, params,
                                                   prompts, steps=12, max_seq_len=LONG)


@pytest.mark.parametrize("name", ["llama3", "yarn"])
def test_export_then_import_of_a_scaled_llama_is_bitwise(name, tmp_path):
    hyperparameters = {"ROPE_SCALING_TYPE": name, "ROPE_MAX_WAVELENGTH": THETA,
                       "ROPE_ORIGINAL_MAX_POSITION": ORIGINAL,
                       "ROPE_SCALING_FACTOR": SCALED[name]["factor"]}
    exp = LlamaBase(**{**TINY, **ON_8_DEVICES, "DIMS_PER_HEAD": 16, **hyperparameters})
    # transformers computes praxis's logits over MAX_SEQ_LEN=64, twice the original context
    out, family, back = assert_export_round_trips(
        exp, tmp_path, sequences=(list(range(3, 3 + exp.MAX_SEQ_LEN)), [300, 2, 45, 7]))
    config = json.loads((out / "config.json").read_text())
    assert config["rope_parameters"] == {**SCALED[name], "rope_theta": THETA}
    assert family == "llama"
    assert hyperparameters.items() <= back.items()


def test_configs_map_onto_the_hyperparameters_and_the_flags(tmp_path):
    # Llama 3.1's config.json as transformers 4 wrote it: rope_theta beside rope_scaling
    llama31 = write_config(tmp_path / "llama31", **LLAMA, rope_theta=5e5, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192})
    (llama31 / "model.safetensors").touch()
    flags = import_hf.run_flags(str(llama31))
    assert flags[flags.index("--fdl.ROPE_MAX_WAVELENGTH=500000.0"):-1] == [
        "--fdl.ROPE_MAX_WAVELENGTH=500000.0", "--fdl.ROPE_SCALING_TYPE='llama3'",
        "--fdl.ROPE_SCALING_FACTOR=8.0", "--fdl.ROPE_LOW_FREQ_FACTOR=1.0",
        "--fdl.ROPE_HIGH_FREQ_FACTOR=4.0", "--fdl.ROPE_ORIGINAL_MAX_POSITION=8192"]

    def rope_hyperparameters(**config):
        _, values = hf_format.hyperparameters(write_config(tmp_path / "x", **{**LLAMA, **config}))
        return {k: v for k, v in values.items() if k.startswith("ROPE_")}

    # "type" (the old key), and linear's one parameter
    assert rope_hyperparameters(rope_scaling={"type": "linear", "factor": 2}) == dict(
        ROPE_MAX_WAVELENGTH=10000.0, ROPE_SCALING_TYPE="linear", ROPE_SCALING_FACTOR=2.0)
    # YaRN as Qwen2.5 publishes it: transformers' betas (32, 1) where the config has none;
    # no factor: the ratio of the contexts; no original context: the model's
    assert rope_hyperparameters(rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
        "original_max_position_embeddings": 8}) == dict(
        ROPE_MAX_WAVELENGTH=1e6, ROPE_SCALING_TYPE="yarn", ROPE_SCALING_FACTOR=4.0,
        ROPE_ORIGINAL_MAX_POSITION=8, ROPE_BETA_FAST=32.0, ROPE_BETA_SLOW=1.0)
    assert rope_hyperparameters(rope_parameters={
        "rope_type": "yarn", "factor": None, "original_max_position_embeddings": 8},
    )["ROPE_SCALING_FACTOR"] == 32 / 8
    assert rope_hyperparameters(rope_parameters={"rope_type": "yarn", "factor": 2.0})[
        "ROPE_ORIGINAL_MAX_POSITION"] == 32


def test_a_run_whose_scaling_differs_from_the_checkpoints_is_one_line(tmp_path):
    scaled = write_config(tmp_path / "scaled", **LLAMA, rope_parameters={
        **SCALED["yarn"], "rope_theta": THETA})
    values = hf_format.hyperparameters(scaled)[1]

    def check(path, **overrides):
        model = LlamaBase(**{**values, **overrides}).model_template()
        hf_format.check_config(path, architecture.architecture_of(model))

    check(scaled)
    with pytest.raises(UserError) as error:
        check(scaled, ROPE_SCALING_TYPE="none")
    assert str(error.value) == ('config.json rope_parameters.rope_type="yarn" differs from the '
                                "run's model (ROPE_SCALING_TYPE='none'); set "
                                "--fdl.ROPE_SCALING_TYPE='yarn'")
    with pytest.raises(UserError, match=r"rope_parameters.beta_fast=32.0 differs from the "
                                        r"run's model \(ROPE_BETA_FAST=16.0\)"):
        check(scaled, ROPE_BETA_FAST=16.0)
    plain = write_config(tmp_path / "plain", **LLAMA, rope_theta=THETA)
    with pytest.raises(UserError) as error:
        check(plain, ROPE_SCALING_TYPE="llama3")
    assert str(error.value) == ("config.json has no RoPE scaling, the run's model has "
                                "ROPE_SCALING_TYPE='llama3'; set --fdl.ROPE_SCALING_TYPE='none'")


@pytest.mark.parametrize("rope_parameters,message", [
    ({"rope_type": "default", "partial_rotary_factor": 0.5},
     'config.json rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5}: '
     "Paxloom's RoPE rotates the whole head (partial_rotary_factor 1)"),
    ({"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.5},
     "config.json rope_parameters.attention_factor=1.5: Paxloom's YaRN derives its attention "
     "factor from factor alone (0.1 ln factor + 1)"),
    ({"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.707},
     "config.json rope_parameters.mscale_all_dim=0.707: Paxloom's YaRN derives its attention "
     "factor from factor alone (0.1 ln factor + 1)"),
    ({"rope_type": "yarn", "factor": 32.0, "truncate": False},
     "config.json rope_parameters.truncate=false: Paxloom's YaRN ramps between whole pairs "
     "of dimensions (truncate true)"),
    ({"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0},
     "config.json rope_parameters has no factor: cannot scale RoPE"),
    ({"rope_type": "linear", "factor": "8"},
     'config.json rope_parameters.factor="8": expected a number'),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8.5},
     "config.json rope_parameters.original_max_position_embeddings=8.5: expected a whole "
     "number of positions"),
], ids=["partial", "attention_factor", "mscale", "truncate", "no_factor", "text_factor",
        "fractional_context"])
def test_scalings_paxloom_does_not_compute_are_refused_in_one_line(
        rope_parameters, message, tmp_path):
    with pytest.raises(UserError) as error:
        hf_format.hyperparameters(write_config(tmp_path, **LLAMA,
                                               rope_parameters=rope_parameters))
    assert str(error.value) == message


@pytest.mark.parametrize("overrides,message", [
    (dict(ROPE_SCALING_TYPE="dynamic"),
     "--fdl.ROPE_SCALING_TYPE='dynamic' is not one of none, linear, llama3, yarn"),
    (dict(ROPE_SCALING_FACTOR=0.0), "ROPE_SCALING_FACTOR=0.0 must be positive"),
    (dict(ROPE_ORIGINAL_MAX_POSITION=0), "ROPE_ORIGINAL_MAX_POSITION=0 must be positive"),
    (dict(ROPE_LOW_FREQ_FACTOR=4.0, ROPE_HIGH_FREQ_FACTOR=4.0),
     "ROPE_LOW_FREQ_FACTOR=4.0 must be below ROPE_HIGH_FREQ_FACTOR=4.0"),
    (dict(ROPE_BETA_FAST=1.0), "ROPE_BETA_SLOW=1.0 must be below ROPE_BETA_FAST=1.0"),
])
def test_bad_scaling_hyperparameters_are_one_line(overrides, message):
    with pytest.raises(UserError) as error:
        LlamaBase(**overrides)
    assert str(error.value).startswith(message)


@pytest.mark.process
def test_the_choices_are_the_layers_scalings_and_main_exits_2(tmp_path):
    assert LlamaBase.CHOICES["ROPE_SCALING_TYPE"] == rope.SCALINGS
    out = run_main("--fdl_config=experiments.LlamaTiny", "--fdl.ROPE_SCALING_FACTOR=-1.0",
                   f"--job_log_dir={tmp_path / 'job'}")
    assert_one_line(out, "ROPE_SCALING_FACTOR=-1.0 must be positive")
