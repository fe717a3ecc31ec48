"""Export a checkpoint to a Hugging Face `transformers` model directory.

    python -m tools.export_hf --job_log_dir=runs/tiny-DATE --output=hf/tiny [--step=N]

The GPT family (layers/gpt.py) becomes a `GPT2LMHeadModel`, the Llama family
(layers/llama.py) a `LlamaForCausalLM`; the target follows from the model itself
(learned positions and LayerNorm, or rotary positions and RMSNorm). The directory holds
config.json, model.safetensors (float32, as trained) and, for a model trained on text,
the run's own tokenizer (its graph's `tokenizer` node, the object training encoded with) as
tokenizer files that encode exactly as training did (tools/hf_tokenizer.py): a
SentencePiece model converted, a Hugging Face tokenizer.json copied. Load it with:

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("hf/tiny")
    tokenizer = AutoTokenizer.from_pretrained("hf/tiny")

praxis details are translated, not approximated: norm scales stored as offsets from 1
become the multipliers themselves (layers/architecture.py); q, k, v go to GPT-2's
combined `c_attn` (Conv1D [in, out], q then k then v, heads in order) or Llama's separate
projections; praxis's query scale is folded into the query weights wherever it differs
from the target's 1/sqrt(head dim); praxis's RoPE rotates the two halves of each head as
Llama's rotate_half does, so q and k need no permutation. What a target cannot express
(an embedding scale, a bias on the output layer, an untied GPT output layer, ...) is
refused with one line (exit status 2).

The weights are written with safetensors' numpy API: exporting needs neither torch nor
transformers.
"""

import json
import os
import sys
from pathlib import Path

import jax
import numpy as np
from absl import flags
from safetensors.numpy import save_file

import experiments
from layers.architecture import Architecture, canonical_weights
from runner.core.errors import UserError
from runner.inference import model as inference
from tasks.vocab import Vocabulary

FLAGS = flags.FLAGS
flags.DEFINE_string("job_log_dir", None, "The training run's directory (hyperparameters.json, "
                    "checkpoints/).")
flags.DEFINE_integer("step", None, "Checkpoint step to export; default: the latest.")
flags.DEFINE_string("output", None, "Directory to write (must not exist, or be empty).")
flags.DEFINE_string("vocab_path", None, "SentencePiece model the run was trained with; "
                    "default: $VOCAB_PATH, or the experiment's own (the sample corpus's).")

# Paxloom activation name -> transformers' ACT2FN name.
HF_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "silu": "silu", "relu": "relu"}


def export(job_log_dir: str, output: str, step: int | None = None,
           vocab_path: str | None = None) -> Path:
    """Write the Hugging Face directory `output` from job_log_dir's checkpoint; return it."""
    exp = _experiment(job_log_dir)
    config = exp.run_config(vocab_path=vocab_path)  # the experiment stops here
    arch = inference.describe(config, "export")
    target = "GPT2LMHeadModel" if arch.positions == "learned" else "LlamaForCausalLM"
    _check_representable(arch, target)  # before the (slow) read of the weights
    out = Path(output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--output={output} exists and is not an empty directory; choose "
                        f"another or remove it")
    model = inference.load(config, job_log_dir, what="export",
                           restore_checkpoint_step=step, devices=[_host_device()])
    weights = canonical_weights(jax.device_get(model.params), arch)
    tokenizer = model.tokenizer
    special = {} if tokenizer is None else {"bos_token_id": tokenizer.eos_id,
                                            "eos_token_id": tokenizer.eos_id}
    if getattr(tokenizer, "pad_id", None) is not None:
        special["pad_token_id"] = tokenizer.pad_id
    if target == "GPT2LMHeadModel":
        hf_config, tensors = _gpt2_config(arch), _gpt2_tensors(arch, weights)
    else:
        hf_config = _llama_config(arch, model.max_seq_len)
        tensors = _llama_tensors(arch, weights)
    hf_config.update(special, architectures=[target], dtype="float32")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)  # safetensors makes the file private (0600); shareable like the others
    os.chmod(out / "model.safetensors", 0o666 & ~umask)
    files = ["config.json", "model.safetensors"]
    if tokenizer is not None:
        files += _write_tokenizer(tokenizer, out, model.max_seq_len)
    count = sum(int(np.prod(v.shape)) for v in tensors.values())
    print(f"wrote {target} ({count:,} parameters, step {model.step} of {model.checkpoint}) "
          f"to {out}: {', '.join(files)}")
    return out


def _write_tokenizer(tokenizer, out: Path, max_seq_len: int) -> list[str]:
    """The run's tokenizer as Hugging Face tokenizer files in `out`; their names. A
    SentencePiece model (tasks/vocab.py) is converted; any other tokenizer is a Hugging Face
    one, whose tokenizer.json (`.path`) is copied."""
    from tools import hf_tokenizer

    if isinstance(tokenizer, Vocabulary):
        return hf_tokenizer.write(tokenizer.path, out, max_seq_len)
    return hf_tokenizer.copy(tokenizer.path, out, eos_id=tokenizer.eos_id,
                             model_max_length=max_seq_len,
                             pad_id=getattr(tokenizer, "pad_id", None))


def _host_device():
    """The weights are read into host memory, never onto an accelerator (there may be none
    free, or too little memory)."""
    try:
        return jax.devices("cpu")[0]
    except RuntimeError:  # JAX_PLATFORMS excludes the CPU
        return jax.local_devices()[0]


def _experiment(job_log_dir: str):
    """The run's experiment, from its hyperparameters.json, on one device: the weights are
    read onto the host whatever mesh wrote them."""
    path = os.path.join(job_log_dir, "hyperparameters.json")
    try:
        with open(path) as f:
            record = json.load(f)
        name, hyperparameters = record["experiment"], record["hyperparameters"]
    except FileNotFoundError:
        raise UserError(f"--job_log_dir={job_log_dir} has no hyperparameters.json: not a "
                        f"training run's directory") from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"{path} is not a run record ({type(error).__name__}: {error})") from None
    one_device = {"ICI_MESH_SHAPE": [1, 1, 1], "DCN_MESH_SHAPE": [1, 1, 1]}
    return experiments.resolve(name)(**{**hyperparameters, **one_device})


def _check_representable(arch: Architecture, target: str) -> None:
    """UserError naming the first thing `target` cannot express exactly."""
    norm = "layer_norm" if target == "GPT2LMHeadModel" else "rms_norm"
    norms = [arch.attention_norm, arch.mlp_norm, arch.final_norm]
    problems = [
        (arch.final_norm is None, "the model has no final norm"),
        (any(n is not None and n.kind != norm for n in norms),
         f"{target} normalises with {norm.replace('_', ' ')} everywhere"),
        (len({n.epsilon for n in norms if n is not None}) > 1,
         f"{target} has one norm epsilon, and the model's norms differ"),
        (arch.embedding_scale != 1.0, f"the embedding is scaled by {arch.embedding_scale:g}"),
        (arch.unembed_bias, f"{target}'s output layer has no bias"),
        (arch.activation not in HF_ACTIVATIONS, f"activation {arch.activation}"),
    ]
    if target == "GPT2LMHeadModel":
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
    for failed, what in problems:
        if failed:
            raise UserError(f"cannot export to {target} exactly: {what}")


def _gpt2_config(arch: Architecture) -> dict:
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


def _llama_config(arch: Architecture, max_seq_len: int) -> dict:
    return {
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
        "rope_parameters": {"rope_type": "default", "rope_theta": arch.rope_max_timescale},
        "attention_bias": arch.attention_bias,
        "attention_dropout": 0.0,
        "mlp_bias": arch.mlp_bias,
        "tie_word_embeddings": arch.tied_embedding,
    }


def _query_fold(arch: Architecture) -> float:
    """Both targets scale queries by 1/sqrt(head dim); praxis may use another factor
    (model_dims // num_heads): the ratio goes into the query weights and bias."""
    return arch.query_scale / arch.dims_per_head ** -0.5


def _bias(layer: dict, name: str, shape) -> np.ndarray:
    """A bias the model lacks is zero (GPT-2 always has them)."""
    return layer[f"{name}_bias"] if f"{name}_bias" in layer else np.zeros(shape, np.float32)


def _gpt2_tensors(arch: Architecture, weights: dict) -> dict:
    d, width = arch.model_dims, arch.num_heads * arch.dims_per_head
    fold = _query_fold(arch)
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


def _norm_bias(norm: dict, dims: int) -> np.ndarray:
    return norm["bias"] if "bias" in norm else np.zeros(dims, np.float32)


def _llama_tensors(arch: Architecture, weights: dict) -> dict:
    d = arch.model_dims
    fold = _query_fold(arch)
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
        tensors[prefix + "self_attn.o_proj.weight"] = layer["o"].reshape(d, -1)  # [D, N*H]
        if arch.attention_bias:
            tensors[prefix + "self_attn.o_proj.bias"] = layer["o_bias"]
        for hf_name, name in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
            tensors[prefix + f"mlp.{hf_name}.weight"] = layer[name].T
            if arch.mlp_bias:
                tensors[prefix + f"mlp.{hf_name}.bias"] = layer[f"{name}_bias"]
    return tensors


def main(argv: list[str]) -> None:
    try:
        FLAGS(argv)
    except flags.Error as error:
        raise UserError(str(error)) from None
    for name in ("job_log_dir", "output"):
        if not FLAGS[name].value:
            raise UserError(f"--{name} is required (python -m tools.export_hf "
                            f"--job_log_dir=RUN --output=DIR)")
    export(FLAGS.job_log_dir, FLAGS.output, FLAGS.step,
           FLAGS.vocab_path or os.environ.get("VOCAB_PATH"))


if __name__ == "__main__":
    try:
        main(sys.argv)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
