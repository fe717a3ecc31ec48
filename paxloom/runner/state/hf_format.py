"""Hugging Face `transformers` checkpoints, both ways: the names, configs and tensor layouts
of GPT2LMHeadModel (the GPT family, layers/gpt.py) and of the Llama family's classes
(layers/llama.py): LlamaForCausalLM, and with a mixture of experts (layers/moe.py)
MixtralForCausalLM or Qwen2MoeForCausalLM, which share Llama's names for everything
but the feed-forward; with QK-norm (USE_QK_NORM, layers/qk_norm.py) Qwen3ForCausalLM,
or with a mixture Qwen3MoeForCausalLM, Llama's names plus q_norm and k_norm.

Export (paxloom/tools/export_hf.py): `check_representable`, then `gpt2_config`/`llama_config` and
`gpt2_tensors`/`llama_tensors` from layers/architecture.py's canonical weights. A run that
started from a Hugging Face model records `origin` (its config.json's ORIGIN_KEYS,
paxloom/launch/record.py), and `with_origin` gives those entries back in the export where
the run left what they describe as it was (the context, the RoPE's spelling, EOS and pad).

Import (CHECKPOINT_RESTORE_PATH, paxloom/runner/state/initial_weights.py; paxloom/tools/import_hf.py):
`is_hf_model_dir` recognises a directory that `save_pretrained` wrote; `hyperparameters`
maps its config.json to Paxloom's hyperparameters and refuses, in one line naming the
key, anything Paxloom does not model; `check_config` names the first value that differs
from a run's model; `read_params` reads the safetensors (one file, or shards with an
index) tensor by tensor into the run's parameter layout, through
layers/architecture.py's `praxis_params`, the inverse of `canonical_weights`.

Both directions translate the same conventions: Conv1D [in, out] and Linear [out, in]
weights, GPT-2's combined q | k | v, praxis's query scale folded into the query weights
where it differs from the target's 1/sqrt(head dim) (`query_fold`; with QK-norm into
the query norm's scale, since the norm would undo it on the weights), norm scales as
multipliers (praxis stores offsets from 1), experts as one Linear each (save_pretrained's
layout; transformers 5's fused gate_up_proj is read too).

RoPE scaling maps both ways between Hugging Face's `rope_parameters` (or the older
`rope_scaling`) and the Llama family's ROPE_SCALING_* hyperparameters (layers/rope.py
computes "linear", "llama3" and "yarn" as transformers does); what changes with the
sequence ("dynamic"), needs per-frequency lists ("longrope") or rotates part of a head
(partial_rotary_factor) is refused, as are YaRN's attention-factor overrides.

Hugging Face adds one load-balancing loss over all mixture layers' tokens
(router_aux_loss_coef), Paxloom one per mixture layer (LOAD_BALANCING_WEIGHT): the
coefficient maps divided by the number of mixture layers.
"""

import contextlib
import json
import os
from collections.abc import Iterator
from typing import NoReturn

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy: safetensors' numpy reader needs it)
import numpy as np
from safetensors import safe_open

from layers import rope
from layers.architecture import Architecture, WeightMismatch, praxis_params
from paxloom.core.errors import UserError
from paxloom.runner.state.checkpoints import flat_params

GPT2 = "GPT2LMHeadModel"
LLAMA = "LlamaForCausalLM"
MIXTRAL = "MixtralForCausalLM"
QWEN2_MOE = "Qwen2MoeForCausalLM"
QWEN3 = "Qwen3ForCausalLM"
QWEN3_MOE = "Qwen3MoeForCausalLM"
# config.json model_type -> the class whose names the checkpoint uses
CLASSES = {"gpt2": GPT2, "llama": LLAMA, "mixtral": MIXTRAL, "qwen2_moe": QWEN2_MOE,
           "qwen3": QWEN3, "qwen3_moe": QWEN3_MOE}
_MIXTURES = (MIXTRAL, QWEN2_MOE, QWEN3_MOE)
_QK_NORMED = (QWEN3, QWEN3_MOE)  # the classes with q_norm and k_norm
# Where each mixture class keeps its experts: the layer's module, then the names of each
# expert's gate, up and down projections (torch Linear, [out, in]).
_EXPERT_NAMES = {MIXTRAL: ("block_sparse_moe", "w1", "w3", "w2"),
                 QWEN2_MOE: ("mlp", "gate_proj", "up_proj", "down_proj"),
                 QWEN3_MOE: ("mlp", "gate_proj", "up_proj", "down_proj")}
_SHARED_EXPERT = (("gate_proj", "shared_gate"), ("up_proj", "shared_up"),
                  ("down_proj", "shared_down"))
# Paxloom activation name -> transformers' ACT2FN name.
HF_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "silu": "silu", "relu": "relu"}
# transformers' names of the tanh-approximated GELU, the one Paxloom's GPT uses: the same
# expression, differently implemented.
_TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
# A RoPE scaling's parameters (layers/rope.py's RopeScaling fields, which are
# Hugging Face's rope_parameters keys) -> the hyperparameters that set them.
_ROPE_HYPERPARAMETERS = {
    "factor": "ROPE_SCALING_FACTOR", "low_freq_factor": "ROPE_LOW_FREQ_FACTOR",
    "high_freq_factor": "ROPE_HIGH_FREQ_FACTOR",
    "original_max_position_embeddings": "ROPE_ORIGINAL_MAX_POSITION",
    "beta_fast": "ROPE_BETA_FAST", "beta_slow": "ROPE_BETA_SLOW"}
_WHY_WINDOW = "Paxloom's attention sees the whole context (no sliding window)"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"


def target(arch: Architecture) -> str:
    """The transformers class a model exports to: learned positions make a GPT-2, rotary
    ones a Llama; a mixture of experts a Mixtral, or a Qwen2-MoE with a shared expert;
    QK-norm a Qwen3, or with a mixture of experts a Qwen3-MoE."""
    if arch.positions == "learned":
        return GPT2
    if arch.qk_norm is not None:
        return QWEN3 if arch.experts is None else QWEN3_MOE
    if arch.experts is None:
        return LLAMA
    return QWEN2_MOE if arch.experts.shared_hidden_dims else MIXTRAL


def moe_interval(arch: Architecture) -> int | None:
    """N when the mixture layers are the last of every N (MOE_LAYER_INTERVAL, Qwen's
    decoder_sparse_step); None without a mixture or when they follow no such pattern."""
    if not arch.moe_layers:
        return None
    n = arch.num_layers // len(arch.moe_layers)
    every = tuple(i for i in range(arch.num_layers) if (i + 1) % n == 0)
    return n if every == arch.moe_layers else None


def check_representable(arch: Architecture, target: str, importing: bool = False) -> None:
    """UserError naming the first thing `target` cannot express exactly (when exporting),
    or that a `target` checkpoint cannot give the run's model (when importing)."""
    norm = "layer_norm" if target == GPT2 else "rms_norm"
    norms = [arch.attention_norm, arch.mlp_norm, arch.final_norm, arch.qk_norm]
    problems = [
        (arch.qk_norm is not None and target not in _QK_NORMED,
         f"{target} does not normalise queries and keys (QK-norm)"),
        (arch.final_norm is None, "the model has no final norm"),
        (any(n is not None and n.kind != norm for n in norms),
         f"{target} normalises with {norm.replace('_', ' ')} everywhere"),
        (len({n.epsilon for n in norms if n is not None}) > 1,
         f"{target} has one norm epsilon, and the model's norms differ"),
        (arch.embedding_scale != 1.0, f"the embedding is scaled by {arch.embedding_scale:g}"),
        (arch.unembed_bias, f"{target}'s output layer has no bias"),
        (arch.activation not in HF_ACTIVATIONS, f"activation {arch.activation}"),
    ]
    if target == GPT2:
        problems += [
            (not arch.tied_embedding, "GPT2LMHeadModel ties its output layer to the embedding"),
            (arch.num_kv_heads != arch.num_heads, "GPT-2 has no grouped-query attention"),
            (arch.num_heads * arch.dims_per_head != arch.model_dims,
             f"GPT-2's heads span the model width (NUM_HEADS x DIMS_PER_HEAD = "
             f"{arch.num_heads * arch.dims_per_head}, MODEL_DIMS = {arch.model_dims})"),
            (arch.gated_mlp, "GPT-2's feed-forward is not gated"),
        ]
    else:
        problems += [
            (not arch.gated_mlp, "Llama's feed-forward is gated"),
            (arch.rope_min_timescale != 1.0,
             f"Llama's RoPE has no minimum timescale ({arch.rope_min_timescale:g})"),
        ]
    if target == MIXTRAL:
        problems += [
            (arch.attention_bias or arch.mlp_bias, "Mixtral has no biases"),
            (len(arch.moe_layers) != arch.num_layers,
             "every Mixtral layer is a mixture of experts (MOE_LAYER_INTERVAL=1)"),
            (not arch.experts.renormalize,
             "Mixtral renormalises its top-k router weights (MOE_RENORMALIZE=True)"),
        ]
    if target == QWEN2_MOE:
        problems += [
            (arch.attention_bias or arch.mlp_bias, "Qwen2-MoE's only biases are q, k and v's"),
            (not arch.experts.gate_shared_expert,
             "Qwen2-MoE gates its shared expert (MOE_SHARED_EXPERT_GATE=True)"),
        ]
    if target in _QK_NORMED:
        problems.append((arch.mlp_bias, f"{target}'s feed-forward has no biases"))
    if target == QWEN3_MOE:
        problems.append((arch.experts.shared_hidden_dims > 0, "Qwen3-MoE has no shared expert"))
    if target in (QWEN2_MOE, QWEN3_MOE):
        problems.append((moe_interval(arch) is None,
                         f"{target}'s mixture layers are the last of every N "
                         f"(decoder_sparse_step)"))
    action = f"import {target} exactly into the run's model" if importing else (
        f"export to {target} exactly")
    for failed, what in problems:
        if failed:
            raise UserError(f"cannot {action}: {what}")


# ----- export: configs and tensors ----------------------------------------------------


def gpt2_config(arch: Architecture) -> dict:
    return {
        "model_type": "gpt2",
        "vocab_size": arch.vocab_size,
        "n_positions": arch.max_positions,
        "n_embd": arch.model_dims,
        "n_layer": arch.num_layers,
        "n_head": arch.num_heads,
        "n_inner": arch.hidden_dims,
        "activation_function": HF_ACTIVATIONS[arch.activation],
        "layer_norm_epsilon": arch.final_norm.epsilon,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
    }


def llama_config(arch: Architecture, max_seq_len: int) -> dict:
    """The config of the Llama family's class `target(arch)`."""
    config = {
        "model_type": "llama",
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.model_dims,
        "intermediate_size": arch.hidden_dims,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_dim": arch.dims_per_head,
        "hidden_act": HF_ACTIVATIONS[arch.activation],
        "max_position_embeddings": max_seq_len,
        "rms_norm_eps": arch.final_norm.epsilon,
        "rope_parameters": rope_parameters(arch),
        "attention_bias": arch.attention_bias,
        "attention_dropout": 0.0,
        "mlp_bias": arch.mlp_bias,
        "tie_word_embeddings": arch.tied_embedding,
    }
    kind = target(arch)
    if kind == LLAMA:
        return config
    del config["mlp_bias"]  # Llama's alone
    if kind != MIXTRAL:  # the Qwen classes' switch; Mixtral's is sliding_window
        config["use_sliding_window"] = False
    if kind == QWEN3:
        config["model_type"] = "qwen3"
        return config
    experts = arch.experts
    config.update(
        num_experts_per_tok=experts.per_token,
        # one loss over every mixture layer's tokens, where Paxloom adds one per layer
        router_aux_loss_coef=experts.load_balancing_weight * len(arch.moe_layers))
    if kind == MIXTRAL:
        del config["attention_bias"]  # not a Mixtral key
        config.update(model_type="mixtral", intermediate_size=experts.hidden_dims,
                      num_local_experts=experts.num_experts, sliding_window=None,
                      router_jitter_noise=0.0)
        return config
    # Qwen2-MoE and Qwen3-MoE: a mixture in the last of every decoder_sparse_step layers
    config.update(moe_intermediate_size=experts.hidden_dims,
                  num_experts=experts.num_experts, norm_topk_prob=experts.renormalize,
                  decoder_sparse_step=moe_interval(arch), mlp_only_layers=[])
    if kind == QWEN3_MOE:
        config["model_type"] = "qwen3_moe"
        return config
    # transformers before 5 gives Qwen2-MoE q, k and v biases whatever the config says:
    # qkv_bias, with zero biases (llama_tensors), reads the same in every version.
    del config["attention_bias"]  # not a Qwen2-MoE key
    config.update(model_type="qwen2_moe",
                  shared_expert_intermediate_size=experts.shared_hidden_dims, qkv_bias=True)
    return config


def rope_parameters(arch: Architecture) -> dict:
    """A rotary model's `rope_parameters`: its base, and its scaling's type and parameters."""
    scaling = arch.rope_scaling
    return {"rope_type": "default" if scaling.kind == "none" else scaling.kind,
            "rope_theta": arch.rope_max_timescale,
            **{name: getattr(scaling, name) for name in rope.PARAMETERS[scaling.kind]}}


# config.json keys that the weights do not fix and an export would otherwise derive from the
# run (its training length, its tokenizer): a run started from a Hugging Face model records
# them (`origin`), and its export gives them back (`with_origin`).
_ORIGIN_ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters",
                     "original_max_position_embeddings")
ORIGIN_KEYS = ("model_type", "max_position_embeddings", *_ORIGIN_ROPE_KEYS, "bos_token_id",
               "eos_token_id", "pad_token_id")


def origin(path) -> dict:
    """The Hugging Face model directory `path` as a run that starts from it records it: its
    absolute path and config.json's ORIGIN_KEYS."""
    config = _read_config(path)
    return {"hf_dir": os.path.abspath(os.fspath(path)),
            "config": {key: config[key] for key in ORIGIN_KEYS if key in config}}


def with_origin(config: dict, origin: dict | None, arch: Architecture) -> dict:
    """An export's config.json `config` (its special token ids set from the run) with the
    entries of the model the run started from (`origin`, as `origin` gives it; None: the
    run trained from scratch, `config` as it is) wherever the run kept what they describe:

    - max_position_embeddings: the imported model's context, or the run's MAX_SEQ_LEN where
      that is longer (a fine-tune's rows are often shorter than the model's context);
    - RoPE: the imported keys as the checkpoint spelt them (rope_scaling and rope_theta, or
      rope_parameters), when the run's RoPE is the same (the import refuses another; a run
      started from that run's checkpoint may change it);
    - eos_token_id: the imported one (a list in an instruct model) when it holds the run's;
    - pad_token_id: the imported one (training pads with weight 0, whatever the id).

    bos_token_id stays the run's: the token its documents started with (ADD_BOS)."""
    if not origin:
        return config
    imported, out = origin.get("config") or {}, dict(config)
    if target(arch) != GPT2:  # a GPT-2's n_positions is its weights' (learned positions)
        if isinstance(imported.get("max_position_embeddings"), int):
            out["max_position_embeddings"] = max(imported["max_position_embeddings"],
                                                 config["max_position_embeddings"])
        rope_keys = [key for key in _ORIGIN_ROPE_KEYS if key in imported]
        if rope_keys and _same_rope(imported, arch):
            out.pop("rope_parameters", None)
            out.update({key: imported[key] for key in rope_keys})
    eos, kept = config.get("eos_token_id"), imported.get("eos_token_id")
    if eos is not None and (kept == eos or (isinstance(kept, list) and eos in kept)):
        out["eos_token_id"] = kept
    out["pad_token_id"] = imported.get("pad_token_id")
    return out


def _same_rope(imported: dict, arch: Architecture) -> bool:
    """Whether the RoPE of config.json entries `imported` is the model `arch`'s."""
    try:
        fields = {name: value for name, _, value in _rope_fields(imported)}
    except UserError:
        return False
    fields.setdefault("ROPE_SCALING_TYPE", "none")
    return all(_arch_value(arch, name) == value for name, value in fields.items())


def query_fold(arch: Architecture) -> float:
    """Every target scales queries by 1/sqrt(head dim); praxis may use another factor
    (model_dims // num_heads): the ratio goes into the query weights and bias."""
    return arch.query_scale / arch.dims_per_head ** -0.5


def _query_folds(arch: Architecture) -> tuple[float, float]:
    """(factor of the query weights and bias, factor of the query norm's scale) in the
    target's tensors. With QK-norm, `query_fold` goes into the norm's scale: the norm
    would undo it on the weights (RoPE, being linear, commutes with it)."""
    fold = query_fold(arch)
    return (1.0, fold) if arch.qk_norm is not None else (fold, 1.0)


def _bias(layer: dict, name: str, shape) -> np.ndarray:
    """A bias the model lacks is zero (GPT-2 always has them)."""
    return layer[f"{name}_bias"] if f"{name}_bias" in layer else np.zeros(shape, np.float32)


def _norm_bias(norm: dict, dims: int) -> np.ndarray:
    return norm["bias"] if "bias" in norm else np.zeros(dims, np.float32)


def gpt2_tensors(arch: Architecture, weights: dict) -> dict:
    """GPT2LMHeadModel's tensors from canonical weights (layers/architecture.py)."""
    d, width = arch.model_dims, arch.num_heads * arch.dims_per_head
    fold = query_fold(arch)
    tensors = {"transformer.wte.weight": weights["embed"],  # lm_head is tied to it
               "transformer.wpe.weight": weights["positions"],
               "transformer.ln_f.weight": weights["final_norm"]["scale"],
               "transformer.ln_f.bias": _norm_bias(weights["final_norm"], d)}
    for i, layer in enumerate(weights["layers"]):
        prefix = f"transformer.h.{i}."
        # Conv1D weights are [in, out]; c_attn's output is q | k | v, each head after head.
        qkv_w = [layer[n].reshape(d, width) * (fold if n == "q" else 1) for n in "qkv"]
        qkv_b = [_bias(layer, n, (arch.num_heads, arch.dims_per_head)).reshape(width)
                 * (fold if n == "q" else 1) for n in "qkv"]
        tensors.update({
            prefix + "ln_1.weight": layer["attention_norm"]["scale"],
            prefix + "ln_1.bias": _norm_bias(layer["attention_norm"], d),
            prefix + "attn.c_attn.weight": np.concatenate(qkv_w, axis=1),
            prefix + "attn.c_attn.bias": np.concatenate(qkv_b),
            # praxis's output projection is [D, N, H]; Conv1D wants [N*H, D].
            prefix + "attn.c_proj.weight": layer["o"].transpose(1, 2, 0).reshape(width, d),
            prefix + "attn.c_proj.bias": _bias(layer, "o", (d,)),
            prefix + "ln_2.weight": layer["mlp_norm"]["scale"],
            prefix + "ln_2.bias": _norm_bias(layer["mlp_norm"], d),
            prefix + "mlp.c_fc.weight": layer["up"],
            prefix + "mlp.c_fc.bias": _bias(layer, "up", (arch.hidden_dims,)),
            prefix + "mlp.c_proj.weight": layer["down"],
            prefix + "mlp.c_proj.bias": _bias(layer, "down", (d,)),
        })
    return tensors


def llama_tensors(arch: Architecture, weights: dict) -> dict:
    """The tensors of the Llama family's class `target(arch)` (LlamaForCausalLM,
    MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM) from
    canonical weights (layers/architecture.py)."""
    d = arch.model_dims
    fold, norm_fold = _query_folds(arch)
    kind = target(arch)
    tensors = {"model.embed_tokens.weight": weights["embed"],
               "model.norm.weight": weights["final_norm"]["scale"]}
    if not arch.tied_embedding:
        tensors["lm_head.weight"] = weights["unembed"].T  # torch Linear: [out, in]
    for i, layer in enumerate(weights["layers"]):
        prefix = f"model.layers.{i}."
        tensors[prefix + "input_layernorm.weight"] = layer["attention_norm"]["scale"]
        tensors[prefix + "post_attention_layernorm.weight"] = layer["mlp_norm"]["scale"]
        for name in "qkv":  # [D, heads, H] -> Linear [heads * H, D], heads in order
            w = layer[name].reshape(d, -1).T * (fold if name == "q" else 1)
            tensors[prefix + f"self_attn.{name}_proj.weight"] = w
            if arch.attention_bias:
                tensors[prefix + f"self_attn.{name}_proj.bias"] = (
                    layer[f"{name}_bias"].reshape(-1) * (fold if name == "q" else 1))
        if kind in _QK_NORMED:
            tensors[prefix + "self_attn.q_norm.weight"] = layer["q_norm"]["scale"] * norm_fold
            tensors[prefix + "self_attn.k_norm.weight"] = layer["k_norm"]["scale"]
        if kind == QWEN2_MOE:  # qkv_bias (llama_config): zeros
            for name, w in (("q", layer["q"]), ("k", layer["k"]), ("v", layer["v"])):
                tensors[prefix + f"self_attn.{name}_proj.bias"] = np.zeros(
                    w.shape[1] * w.shape[2], np.float32)
        tensors[prefix + "self_attn.o_proj.weight"] = layer["o"].reshape(d, -1)  # [D, N*H]
        if arch.attention_bias:
            tensors[prefix + "self_attn.o_proj.bias"] = layer["o_bias"]
        if i in arch.moe_layers:
            tensors.update(_expert_tensors(layer, prefix, kind))
            continue
        for hf_name, name in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
            tensors[prefix + f"mlp.{hf_name}.weight"] = layer[name].T
            if arch.mlp_bias:
                tensors[prefix + f"mlp.{hf_name}.bias"] = layer[f"{name}_bias"]
    return tensors


def _expert_tensors(layer: dict, prefix: str, kind: str) -> dict:
    """A mixture layer's tensors in class `kind`, one Linear per expert as save_pretrained
    writes them."""
    module, gate, up, down = _EXPERT_NAMES[kind]
    p = f"{prefix}{module}."
    tensors = {p + "gate.weight": layer["router"].T}  # router [D, E] -> Linear [E, D]
    for e in range(layer["router"].shape[1]):
        for hf_name, name in ((gate, "expert_gate"), (up, "expert_up"), (down, "expert_down")):
            tensors[f"{p}experts.{e}.{hf_name}.weight"] = layer[name][e].T
    if "shared_gate" in layer:
        for hf_name, name in _SHARED_EXPERT:
            tensors[f"{p}shared_expert.{hf_name}.weight"] = layer[name].T
        tensors[p + "shared_expert_gate.weight"] = layer["shared_expert_gate"].T  # [1, D]
    return tensors


# ----- import: config.json -> hyperparameters --------------------------------------------


def is_hf_model_dir(path) -> bool:
    """A directory as `save_pretrained` writes it: config.json and safetensors weights, in
    one file or in shards listed by an index."""
    path = os.fspath(path)
    return (os.path.isfile(os.path.join(path, CONFIG))
            and any(os.path.isfile(os.path.join(path, name)) for name in (WEIGHTS, WEIGHTS_INDEX)))


def _read_config(path) -> dict:
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise UserError(f"{path}: no such directory; pass a Hugging Face model directory "
                        f"(config.json + model.safetensors, as save_pretrained writes it)")
    file = os.path.join(path, CONFIG)
    try:
        with open(file) as f:
            config = json.load(f)
    except FileNotFoundError:
        raise UserError(f"{path} has no {CONFIG}: not a Hugging Face model directory") from None
    except (OSError, ValueError) as error:
        raise UserError(f"{file} is not a JSON config ({type(error).__name__}: "
                        f"{' '.join(str(error).split())})") from None
    if not isinstance(config, dict):
        raise UserError(f"{file} is not a JSON object")
    return config


def _show(value) -> str:
    """A config.json value as the file spells it, on one line."""
    return json.dumps(value)


def _refuse(key: str, value, why: str) -> NoReturn:
    raise UserError(f"{CONFIG} {key}={_show(value)}: {why}")


def _required(config: dict, key: str):
    if config.get(key) is None:
        raise UserError(f"{CONFIG} has no {key}: cannot size the model")
    return config[key]


def _gpt2_fields(config: dict) -> list[tuple[str, str, object]]:
    """(Paxloom hyperparameter, config.json key, value) of a GPT-2 config."""
    rules = [
        ("activation_function", "gelu_new", lambda v: v in _TANH_GELUS,
         "Paxloom's GPT uses the tanh-approximated GELU (gelu_new)"),
        ("scale_attn_weights", True, lambda v: v is True,
         "Paxloom's attention always scales queries by 1/sqrt(head dim)"),
        ("scale_attn_by_inverse_layer_idx", False, lambda v: v is False,
         "Paxloom's attention does not scale by the layer index"),
        ("tie_word_embeddings", True, lambda v: v is True,
         "Paxloom's GPT ties its output layer to the input embedding (an untied GPT-2 "
         "has no Paxloom model)"),
        ("add_cross_attention", False, lambda v: v is False,
         "Paxloom's decoder has no cross-attention"),
    ]
    for key, default, ok, why in rules:
        value = config.get(key, default)
        if not ok(value):
            _refuse(key, value, why)
    width, heads = _required(config, "n_embd"), _required(config, "n_head")
    if width % heads:
        _refuse("n_head", heads, f"GPT-2's heads must split n_embd={width} evenly")
    inner = config.get("n_inner")
    return [
        ("NUM_LAYERS", "n_layer", _required(config, "n_layer")),
        ("MODEL_DIMS", "n_embd", width),
        # transformers' default feed-forward width is 4 x n_embd
        ("HIDDEN_DIMS", "n_inner", 4 * width if inner is None else inner),
        ("NUM_HEADS", "n_head", heads),
        ("DIMS_PER_HEAD", "n_embd/n_head", width // heads),
        ("VOCAB_SIZE", "vocab_size", _required(config, "vocab_size")),
        ("MAX_SEQ_LEN", "n_positions", _required(config, "n_positions")),
        ("LAYERNORM_EPSILON", "layer_norm_epsilon", float(config.get("layer_norm_epsilon", 1e-5))),
    ]


def _rope_fields(config: dict) -> list[tuple[str, str, object]]:
    """(Paxloom hyperparameter, config.json key, value) of a Llama config's RoPE: its base,
    and its scaling when it has one (layers/rope.py), from transformers 5.x's
    `rope_parameters` or the older `rope_theta` and `rope_scaling`; refuses a partial RoPE
    and any scaling, or scaling key, that layers/rope.py does not compute."""
    for key in ("rope_scaling", "rope_parameters"):
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            _refuse(key, value, "expected an object")
        if value.get("partial_rotary_factor", 1.0) != 1.0:
            _refuse(key, value, "Paxloom's RoPE rotates the whole head (partial_rotary_factor 1)")
    # transformers reads rope_scaling when a config has it, else rope_parameters; the base
    # from there, else from rope_theta
    key = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
    scaling = config.get(key) or {}
    if scaling.get("rope_theta") is not None:
        fields = [("ROPE_MAX_WAVELENGTH", f"{key}.rope_theta", float(scaling["rope_theta"]))]
    else:
        fields = [("ROPE_MAX_WAVELENGTH", "rope_theta", float(config.get("rope_theta", 10000.0)))]
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return fields
    if kind not in rope.SCALINGS:
        _refuse(key, scaling, f"Paxloom scales RoPE as rope_type "
                f"{', '.join(k for k in rope.SCALINGS if k != 'none')}, or not at all")
    if kind == "yarn":
        _check_yarn(key, scaling)
    fields.append(("ROPE_SCALING_TYPE", f"{key}.rope_type", kind))
    for name in rope.PARAMETERS[kind]:
        fields.append((_ROPE_HYPERPARAMETERS[name],
                       *_rope_parameter(config, key, scaling, kind, name)))
    return fields


def _check_yarn(key: str, scaling: dict) -> None:
    """Refuse what transformers' YaRN reads besides layers/rope.py's parameters."""
    why = "Paxloom's YaRN derives its attention factor from factor alone (0.1 ln factor + 1)"
    if scaling.get("attention_factor") is not None:
        _refuse(f"{key}.attention_factor", scaling["attention_factor"], why)
    if scaling.get("mscale") and scaling.get("mscale_all_dim"):  # as transformers reads them
        _refuse(f"{key}.mscale_all_dim", scaling["mscale_all_dim"], why)
    if not scaling.get("truncate", True):
        _refuse(f"{key}.truncate", scaling["truncate"],
                "Paxloom's YaRN ramps between whole pairs of dimensions (truncate true)")


def _rope_parameter(config: dict, key: str, scaling: dict, kind: str,
                    name: str) -> tuple[str, object]:
    """(config.json key, value) of the parameter `name` of a RoPE scaling `kind`, with
    transformers' defaults and precedence."""
    if name == "original_max_position_embeddings":
        # a top-level value wins (Phi-3's configs), then the scaling's, then the model's
        # context, as transformers' standardize_rope_params reads them
        for where, source in ((name, config), (f"{key}.{name}", scaling)):
            if source.get(name) is not None:
                return where, _whole(where, source[name])
        return "max_position_embeddings", _required(config, "max_position_embeddings")
    value = scaling.get(name)
    if name in ("beta_fast", "beta_slow"):  # transformers: `or 32`, `or 1`
        return f"{key}.{name}", _number(f"{key}.{name}", value or getattr(rope.NONE, name))
    if value is None and kind == "yarn":  # the factor: transformers' ratio of the contexts
        _, original = _rope_parameter(config, key, scaling, kind,
                                      "original_max_position_embeddings")
        return "max_position_embeddings", _required(config, "max_position_embeddings") / original
    if value is None:
        raise UserError(f"{CONFIG} {key} has no {name}: cannot scale RoPE")
    return f"{key}.{name}", _number(f"{key}.{name}", value)


def _number(key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _refuse(key, value, "expected a number")
    return float(value)


def _whole(key: str, value) -> int:
    if not _number(key, value).is_integer():
        _refuse(key, value, "expected a whole number of positions")
    return int(value)


def _llama_fields(config: dict, model_type: str) -> list[tuple[str, str, object]]:
    """(Paxloom hyperparameter, config.json key, value) of a config of the Llama family's
    class of `model_type`. Keys in parentheses name what the class itself fixes."""
    rules = [
        ("hidden_act", "silu", lambda v: v == "silu",
         "Paxloom's Llama gates its feed-forward with SiLU"),
        ("attention_bias", False, lambda v: v is False,
         "Paxloom's Llama has no attention biases"),
        ("mlp_bias", False, lambda v: v is False, "Paxloom's Llama has no feed-forward biases"),
        # the Qwen classes' switch (Mixtral's is sliding_window, _moe_fields)
        ("use_sliding_window", False, lambda v: v is False, _WHY_WINDOW),
    ]
    for key, default, ok, why in rules:
        value = config.get(key, default)
        if not ok(value):
            _refuse(key, value, why)
    width, heads = _required(config, "hidden_size"), _required(config, "num_attention_heads")
    # transformers' defaults: a head of hidden_size / heads (Qwen3Config's: 128), as many
    # key/value heads as heads
    head_dim = config.get("head_dim", 128 if model_type == "qwen3" else None)
    kv_heads = config.get("num_key_value_heads")
    qk_norm = [("USE_QK_NORM", f"({model_type}: q_norm, k_norm)", True)
               ] if CLASSES[model_type] in _QK_NORMED else []
    return [
        ("NUM_LAYERS", "num_hidden_layers", _required(config, "num_hidden_layers")),
        ("MODEL_DIMS", "hidden_size", width),
        ("HIDDEN_DIMS", "intermediate_size", _required(config, "intermediate_size")),
        ("NUM_HEADS", "num_attention_heads", heads),
        ("DIMS_PER_HEAD", "head_dim", width // heads if head_dim is None else head_dim),
        ("VOCAB_SIZE", "vocab_size", _required(config, "vocab_size")),
        ("MAX_SEQ_LEN", "max_position_embeddings", _required(config, "max_position_embeddings")),
        ("LAYERNORM_EPSILON", "rms_norm_eps", float(config.get("rms_norm_eps", 1e-6))),
        ("NUM_KV_HEADS", "num_key_value_heads", heads if kv_heads is None else kv_heads),
        *_rope_fields(config),
        *qk_norm,
    ]


def _moe_fields(config: dict, model_type: str) -> list[tuple[str, str, object]]:
    """(Paxloom hyperparameter, config.json key, value) of a Mixtral, Qwen2-MoE or
    Qwen3-MoE mixture of experts (the Llama fields describe the rest). Keys in parentheses
    name what the class itself fixes."""
    layers = _required(config, "num_hidden_layers")
    if model_type == "mixtral":
        rules = [("sliding_window", None, lambda v: v is None, _WHY_WINDOW),
                 ("router_jitter_noise", 0.0, lambda v: not v,
                  "Paxloom's router has no jitter noise")]
        experts = ("num_local_experts", _required(config, "num_local_experts"))
        per_token = config.get("num_experts_per_tok", 2)  # transformers' defaults
        hidden = ("intermediate_size", _required(config, "intermediate_size"))
        interval, renormalize = ("(mixtral: every layer)", 1), ("(mixtral: renormalised)", True)
        shared, gated = ("(mixtral: no shared expert)", 0), ("(mixtral: no shared expert)", False)
    else:  # Qwen2-MoE and Qwen3-MoE, with transformers' defaults
        rules = []
        # transformers 5 writes Qwen3-MoE's num_experts as num_local_experts, its alias
        key = "num_local_experts" if config.get("num_local_experts") is not None else "num_experts"
        experts = (key, _required(config, key))
        per_token = config.get("num_experts_per_tok", 4 if model_type == "qwen2_moe" else 8)
        hidden = ("moe_intermediate_size", _required(config, "moe_intermediate_size"))
        step = config.get("decoder_sparse_step", 1)
        if not isinstance(step, int) or step < 1 or layers % step:
            _refuse("decoder_sparse_step", step, f"Paxloom's mixture layers are the last of "
                    f"every MOE_LAYER_INTERVAL, which must divide num_hidden_layers={layers}")
        only = config.get("mlp_only_layers") or []
        if any(not isinstance(i, int) or (i + 1) % step == 0 for i in only):
            _refuse("mlp_only_layers", only, f"Paxloom's mixture layers are exactly the last "
                    f"of every decoder_sparse_step={step} (MOE_LAYER_INTERVAL)")
        interval = ("decoder_sparse_step", step)
        renormalize = ("norm_topk_prob", bool(config.get("norm_topk_prob", False)))
        if model_type == "qwen3_moe":
            none = "(qwen3_moe: no shared expert)"
            shared, gated = (none, 0), (none, False)
        else:
            width = _required(config, "shared_expert_intermediate_size")
            shared = ("shared_expert_intermediate_size", width)
            gated = ("(qwen2_moe: gated)", width > 0)
    for key, default, ok, why in rules:
        value = config.get(key, default)
        if not ok(value):
            _refuse(key, value, why)
    if not experts[1]:
        _refuse(experts[0], experts[1], "a mixture of experts needs experts")
    coefficient = float(config.get("router_aux_loss_coef", 0.001))
    return [
        ("NUM_EXPERTS", *experts),
        ("NUM_EXPERTS_PER_TOKEN", "num_experts_per_tok", per_token),
        ("MOE_HIDDEN_DIMS", *hidden),
        ("MOE_LAYER_INTERVAL", *interval),
        ("MOE_RENORMALIZE", *renormalize),
        ("MOE_SHARED_HIDDEN_DIMS", *shared),
        ("MOE_SHARED_EXPERT_GATE", *gated),
        # one loss over all mixture layers' tokens there, one per mixture layer here
        ("LOAD_BALANCING_WEIGHT", "router_aux_loss_coef", coefficient / (layers // interval[1])),
    ]


def _fields(path) -> tuple[str, list[tuple[str, str, object]], dict]:
    """(family, fields, config) of the directory's config.json."""
    config = _read_config(path)
    model_type = config.get("model_type")
    if model_type == "gpt2":
        return "gpt", _gpt2_fields(config), config
    if model_type not in CLASSES:
        known = ", ".join(f"{name} ({cls})" for name, cls in CLASSES.items())
        _refuse("model_type", model_type, f"Paxloom imports {known} models")
    fields = _llama_fields(config, model_type)
    if CLASSES[model_type] in _MIXTURES:
        fields += _moe_fields(config, model_type)
    if model_type == "mixtral":  # intermediate_size is the experts' (MOE_HIDDEN_DIMS)
        fields = [field for field in fields if field[0] != "HIDDEN_DIMS"]
    return "llama", fields, config


def hyperparameters(path) -> tuple[str, dict]:
    """(family, hyperparameters) of the Hugging Face model directory `path`: "gpt" (the
    GPT of experiments.base.BaseExperiment) or "llama" (experiments.llama.LlamaBase), and
    the sizes that make its parameters the checkpoint's. UserError (one line, naming the
    config.json key) for what Paxloom does not model."""
    family, fields, _ = _fields(path)
    return family, {name: value for name, _, value in fields}


def _arch_value(arch: Architecture, name: str):
    """The hyperparameter `name` as the run's model has it; None: not in its weights or
    maths (a rotary model's MAX_SEQ_LEN is only its training context)."""
    experts = arch.experts
    every_layer = len(arch.moe_layers) == arch.num_layers  # no dense feed-forward
    return {
        "NUM_LAYERS": arch.num_layers, "MODEL_DIMS": arch.model_dims,
        "HIDDEN_DIMS": None if every_layer else arch.hidden_dims, "NUM_HEADS": arch.num_heads,
        "DIMS_PER_HEAD": arch.dims_per_head, "VOCAB_SIZE": arch.vocab_size,
        "MAX_SEQ_LEN": arch.max_positions,
        "LAYERNORM_EPSILON": arch.final_norm.epsilon if arch.final_norm else None,
        "NUM_KV_HEADS": arch.num_kv_heads, "ROPE_MAX_WAVELENGTH": arch.rope_max_timescale,
        "ROPE_SCALING_TYPE": arch.rope_scaling.kind,
        **{hyperparameter: getattr(arch.rope_scaling, field)
           for field, hyperparameter in _ROPE_HYPERPARAMETERS.items()},
        "NUM_EXPERTS": experts.num_experts if experts else 0,
        "NUM_EXPERTS_PER_TOKEN": experts and experts.per_token,
        "MOE_HIDDEN_DIMS": experts and experts.hidden_dims,
        "MOE_LAYER_INTERVAL": moe_interval(arch),
        "MOE_RENORMALIZE": experts and experts.renormalize,
        "MOE_SHARED_HIDDEN_DIMS": experts and experts.shared_hidden_dims,
        "MOE_SHARED_EXPERT_GATE": experts and experts.gate_shared_expert,
        "LOAD_BALANCING_WEIGHT": None,  # training only: a run may choose its own
        "USE_QK_NORM": arch.qk_norm is not None,
    }[name]


# Llama-family hyperparameters whose field a config has only away from their default
# (the default, what the config then lacks).
_UNSTATED = {"ROPE_SCALING_TYPE": ("none", "RoPE scaling"),
             "USE_QK_NORM": (False, "query and key norms (q_norm, k_norm: a Qwen3's)")}


def check_config(path, arch: Architecture) -> None:
    """UserError (one line) naming the first config.json value of `path` that differs from
    the run's model `arch`, and the --fdl flag that makes the run match it."""
    family, fields, config = _fields(path)
    model_family = "gpt" if target(arch) == GPT2 else "llama"
    if family != model_family:
        name = {"gpt": "GPT", "llama": "Llama"}
        experiment = {"gpt": "experiments.base.BaseExperiment",
                      "llama": "experiments.llama.LlamaBase"}[family]
        _refuse("model_type", config.get("model_type"),
                f"the run's model is a {name[model_family]} ({target(arch)}); run a "
                f"{name[family]}, e.g. --fdl_config={experiment} (python -m paxloom.tools.import_hf "
                f"--hf_dir={os.fspath(path)} prints every flag)")
    for name, key, value in fields:
        have = _arch_value(arch, name)
        if have is not None and have != value:
            raise UserError(f"{CONFIG} {key}={_show(value)} differs from the run's model "
                            f"({name}={have!r}); set --fdl.{name}={value!r}")
    names = {name for name, _, _ in fields}
    for name, (default, absent) in _UNSTATED.items():  # what a config states only when on
        have = _arch_value(arch, name)
        if family == "llama" and name not in names and have != default:
            raise UserError(f"{CONFIG} has no {absent}, the run's model has {name}={have!r}; "
                            f"set --fdl.{name}={default!r}")
    if family == "llama" and arch.tied_embedding and not config.get("tie_word_embeddings"):
        _refuse("tie_word_embeddings", config.get("tie_word_embeddings", False),
                "the run's model ties its output layer to the embedding")
    if CLASSES[config["model_type"]] in (LLAMA, QWEN3) and arch.experts is not None:
        _refuse("model_type", config["model_type"], f"the run's model is a mixture of "
                f"experts ({target(arch)}); set --fdl.NUM_EXPERTS=0")
    check_representable(arch, target(arch), importing=True)


# ----- import: safetensors -> parameters ---------------------------------------------------


class _Tensors:
    """The checkpoint's tensors by name, read one at a time as float32 (a bfloat16 or
    float16 checkpoint is widened: parameters are float32), from one file or the shards an
    index names."""

    def __init__(self, path: str, stack: contextlib.ExitStack):
        self.path, self._stack, self._open = path, stack, {}
        index = os.path.join(path, WEIGHTS_INDEX)
        if os.path.isfile(os.path.join(path, WEIGHTS)):
            self._file_of = None
        elif os.path.isfile(index):
            try:
                with open(index) as f:
                    self._file_of = json.load(f)["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as error:
                raise UserError(f"{index} is not a safetensors index ({type(error).__name__}: "
                                f"{error})") from None
        else:
            raise UserError(f"{path} has neither {WEIGHTS} nor {WEIGHTS_INDEX}: not a "
                            f"safetensors checkpoint (save it with save_pretrained)")

    def _file(self, name: str) -> str | None:
        return WEIGHTS if self._file_of is None else self._file_of.get(name)

    def _reader(self, file: str):
        if file not in self._open:
            full = os.path.join(self.path, file)
            try:
                self._open[file] = self._stack.enter_context(safe_open(full, framework="numpy"))
            except Exception as error:  # safetensors raises its own error types, and OSError
                raise UserError(f"{full}: cannot read safetensors ({type(error).__name__}: "
                                f"{' '.join(str(error).split())})") from None
        return self._open[file]

    def has(self, name: str) -> bool:
        file = self._file(name)
        return file is not None and name in self._reader(file).keys()

    def get(self, name: str, shape: tuple) -> np.ndarray:
        file = self._file(name)
        if file is None or name not in self._reader(file).keys():
            raise UserError(f"{self.path}: the checkpoint has no tensor {name}; is it a "
                            f"complete model that save_pretrained wrote?")
        reader = self._reader(file)
        found = tuple(reader.get_slice(name).get_shape())
        if found != tuple(shape):
            raise UserError(f"{os.path.join(self.path, file)}: {name} has shape {found}, "
                            f"config.json makes it {tuple(shape)}")
        return np.asarray(reader.get_tensor(name), np.float32)


def _gpt2_canonical(tensors: _Tensors, arch: Architecture) -> dict:
    """Canonical weights (layers/architecture.py) of a GPT-2 checkpoint; layers read lazily."""
    d, n, h, f = arch.model_dims, arch.num_heads, arch.dims_per_head, arch.hidden_dims
    width, fold = n * h, query_fold(arch)
    # GPT2Model checkpoints (the hub's own "gpt2") name tensors without "transformer."
    prefix = "transformer." if tensors.has("transformer.wte.weight") else ""

    def get(name, shape):
        return tensors.get(prefix + name, shape)

    def norm(name):
        return {"scale": get(f"{name}.weight", (d,)), "bias": get(f"{name}.bias", (d,))}

    def layers() -> Iterator[dict]:
        for i in range(arch.num_layers):
            p = f"h.{i}."
            # c_attn: Conv1D [D, q | k | v], each head after head
            q, k, v = np.split(get(p + "attn.c_attn.weight", (d, 3 * width)), 3, axis=1)
            qb, kb, vb = np.split(get(p + "attn.c_attn.bias", (3 * width,)), 3)
            yield {
                "attention_norm": norm(p + "ln_1"),
                "q": q.reshape(d, n, h) / fold, "k": k.reshape(d, n, h),
                "v": v.reshape(d, n, h),
                "q_bias": qb.reshape(n, h) / fold, "k_bias": kb.reshape(n, h),
                "v_bias": vb.reshape(n, h),
                # c_proj: Conv1D [N*H, D] -> praxis's [D, N, H]
                "o": get(p + "attn.c_proj.weight", (width, d)).reshape(n, h, d).transpose(2, 0, 1),
                "o_bias": get(p + "attn.c_proj.bias", (d,)),
                "mlp_norm": norm(p + "ln_2"),
                "up": get(p + "mlp.c_fc.weight", (d, f)),
                "up_bias": get(p + "mlp.c_fc.bias", (f,)),
                "down": get(p + "mlp.c_proj.weight", (f, d)),
                "down_bias": get(p + "mlp.c_proj.bias", (d,)),
            }

    return {"embed": get("wte.weight", (arch.vocab_size, d)),
            "positions": get("wpe.weight", (arch.max_positions, d)),
            "final_norm": norm("ln_f"), "layers": layers()}


def _llama_canonical(tensors: _Tensors, arch: Architecture, kind: str = LLAMA) -> dict:
    """Canonical weights of a checkpoint of the Llama family's class `kind`; layers read
    lazily. A checkpoint with a tied output layer (no lm_head.weight) gives its embedding
    to both ends. q, k and v biases (Qwen2-MoE's) are read when present: praxis_params
    accepts them only as zeros, which the model's lack of biases computes."""
    d, h, f = arch.model_dims, arch.dims_per_head, arch.hidden_dims
    heads = {"q": arch.num_heads, "k": arch.num_kv_heads, "v": arch.num_kv_heads}
    fold, norm_fold = _query_folds(arch)

    def layers() -> Iterator[dict]:
        for i in range(arch.num_layers):
            p = f"model.layers.{i}."
            layer = {
                "attention_norm": {"scale": tensors.get(p + "input_layernorm.weight", (d,))},
                "mlp_norm": {"scale": tensors.get(p + "post_attention_layernorm.weight", (d,))},
                # o_proj: Linear [D, N*H], already praxis's [D, N, H] once reshaped
                "o": tensors.get(p + "self_attn.o_proj.weight", (d, arch.num_heads * h)
                                 ).reshape(d, arch.num_heads, h),
            }
            for name, count in heads.items():  # Linear [heads*H, D] -> [D, heads, H]
                w = tensors.get(p + f"self_attn.{name}_proj.weight", (count * h, d))
                layer[name] = w.T.reshape(d, count, h) / (fold if name == "q" else 1)
                if tensors.has(p + f"self_attn.{name}_proj.bias"):
                    b = tensors.get(p + f"self_attn.{name}_proj.bias", (count * h,))
                    layer[f"{name}_bias"] = b.reshape(count, h) / (fold if name == "q" else 1)
            if arch.qk_norm is not None:  # check_config: the checkpoint is a Qwen3's
                layer["q_norm"] = {
                    "scale": tensors.get(p + "self_attn.q_norm.weight", (h,)) / norm_fold}
                layer["k_norm"] = {"scale": tensors.get(p + "self_attn.k_norm.weight", (h,))}
            if i in arch.moe_layers:
                layer.update(_expert_canonical(tensors, p, arch, kind))
                yield layer
                continue
            for hf_name, name in (("gate_proj", "gate"), ("up_proj", "up")):
                layer[name] = tensors.get(p + f"mlp.{hf_name}.weight", (f, d)).T
            layer["down"] = tensors.get(p + "mlp.down_proj.weight", (d, f)).T
            yield layer

    embed = tensors.get("model.embed_tokens.weight", (arch.vocab_size, d))
    unembed = (tensors.get("lm_head.weight", (arch.vocab_size, d)).T
               if tensors.has("lm_head.weight") else embed.T)
    return {"embed": embed, "unembed": unembed,
            "final_norm": {"scale": tensors.get("model.norm.weight", (d,))},
            "layers": layers()}


def _expert_canonical(tensors: _Tensors, prefix: str, arch: Architecture, kind: str) -> dict:
    """A mixture layer's canonical weights (layers/architecture.py: router [D, E],
    expert_* [E, in, out], shared_*) from class `kind`'s tensors: one Linear per expert, or
    transformers 5's fused [E, 2F, D] gate | up and [E, D, F] down (save_pretrained with
    save_original_format=False)."""
    d, f, e = arch.model_dims, arch.experts.hidden_dims, arch.experts.num_experts
    module, gate, up, down = _EXPERT_NAMES[kind]
    if tensors.has(prefix + "mlp.experts.gate_up_proj"):
        module = "mlp"  # transformers 5 renames Mixtral's block_sparse_moe
        gate_up = tensors.get(prefix + "mlp.experts.gate_up_proj", (e, 2 * f, d))
        out = {"expert_gate": gate_up[:, :f].transpose(0, 2, 1),
               "expert_up": gate_up[:, f:].transpose(0, 2, 1),
               "expert_down": tensors.get(prefix + "mlp.experts.down_proj", (e, d, f)
                                          ).transpose(0, 2, 1)}
    else:
        def stacked(name: str, shape: tuple) -> np.ndarray:
            return np.stack([tensors.get(f"{prefix}{module}.experts.{j}.{name}.weight", shape).T
                             for j in range(e)])

        out = {"expert_gate": stacked(gate, (f, d)), "expert_up": stacked(up, (f, d)),
               "expert_down": stacked(down, (d, f))}
    out["router"] = tensors.get(f"{prefix}{module}.gate.weight", (e, d)).T
    shared = arch.experts.shared_hidden_dims
    if shared:
        for hf_name, name in _SHARED_EXPERT:
            shape = (d, shared) if name == "shared_down" else (shared, d)
            out[name] = tensors.get(f"{prefix}mlp.shared_expert.{hf_name}.weight", shape).T
        out["shared_expert_gate"] = tensors.get(prefix + "mlp.shared_expert_gate.weight",
                                                (1, d)).T
    return out


def read_params(path, arch: Architecture, like: dict) -> dict[str, np.ndarray]:
    """The checkpoint's weights as float32 arrays keyed by parameter path
    ("lm/transformer/x_layers_0/self_attention/combined_qkv/w", as checkpoints name them),
    laid out for the model `arch` whose (abstract) parameter tree is `like`: combined or
    separate q/k/v, repeated or per-layer, norm offsets or direct scales, as `like` and
    `arch` have them. `like`'s LoRA adapters are left out: a checkpoint has none."""
    path = os.fspath(path)
    check_config(path, arch)
    kind = CLASSES[_read_config(path)["model_type"]]  # the checkpoint's names
    with contextlib.ExitStack() as stack:
        tensors = _Tensors(path, stack)
        if target(arch) == GPT2:
            canonical = _gpt2_canonical(tensors, arch)
        else:
            canonical = _llama_canonical(tensors, arch, kind)
        try:
            params = praxis_params(canonical, arch, like)
        except WeightMismatch as error:
            raise UserError(f"{path}: the checkpoint does not fit the run's model: "
                            f"{error}") from None
    return flat_params(params)
