"""MaxText's settings and what Paxloom calls them: one table (SETTINGS), the vocabulary of a
user who comes from MaxText (its `configs/base.yml` and GPU recipes).

Three readers, so the names never drift apart: the errors about an unknown hyperparameter,
flag, graph field or choice (paxloom/core/errors.py `near_matches`, paxloom/launch/flags.py)
name the Paxloom equivalent of a MaxText spelling in their one line; `python -m
paxloom.tools.from_maxtext` translates a whole MaxText config into an experiment class; and
docs/guides/from-maxtext.md shows the table (`markdown_table()`; tests/test_from_maxtext.py
keeps the page equal to it).

Each setting converts a MaxText value into Paxloom's names: UPPER_CASE for a hyperparameter,
`--name` for a flag of main.py. A setting reads the whole config where its meaning does
(MaxText stretches the learning-rate schedule over `steps`; its mesh axes multiply into one
ICI or DCN shape; -1 fills an axis to the devices left), so translating one setting alone
(an error's hint) and the whole recipe (the tool) give the same values. A value without an
equivalent raises NoEquivalent with the reason.
"""

import ast
import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from paxloom.core import mesh_axes

GPUS_PER_NODE = 8  # what MaxText's -1 fills an ICI axis to, unless told otherwise
FAMILIES = ("llama", "gpt")  # experiments.llama.LlamaBase, experiments.base.BaseExperiment

# The MaxText defaults (its configs/base.yml) that a setting's meaning depends on when the
# recipe does not name them.
DEFAULTS: dict[str, Any] = {
    "steps": 150_001, "learning_rate_schedule_steps": -1, "warmup_steps_fraction": 0.1,
    "ici_fsdp_parallelism": -1, "dcn_data_parallelism": -1, "enable_dropout": True,
    "dropout_rate": 0.0, "num_experts": 1, "capacity_factor": -1.0, "base_num_query_heads": 16,
    "run_name": "", "base_output_directory": "", "skip_first_n_steps_for_profiler": 1,
    "profiler_steps": 5, "profiler": "", "decoder_block": "llama2",
}


class NoEquivalent(Exception):
    """This MaxText value has no Paxloom equivalent; the message says why."""


@dataclasses.dataclass(frozen=True)
class Context:
    """What a conversion reads besides its own value."""

    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the recipe's settings
    family: str = "llama"  # the Paxloom family translated into (FAMILIES)
    gpus_per_node: int = GPUS_PER_NODE
    num_nodes: int = 1

    def get(self, key: str):
        return self.config.get(key, DEFAULTS.get(key))


@dataclasses.dataclass(frozen=True)
class Mapped:
    """Paxloom's values for one MaxText setting: {"PERCORE_BATCH_SIZE": 4} (a hyperparameter),
    {"--vocab_path": "..."} (a flag); empty when Paxloom needs nothing set."""

    values: dict[str, Any]
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Setting:
    """One row of the table."""

    maxtext: str  # the key in MaxText's configs/base.yml
    paxloom: str  # Paxloom's name(s), as the docs table shows them; "none" when there is none
    note: str  # how the value maps, or why nothing does
    convert: Callable[[Any, Context], Mapped] | None = None  # None: no equivalent (`note`)
    target: str | None = None  # the hyperparameter whose values `values` names
    values: Mapping[str, tuple[Any, str]] | None = None  # MaxText value -> (Paxloom's, note)


# ----- conversions ------------------------------------------------------------------------


def _same(*names: str, transform: Callable | None = None, note: str = ""):
    """The value as it is (or transformed) for each of `names`."""
    def convert(value, ctx):
        value = value if transform is None else transform(value, ctx)
        return Mapped({name: value for name in names}, note)
    return convert


def _choice(name: str, table: Mapping[str, tuple[Any, str]], family: Callable | None = None):
    """A MaxText value looked up in `table` (value -> (Paxloom's value or None, note))."""
    def convert(value, ctx):
        key = str(value)
        if key not in table:
            raise NoEquivalent(f"{value!r} is none of MaxText's values that Paxloom maps "
                               f"({', '.join(repr(k) for k in table)})")
        paxloom, note = table[key]
        if paxloom is None:
            raise NoEquivalent(note)
        if family is not None:
            paxloom = family(paxloom, ctx)
        return Mapped({name: paxloom}, note)
    return convert


def _none_unless(accepted: Callable[[Any, Context], bool], reason: str, note: str = ""):
    """Nothing to set when `accepted(value, ctx)` (Paxloom does that already), else none."""
    def convert(value, ctx):
        if not accepted(value, ctx):
            raise NoEquivalent(reason)
        return Mapped({}, note)
    return convert


def _path(name: str, note: str = ""):
    """A path or name; MaxText's "" (unset) sets nothing."""
    def convert(value, ctx):
        return Mapped({name: value} if value not in ("", None) else {}, note)
    return convert


def _schedule(ctx: Context) -> dict[str, int]:
    """MaxText's schedule: linear warmup over warmup_steps_fraction of
    learning_rate_schedule_steps (-1: `steps`), then cosine down to the final fraction at its
    end, as praxis's linear rampup + cosine decay."""
    steps, total = ctx.get("steps"), ctx.get("learning_rate_schedule_steps")
    if total in (None, -1):
        total = steps
    if total in (None, -1):
        raise NoEquivalent("steps and learning_rate_schedule_steps are both -1")
    warmup = int(ctx.get("warmup_steps_fraction") * total)
    return {"LR_COS_WARMUP": warmup, "LR_COS_DECAY_START": warmup, "LR_COS_DECAY_END": total}


def _steps(value, ctx):
    schedule = _schedule(ctx)
    return Mapped({"MAX_STEPS": schedule["LR_COS_DECAY_END"] if value == -1 else value,
                   **schedule})


def _with_schedule(value, ctx):
    return Mapped(_schedule(ctx))


def _job_log_dir(value, ctx):
    run_name = ctx.get("run_name")
    if not run_name:
        return Mapped({}, "no run_name: give --job_log_dir")
    return Mapped({"--job_log_dir": os.path.join(ctx.get("base_output_directory") or "runs",
                                                 run_name)})


# MaxText's mesh axes (its `mesh_axes`) -> Paxloom's (paxloom/core/mesh_axes.py), and why.
MESH_AXES: dict[str, tuple[str | None, str]] = {
    "data": ("replica", "data parallelism: the batch split, the weights replicated"),
    "fsdp": ("data", "FSDP: the weights and the batch split"),
    "fsdp_transpose": (None, "Paxloom has one FSDP axis: multiply it into fsdp"),
    "sequence": ("context", "each sequence split over the context axis (Paxloom's sequence "
                            "axis is context parallelism)"),
    "context": ("context", "context parallelism (CONTEXT_PARALLEL_STRATEGY)"),
    "context_usp_ulysses": (None, "Ulysses' head exchange is not in Paxloom; its context "
                                  "axis gathers or rings the keys and values "
                                  "(CONTEXT_PARALLEL_STRATEGY)"),
    "context_autoregressive": (None, "an axis of MaxText's decoding only"),
    "tensor": ("mdl", "tensor parallelism"),
    "tensor_transpose": (None, "Paxloom has one tensor-parallel axis: multiply it into tensor"),
    "tensor_sequence": (None, "Paxloom has one tensor-parallel axis: multiply it into tensor"),
    "autoregressive": (None, "an axis of MaxText's decoding only"),
    "pipeline": ("stage", "pipeline stages (a four-entry shape; NUM_MICROBATCHES)"),
    "expert": ("data", "Paxloom has no expert axis of its own: the experts split over the data "
                       "(FSDP) axis (EXPERT_AXIS='data'), which this multiplies, and the other "
                       "weights are sharded over it too"),
    "diloco": (None, "DiLoCo's local-update groups are not in Paxloom"),
}


def _mesh_shapes(ctx: Context) -> tuple[list[int], list[int], str]:
    """ICI_MESH_SHAPE and DCN_MESH_SHAPE over Paxloom's five axes, and a note on -1's fill."""
    shapes, notes = {}, []
    for net, total, unit in (("ici", ctx.gpus_per_node, "GPUs a node"),
                             ("dcn", ctx.num_nodes, "nodes")):
        sizes, fill = [1] * len(mesh_axes.MESH_AXIS_NAMES), None
        for axis, (paxloom_axis, _) in MESH_AXES.items():
            size = ctx.get(f"{net}_{axis}_parallelism")
            if paxloom_axis is None or size in (None, 1):
                continue
            index = mesh_axes.MESH_AXIS_NAMES.index(paxloom_axis)
            if size == -1:
                if fill is not None and fill != index:
                    raise NoEquivalent(f"more than one {net}_*_parallelism is -1; MaxText "
                                       f"fills only one")
                fill = index
            elif isinstance(size, int) and not isinstance(size, bool) and size > 1:
                sizes[index] *= size
            else:
                raise NoEquivalent(f"{net}_{axis}_parallelism={size!r}: a size is a positive "
                                   f"integer, or -1 for the rest")
        if fill is not None:
            known = math.prod(sizes)
            left = total // known if total % known == 0 and total >= known else 1
            sizes[fill] *= left
            if left > 1:
                notes.append(f"-1 filled to {total} {unit}")
        shapes[net] = sizes
    ici, dcn = mesh_axes.written_shapes(shapes["ici"], shapes["dcn"])
    return ici, dcn, "; ".join(notes)


def _mesh(net: str, axis: str):
    paxloom_axis, reason = MESH_AXES[axis]

    def convert(value, ctx):
        if value == 1 or (paxloom_axis is None and value == -1):
            return Mapped({}, "1: nothing to split")
        if paxloom_axis is None:
            raise NoEquivalent(reason)
        ici, dcn, note = _mesh_shapes(ctx)
        values = {"ICI_MESH_SHAPE": ici} if net == "ici" else {"DCN_MESH_SHAPE": dcn}
        if axis == "expert" and value not in (1, -1):
            values["EXPERT_AXIS"] = "data"
        return Mapped(values, note)
    return convert


def _mesh_settings() -> list[Setting]:
    out = []
    for net, where in (("ici", "within a node"), ("dcn", "across nodes")):
        shape = "ICI_MESH_SHAPE" if net == "ici" else "DCN_MESH_SHAPE"
        for axis, (paxloom_axis, reason) in MESH_AXES.items():
            out.append(Setting(
                f"{net}_{axis}_parallelism",
                f"`{shape}`, its `{paxloom_axis}` entry" if paxloom_axis else "none",
                f"{reason}, {where}" if paxloom_axis else reason,
                _mesh(net, axis)))
    return out


def _num_experts(value, ctx):
    return Mapped({"NUM_EXPERTS": 0 if value <= 1 else value},
                  "MaxText's 1 is Paxloom's 0: a dense feed-forward" if value <= 1 else "")


def _experts_per_token(value, ctx):
    if ctx.get("num_experts") <= 1:
        return Mapped({}, "a dense model: no routing")
    return Mapped({"NUM_EXPERTS_PER_TOKEN": value})


def _sparse_matmul(value, ctx):
    if value or ctx.get("capacity_factor") <= 0:
        return Mapped({"MOE_BACKEND": "ragged_dot"},
                      "" if value else "dropless: the same result as MaxText's dense matmuls")
    return Mapped({"MOE_BACKEND": "padded"})


def _dropout(value, ctx):
    return Mapped({"DROPOUT_PROB": float(value) if ctx.get("enable_dropout") else 0.0})


def _kv_heads(value, ctx):
    if ctx.family == "llama":
        return Mapped({"NUM_KV_HEADS": value})
    if value == ctx.get("base_num_query_heads"):
        return Mapped({}, "the GPT's attention is multi-head")
    raise NoEquivalent("the GPT's attention is multi-head; grouped-query attention is the "
                       "Llama family's (NUM_KV_HEADS)")


def _activations(value, ctx):
    names = [str(v).lower() for v in (value if isinstance(value, (list, tuple)) else [value])]
    if ctx.family == "llama":
        if names == ["silu", "linear"]:
            return Mapped({}, "the Llama family's feed-forward is SiLU-gated")
        raise NoEquivalent("the Llama family's feed-forward is SiLU-gated (['silu', 'linear'])")
    gated = len(names) == 2 and names[1] == "linear"
    if len(names) != 1 and not gated:
        raise NoEquivalent("the GPT takes one activation, or one gated by a linear projection")
    spelled = {"gelu": "GELU", "relu": "ReLU", "silu": "SiLU", "swish": "SiLU"}
    if names[0] not in spelled:
        raise NoEquivalent(f"{names[0]!r} is not one of {', '.join(spelled)}")
    return Mapped({"ACTIVATION_CLS": spelled[names[0]], "USE_GATED_ACTIVATION": gated})


def _gpt_only(name: str, transform=lambda v: v, llama_default=False, why=""):
    """A GPT architecture name; the Llama family builds its own layers and accepts only the
    value its layers have (`llama_default`)."""
    def convert(value, ctx):
        if ctx.family == "gpt":
            return Mapped({name: transform(value)})
        if bool(value) == llama_default:
            return Mapped({}, why)
        raise NoEquivalent(why)
    return convert


def _trainable_positions(value, ctx):
    if ctx.family == "gpt" and value > 0:
        return Mapped({"TRAINABLE_POSITION_EMB": True, "TRAINABLE_PE_MAX_SEQ_LEN": value})
    if value <= 0:
        return Mapped({}, "no learned position table")
    raise NoEquivalent("the Llama family's positions are rotary")


def _profiler(value, ctx):
    if value == "":
        return Mapped({})
    if value != "xplane":
        raise NoEquivalent("run main.py under Nsight Systems yourself (nsys profile ...)")
    return Mapped({"--profile_start_step": ctx.get("skip_first_n_steps_for_profiler"),
                   "--profile_num_steps": ctx.get("profiler_steps")})


def _with_profiler(name: str):
    def convert(value, ctx):
        if ctx.get("profiler") != "xplane":
            return Mapped({}, "read with profiler=xplane")
        return Mapped({name: value})
    return convert


def _text_field(value, ctx):
    columns = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(columns) != 1:
        raise NoEquivalent("Paxloom reads one text column")
    return Mapped({"TEXT_FIELD": columns[0]})


def _dataset(value, ctx):
    paxloom, note = DATASET_TYPES.get(str(value), (None, ""))
    if paxloom is None:
        raise NoEquivalent(note or f"{value!r} is not one of MaxText's dataset types")
    return Mapped({"DATASET": paxloom, "LAMBADA_EVAL": False}, note)


# MaxText's remat_policy (its decoders.py get_remat_policy) -> the closest praxis policy
# (CHECKPOINT_POLICY), by the activations each keeps for the backward pass.
REMAT_POLICIES: dict[str, tuple[str | None, str]] = {
    "full": ("save_nothing", "everything recomputed in the backward pass"),
    "none": ("save_nothing", "MaxText remats without a policy, as 'full'"),
    "minimal": ("save_dot_with_no_batch_dims", "every projection and feed-forward matmul "
                                               "kept, attention recomputed"),
    "minimal_with_context": ("save_dot_except_logits", "the projections, attention's context "
                                                       "and the feed-forward kept"),
    "minimal_flash": ("save_dot_except_logits", "MaxText's old name of minimal_with_context"),
    "minimal_with_quantization": ("save_dot_with_no_batch_dims", "as minimal; the FP8 "
                                                                 "copies are recomputed"),
    "minimal_with_context_and_quantization": ("save_dot_except_logits", "as "
                                              "minimal_with_context; the FP8 copies are "
                                              "recomputed"),
    "save_dot_with_context_except_mlp": ("save_dot_for_mlperf_200b", "q/k/v, context and "
                                                                     "output projection kept"),
    "save_dot_except_mlpwi": ("save_dot_except_logits_ffn1", "the closest: also keeps "
                                                             "attention's context"),
    "save_dot_except_mlp": ("save_qkv_out_proj_separate", "q/k/v and output projections "
                                                          "kept; save_qkv_out_proj in the GPT, "
                                                          "whose q/k/v is one projection"),
    "save_qkv_proj": ("save_qkv_out_proj_separate", "the closest: no praxis policy keeps q/k/v "
                                                    "alone, this keeps the output projection "
                                                    "too; save_qkv_out_proj in the GPT"),
    "save_out_proj": ("save_out_proj", "the output projection kept"),
    "qkv_proj_offloaded": (None, "praxis's policies keep activations on the device or "
                                 "recompute them, never offload them to the host"),
    "minimal_offloaded": (None, "praxis's policies keep activations on the device or "
                                "recompute them, never offload them to the host"),
    "custom": (None, "per-tensor remat/device/offload choices are not in praxis's policies; "
                     "pick the closest CHECKPOINT_POLICY"),
}


def _remat_family(policy, ctx):
    if ctx.family == "gpt" and policy == "save_qkv_out_proj_separate":
        return "save_qkv_out_proj"  # the GPT's q/k/v is one combined projection
    return policy


# MaxText's attention (its attention_op.py) -> ATTENTION_IMPL (layers/attention.py).
ATTENTION_KERNELS: dict[str, tuple[str | None, str]] = {
    "autoselected": ("auto", "the fastest exact kernel for the device"),
    "dot_product": ("xla", "XLA's dot-product attention: exact, the scores materialised"),
    "flash": ("pallas", "on GPUs MaxText's flash is the Pallas Triton kernel (Paxloom's 'flash' "
                        "is its plain-JAX flash attention)"),
    "cudnn_flash_te": ("cudnn", "cuDNN's fused flash attention, through jax rather than "
                                "Transformer Engine"),
    "cudnn_flash_jax": ("cudnn", "cuDNN's fused flash attention"),
    "paged": (None, "a decoding kernel; Paxloom decodes with its own KV cache"),
}

# MaxText's quantization -> USE_FP8 (layers/fp8.py).
QUANTIZATIONS: dict[str, tuple[bool | None, str]] = {
    "": (False, "bfloat16 matmuls"),
    "fp8": (True, "float8 matmuls with delayed scaling on NVIDIA GPUs"),
    "te_fp8_delayedscaling": (True, "the same delayed scaling, without Transformer Engine"),
    "nanoo_fp8": (None, "AMD's FP8 is not in Paxloom; USE_FP8 is NVIDIA's"),
    "fp8_full": (None, "static-scaling FP8 is not in Paxloom; USE_FP8 scales by history"),
    "int8": (None, "integer quantisation is not in Paxloom; USE_FP8=True is its only one"),
    "int4": (None, "integer quantisation is not in Paxloom; USE_FP8=True is its only one"),
    "intmp": (None, "integer quantisation is not in Paxloom; USE_FP8=True is its only one"),
}

# MaxText's dataset_type -> DATASET (tasks/datasets.py).
DATASET_TYPES: dict[str, tuple[str | None, str]] = {
    "synthetic": ("synthetic", "generated token ids"),
    "hf": ("text", "your jsonl/parquet files or save_to_disk directory under --data_dir"),
    "grain": ("text", "your parquet (not ArrayRecord) files under --data_dir"),
    "tfds": (None, "TFDS datasets other than Pax's (the_pile, lambada, boolq under --data_dir) "
                   "are not read: write the documents as jsonl or parquet, DATASET='text'"),
}


def _bool_words(value) -> bool:
    return str(value).lower() in ("true", "1", "yes")


SETTINGS: tuple[Setting, ...] = (
    # The model
    Setting("model_name", "`--fdl_config`", "the experiment of that shape: llama2-7b: "
            "Llama2_7B, llama3.1-8b: Llama31_8B, mixtral-8x7b: Mixtral8x7B, qwen3-30b-a3b: "
            "Qwen3MoE30B_A3B, gpt3-175b: GPT175B; other models by decoder_block",
            lambda v, ctx: _model_name(v)),
    Setting("decoder_block", "`--fdl_config`", "the family: llama2, mistral, mixtral, qwen3, "
            "qwen3_moe: experiments.llama.LlamaBase; gpt3: experiments.base.BaseExperiment "
            "(the GPT); the others have no Paxloom family", lambda v, ctx: _decoder_block(v)),
    Setting("base_emb_dim", "`MODEL_DIMS`", "", _same("MODEL_DIMS")),
    Setting("base_num_decoder_layers", "`NUM_LAYERS`", "", _same("NUM_LAYERS")),
    Setting("base_num_query_heads", "`NUM_HEADS`", "", _same("NUM_HEADS")),
    Setting("base_num_kv_heads", "`NUM_KV_HEADS`", "the Llama family's; the GPT is multi-head",
            _kv_heads),
    Setting("head_dim", "`DIMS_PER_HEAD`", "", _same("DIMS_PER_HEAD")),
    Setting("base_mlp_dim", "`HIDDEN_DIMS`", "", _same("HIDDEN_DIMS")),
    Setting("base_moe_mlp_dim", "`MOE_HIDDEN_DIMS`", "-1: HIDDEN_DIMS (None)",
            _same("MOE_HIDDEN_DIMS", transform=lambda v, ctx: None if v <= 0 else v)),
    Setting("vocab_size", "`VOCAB_SIZE`", "", _same("VOCAB_SIZE")),
    Setting("global_parameter_scale", "none", "write the sizes themselves",
            _none_unless(lambda v, ctx: v == 1, "write the scaled sizes themselves "
                         "(MODEL_DIMS, NUM_HEADS, HIDDEN_DIMS, NUM_LAYERS)")),
    Setting("normalization_layer_epsilon", "`LAYERNORM_EPSILON`", "", _same("LAYERNORM_EPSILON")),
    Setting("rope_max_timescale", "`ROPE_MAX_WAVELENGTH`", "the Llama family's RoPE base",
            lambda v, ctx: _llama_only("ROPE_MAX_WAVELENGTH", float(v), ctx,
                                       "the GPT's positions are learned")),
    Setting("use_qk_norm", "`USE_QK_NORM`", "the Llama family's (Qwen3's QK-norm)",
            lambda v, ctx: _llama_only("USE_QK_NORM", bool(v), ctx,
                                       "QK-norm is the Llama family's", default=False)),
    Setting("mlp_activations", "`ACTIVATION_CLS`, `USE_GATED_ACTIVATION`", "the GPT's; the "
            "Llama family is SiLU-gated, MaxText's ['silu', 'linear']", _activations),
    Setting("logits_via_embedding", "`SEPARATE_EMBEDDING`", "the GPT's, negated; the Llama "
            "family's output layer is untied",
            _gpt_only("SEPARATE_EMBEDDING", lambda v: not v, llama_default=False,
                      why="the Llama family's output layer is untied")),
    Setting("fused_qkv", "`COMBINE_QKV`", "the GPT's; the Llama family's projections are "
            "separate", _gpt_only("COMBINE_QKV", bool, llama_default=False,
                                  why="the Llama family's q/k/v projections are separate")),
    Setting("attention_bias", "`USE_BIAS`", "the GPT's; the Llama family has no biases",
            _gpt_only("USE_BIAS", bool, llama_default=False,
                      why="the Llama family has no biases")),
    Setting("trainable_position_size", "`TRAINABLE_PE_MAX_SEQ_LEN`", "the GPT's learned "
            "position table; -1: none", _trainable_positions),
    Setting("use_iota_embed", "`EMBEDDING_LOOKUP_STYLE`", "true: 'matmul' (one-hot), false: "
            "'index' (gather)", _same("EMBEDDING_LOOKUP_STYLE",
                                      transform=lambda v, ctx: "matmul" if v else "index")),
    Setting("scan_layers", "`USE_REPEATED_LAYER`", "one layer scanned over the stack",
            _same("USE_REPEATED_LAYER", transform=lambda v, ctx: bool(v))),
    Setting("dropout_rate", "`DROPOUT_PROB`", "0 while enable_dropout is false", _dropout),
    Setting("enable_dropout", "`DROPOUT_PROB`", "false: DROPOUT_PROB=0",
            lambda v, ctx: Mapped({} if v else {"DROPOUT_PROB": 0.0})),
    # Precision, remat, attention
    Setting("dtype", "`FPROP_DTYPE`", "the compute dtype", _same("FPROP_DTYPE")),
    Setting("weight_dtype", "none", "Paxloom keeps parameters in float32",
            _none_unless(lambda v, ctx: str(v) == "float32",
                         "Paxloom keeps parameters (and Adam's moments) in float32")),
    Setting("remat_policy", "`CHECKPOINT_POLICY`", "the closest praxis policy: full: "
            "save_nothing, minimal: save_dot_with_no_batch_dims, minimal_with_context: "
            "save_dot_except_logits, save_dot_except_mlp: save_qkv_out_proj_separate, "
            "save_out_proj: save_out_proj; the offloading ones have none",
            _choice("CHECKPOINT_POLICY", REMAT_POLICIES, _remat_family),
            target="CHECKPOINT_POLICY", values=REMAT_POLICIES),
    Setting("attention", "`ATTENTION_IMPL`", "autoselected: auto, dot_product: xla, flash: "
            "pallas, cudnn_flash_te: cudnn", _choice("ATTENTION_IMPL", ATTENTION_KERNELS),
            target="ATTENTION_IMPL", values=ATTENTION_KERNELS),
    Setting("quantization", "`USE_FP8`", "fp8: USE_FP8=True; integer and AMD quantisation "
            "have none", _choice("USE_FP8", QUANTIZATIONS)),
    Setting("max_target_length", "`MAX_SEQ_LEN`", "tokens per sequence", _same("MAX_SEQ_LEN")),
    # Parallelism and batch
    *_mesh_settings(),
    Setting("per_device_batch_size", "`PERCORE_BATCH_SIZE`", "sequences per device per step; "
            "may be fractional", _same("PERCORE_BATCH_SIZE")),
    Setting("gradient_accumulation_steps", "`GRADIENT_ACCUMULATION_STEPS`", "",
            _same("GRADIENT_ACCUMULATION_STEPS")),
    Setting("context_parallel_strategy", "`CONTEXT_PARALLEL_STRATEGY`", "all_gather, ring",
            _choice("CONTEXT_PARALLEL_STRATEGY", {
                "all_gather": ("all_gather", ""), "ring": ("ring", ""),
                "ulysses": (None, "Ulysses' head exchange is not in Paxloom"),
                "usp": (None, "Ulysses' head exchange is not in Paxloom")})),
    # Mixture of experts
    Setting("num_experts", "`NUM_EXPERTS`", "MaxText's 1 (dense) is 0", _num_experts),
    Setting("num_experts_per_tok", "`NUM_EXPERTS_PER_TOKEN`", "", _experts_per_token),
    Setting("capacity_factor", "`CAPACITY_FACTOR`", "-1 (dropless) is 0",
            _same("CAPACITY_FACTOR", transform=lambda v, ctx: max(float(v), 0.0))),
    Setting("sparse_matmul", "`MOE_BACKEND`", "true: 'ragged_dot' (grouped matmuls over the "
            "routed rows); false with a capacity: 'padded'", _sparse_matmul),
    Setting("megablox", "none", "MaxText's megablox kernel is not wired into Paxloom; the "
            "grouped matmuls are jax.lax.ragged_dot (MOE_BACKEND='ragged_dot'), what MaxText "
            "runs with megablox=false",
            _none_unless(lambda v, ctx: not v, "MaxText's megablox kernel is not wired into "
                         "Paxloom; MOE_BACKEND='ragged_dot' (jax.lax.ragged_dot) is what "
                         "MaxText runs with megablox=false")),
    Setting("use_tokamax_gmm", "`MOE_BACKEND`", "true: 'tokamax'",
            lambda v, ctx: Mapped({"MOE_BACKEND": "tokamax"} if v else {})),
    Setting("ragged_buffer_factor", "`MOE_BUFFER_FACTOR`", "-1 (every assignment) is 0",
            _same("MOE_BUFFER_FACTOR", transform=lambda v, ctx: max(float(v), 0.0))),
    Setting("load_balance_loss_weight", "`LOAD_BALANCING_WEIGHT`", "per MoE layer",
            _same("LOAD_BALANCING_WEIGHT")),
    Setting("norm_topk_prob", "`MOE_RENORMALIZE`", "", _same("MOE_RENORMALIZE")),
    # Optimizer and schedule
    Setting("learning_rate", "`LEARNING_RATE`", "the peak", _same("LEARNING_RATE")),
    Setting("steps", "`MAX_STEPS`", "and the schedule's LR_COS_*, which MaxText stretches over "
            "steps unless learning_rate_schedule_steps is set", _steps),
    Setting("learning_rate_schedule_steps", "`LR_COS_DECAY_END`", "-1: steps; after it MaxText's "
            "rate is 0, Paxloom's stays at LR_COS_MIN_RATIO", _with_schedule),
    Setting("warmup_steps_fraction", "`LR_COS_WARMUP`, `LR_COS_DECAY_START`", "the fraction of "
            "the schedule's steps, as steps", _with_schedule),
    Setting("learning_rate_final_fraction", "`LR_COS_MIN_RATIO`", "", _same("LR_COS_MIN_RATIO")),
    Setting("cosine_learning_rate_final_fraction", "`LR_COS_MIN_RATIO`", "MaxText's older name",
            _same("LR_COS_MIN_RATIO")),
    Setting("lr_schedule_type", "`LR_SCHEDULE`", "cosine: linear_rampup_cosine_decay; WSD has "
            "none", _choice("LR_SCHEDULE", {
                "cosine": ("linear_rampup_cosine_decay", ""),
                "wsd": (None, "warmup-stable-decay is not in Paxloom; LR_SCHEDULE is praxis's "
                              "linear rampup + cosine decay or constant")})),
    Setting("opt_type", "none", "Paxloom's optimizer is AdamW",
            _none_unless(lambda v, ctx: v == "adamw", "Paxloom's optimizer is AdamW "
                         "(decoupled weight decay x learning rate), MaxText's adamw")),
    Setting("adam_b1", "`ADAM_BETA1`", "", _same("ADAM_BETA1")),
    Setting("adam_b2", "`ADAM_BETA2`", "", _same("ADAM_BETA2")),
    Setting("adam_eps", "`ADAM_EPSILON`", "", _same("ADAM_EPSILON")),
    Setting("adam_eps_root", "`ADAM_EPSILON_ROOT`", "", _same("ADAM_EPSILON_ROOT")),
    Setting("adam_weight_decay", "`WEIGHT_DECAY`", "decoupled, x the learning rate, as "
            "optax's adamw", _same("WEIGHT_DECAY")),
    Setting("gradient_clipping_threshold", "`CLIP_GRADIENT_NORM_TO_VALUE`", "0 disables",
            _same("CLIP_GRADIENT_NORM_TO_VALUE")),
    # Data
    Setting("dataset_type", "`DATASET`", "synthetic: 'synthetic'; hf, grain: 'text' (your "
            "files); tfds (C4) has none", _dataset),
    Setting("dataset_path", "`--data_dir`", "", _path("--data_dir")),
    Setting("hf_path", "none", "Hugging Face Hub datasets are not downloaded: save_to_disk or "
            "write parquet, DATASET='text' with --data_dir"),
    Setting("grain_train_files", "none", "name the directory of the parquet files with "
            "--data_dir (DATASET='text'); ArrayRecord is not read"),
    Setting("tokenizer_path", "`--vocab_path`", "a SentencePiece model or tokenizer.json",
            _path("--vocab_path")),
    Setting("tokenizer_type", "none", "the tokenizer is recognised by its file",
            _none_unless(lambda v, ctx: v in ("sentencepiece", "huggingface"), "tiktoken "
                         "files are not read; use the model's tokenizer.json")),
    Setting("add_bos", "`ADD_BOS`", "", _same("ADD_BOS", transform=lambda v, ctx: bool(v))),
    Setting("add_eos", "`ADD_EOS`", "", _same("ADD_EOS", transform=lambda v, ctx: bool(v))),
    Setting("train_data_columns", "`TEXT_FIELD`", "the one text column of jsonl/parquet files",
            _text_field),
    Setting("packing", "`PACKED_INPUT`", "", _same("PACKED_INPUT",
                                                   transform=lambda v, ctx: bool(v))),
    Setting("max_segments_per_seq", "`MAX_SEGMENTS_PER_SEQ`", "-1 (unbounded) has none: "
            "Paxloom's packing is bounded, by 32 unless set",
            lambda v, ctx: _max_segments(v)),
    Setting("reuse_example_batch", "none", "every step reads a new batch; DATASET='synthetic' "
            "measures speed without data",
            _none_unless(lambda v, ctx: not v, "every step reads a new batch; "
                         "DATASET='synthetic' measures speed without data")),
    Setting("eval_interval", "`EVAL_INTERVAL_STEPS`", "-1 (never) is 0",
            _same("EVAL_INTERVAL_STEPS", transform=lambda v, ctx: max(int(v), 0))),
    Setting("eval_steps", "`EVAL_BATCHES`", "-1 (the whole set) has none",
            lambda v, ctx: _eval_steps(v)),
    Setting("init_weights_seed", "`RANDOM_SEED`", "", _same("RANDOM_SEED")),
    Setting("data_shuffle_seed", "`TRAIN_INPUT_RANDOM_SEED`", "", _same("TRAIN_INPUT_RANDOM_SEED")),
    # Checkpoints, output, loop
    Setting("load_parameters_path", "`CHECKPOINT_RESTORE_PATH`", "parameters only, the "
            "optimizer fresh: a Paxloom run, a Hugging Face model directory or a Pax checkpoint "
            "(a MaxText checkpoint is not read: convert it to Hugging Face first)",
            _path("CHECKPOINT_RESTORE_PATH")),
    Setting("load_full_state_path", "`--restore_checkpoint_dir`", "a Paxloom run's checkpoint, "
            "optimizer and step included", _path("--restore_checkpoint_dir")),
    Setting("enable_checkpointing", "`--enable_checkpoint_saving`", "false: "
            "--noenable_checkpoint_saving (a rerun still resumes what the job directory holds)",
            lambda v, ctx: Mapped({"--enable_checkpoint_saving": _bool_words(v)})),
    Setting("async_checkpointing", "none", "Paxloom's checkpoints are always asynchronous",
            _none_unless(lambda v, ctx: bool(v), "Paxloom's checkpoints are always "
                         "asynchronous")),
    Setting("checkpoint_period", "`CHECKPOINT_EVERY_N_STEPS`", "",
            _same("CHECKPOINT_EVERY_N_STEPS")),
    Setting("max_num_checkpoints_to_keep", "`CHECKPOINT_MAX_TO_KEEP`", "None (all) is 0",
            _same("CHECKPOINT_MAX_TO_KEEP",
                  transform=lambda v, ctx: 0 if v in (None, "None", "null") else int(v))),
    Setting("run_name", "`--job_log_dir`", "base_output_directory/run_name; the same one again "
            "resumes, as in MaxText", _job_log_dir),
    Setting("base_output_directory", "`--job_log_dir`", "with run_name", _job_log_dir),
    Setting("jax_cache_dir", "`--jax_compilation_cache_dir`", "",
            _path("--jax_compilation_cache_dir")),
    Setting("log_period", "`SUMMARY_INTERVAL_STEPS`", "the console line and TensorBoard "
            "scalars", _same("SUMMARY_INTERVAL_STEPS")),
    Setting("hardware", "`--multiprocess_gpu`", "gpu_multiprocess: --multiprocess_gpu; gpu, "
            "cpu: nothing; tpu has none", lambda v, ctx: _hardware(v)),
    Setting("profiler", "`--profile_start_step`, `--profile_num_steps`", "xplane: a trace after "
            "skip_first_n_steps_for_profiler; nsys has none", _profiler),
    Setting("skip_first_n_steps_for_profiler", "`--profile_start_step`", "with profiler=xplane",
            _with_profiler("--profile_start_step")),
    Setting("profiler_steps", "`--profile_num_steps`", "with profiler=xplane",
            _with_profiler("--profile_num_steps")),
)

# model_name -> the registered experiment of that shape (experiments/llama.py, gpt.py).
MODEL_EXPERIMENTS = {"llama2-7b": "Llama2_7B", "llama3.1-8b": "Llama31_8B",
                     "mixtral-8x7b": "Mixtral8x7B", "qwen3-30b-a3b": "Qwen3MoE30B_A3B",
                     "gpt3-175b": "GPT175B"}
# decoder_block -> the family's experiment (not registered: the sizes are the recipe's).
FAMILY_EXPERIMENTS = {"llama": "experiments.llama.LlamaBase",
                      "gpt": "experiments.base.BaseExperiment"}
DECODER_BLOCKS = {"llama2": "llama", "mistral": "llama", "mixtral": "llama", "qwen3": "llama",
                  "qwen3_moe": "llama", "gpt3": "gpt"}


def _model_name(value) -> Mapped:
    name = str(value).replace("-Instruct", "")
    if name == "default":
        return Mapped({})
    if name not in MODEL_EXPERIMENTS:
        raise NoEquivalent("no Paxloom experiment has its shape: the family comes from "
                           "decoder_block, the sizes from base_*")
    return Mapped({"--fdl_config": f"experiments.{MODEL_EXPERIMENTS[name]}"})


def _decoder_block(value) -> Mapped:
    if str(value) not in DECODER_BLOCKS:
        raise NoEquivalent(f"no Paxloom family builds MaxText's {value} layers; the closest "
                           f"are the Llama family's and the GPT's")
    return Mapped({"--fdl_config": FAMILY_EXPERIMENTS[DECODER_BLOCKS[str(value)]]})


def _llama_only(name, value, ctx, why, default=None):
    if ctx.family == "llama":
        return Mapped({name: value})
    if value == default:
        return Mapped({})
    raise NoEquivalent(why)


def _max_segments(value) -> Mapped:
    if value is None or value < 0:
        raise NoEquivalent("Paxloom's packing is bounded (MAX_SEGMENTS_PER_SEQ, 32 unless set): "
                           "cuDNN's packed attention sizes its buffers by it")
    return Mapped({"MAX_SEGMENTS_PER_SEQ": value})


def _eval_steps(value) -> Mapped:
    if value is None or value < 1:
        raise NoEquivalent("Paxloom evaluates EVAL_BATCHES batches, never the whole set")
    return Mapped({"EVAL_BATCHES": value})


def _hardware(value) -> Mapped:
    if value == "gpu_multiprocess":
        return Mapped({"--multiprocess_gpu": True})
    if value in ("gpu", "cpu"):
        return Mapped({}, "the devices are found")
    raise NoEquivalent("Paxloom runs on GPUs (and CPUs for tests), not TPUs")


BY_NAME: dict[str, Setting] = {s.maxtext: s for s in SETTINGS}


# ----- reading ----------------------------------------------------------------------------


def lookup(name: str) -> tuple[Setting, Any] | None:
    """The MaxText setting `name` spells in any case, with or without `--` or `--fdl.`
    (PER_DEVICE_BATCH_SIZE, --fdl.per_device_batch_size), and the value a `--noNAME` gives;
    None if it is none."""
    key = name.lstrip("-").removeprefix("fdl.").lower()
    if key in BY_NAME:
        return BY_NAME[key], None
    if key.startswith("no") and key[2:] in BY_NAME:  # absl's --noenable_checkpointing
        return BY_NAME[key[2:]], False
    return None


def parse(raw):
    """A value as typed on a command line ("4", "full", "[1,8,1]", "true") as MaxText reads it."""
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def convert(setting: Setting, value, ctx: Context | None = None) -> Mapped:
    """`value` of `setting` in Paxloom's names; NoEquivalent when there are none."""
    if setting.convert is None:
        if value in ("", None):  # unset in MaxText too
            return Mapped({}, "unset")
        raise NoEquivalent(setting.note)
    ctx = ctx or Context()
    if setting.maxtext not in ctx.config:
        ctx = dataclasses.replace(ctx, config={**ctx.config, setting.maxtext: value})
    try:
        return setting.convert(value, ctx)
    except (TypeError, ValueError) as error:  # a value of the wrong kind: say which
        raise NoEquivalent(f"{value!r} is not a value of MaxText's {setting.maxtext} "
                           f"({error})") from None


def render(name: str, value, flag: bool = True) -> str:
    """One Paxloom value as a user writes it: `--fdl.NAME=VALUE` or `--flag=VALUE` (a flag:
    `--name` / `--noname` for a bool), or `NAME = VALUE` in a class body (`flag=False`)."""
    if name.startswith("--"):
        if isinstance(value, bool):
            return name if value else f"--no{name[2:]}"
        if isinstance(value, str) and value.startswith("~/"):
            value = "$HOME" + value[1:]  # the shell expands no ~ after --name=
        return f"{name}={value}"
    if not flag:
        return f"{name} = {value!r}"
    if isinstance(value, (list, tuple)):
        text = "[" + ",".join(str(v) for v in value) + "]"
    elif isinstance(value, str):
        text = value if re.fullmatch(r"[\w./:+-]+", value) else f"'{value!r}'"
    else:
        text = repr(value)
    return f"--fdl.{name}={text}"


def hint(name: str, value=None, flag: bool = True) -> str | None:
    """For an unknown name that is MaxText's (any case): what Paxloom calls it, with `value`
    (a Python value, or the text typed) translated when there is one, in words for an error's
    one line; None for any other name, and for one Paxloom spells the same (learning_rate is
    LEARNING_RATE: the near match already says so)."""
    found = lookup(name)
    if found is None:
        return None
    setting, implied = found
    value = implied if value is None and implied is not None else parse(value)
    targets = re.findall(r"`(-*\w+)`", setting.paxloom)
    if name.lstrip("-").removeprefix("fdl.").upper() in [t.upper() for t in targets]:
        return None
    key = setting.maxtext if value is None else f"{setting.maxtext}={_shown(value)}"
    if setting.convert is None:
        return f"MaxText's {setting.maxtext} has no Paxloom equivalent: {setting.note}"
    if value is None:
        return (f"MaxText's {setting.maxtext} is {_plain(setting.paxloom)} in Paxloom"
                + (f"; {setting.note}" if setting.note else ""))
    try:
        mapped = convert(setting, value)
    except NoEquivalent as error:
        return f"MaxText's {key} has no Paxloom equivalent: {error}"
    return _sentence(key, mapped, flag)


def value_hint(hyperparameter: str, value, flag: bool = True) -> str | None:
    """For a value of `hyperparameter` that is not one of its choices but is a MaxText value
    of the setting it translates (CHECKPOINT_POLICY='full', MaxText's remat_policy): what
    Paxloom calls it; None otherwise."""
    for setting in SETTINGS:
        if setting.target == hyperparameter and setting.values and str(value) in setting.values:
            key = f"{setting.maxtext}={_shown(value)}"
            try:
                return _sentence(key, convert(setting, value), flag)
            except NoEquivalent as error:
                return f"MaxText's {key} has no Paxloom equivalent: {error}"
    return None


def _sentence(key: str, mapped: Mapped, flag: bool) -> str:
    note = f"; {mapped.note}" if mapped.note else ""
    if not mapped.values:
        return f"MaxText's {key} is what Paxloom does already, nothing to set{note}"
    written = " ".join(render(n, v, flag) for n, v in mapped.values.items())
    return f"MaxText's {key} is {written} in Paxloom{note}"


def _shown(value) -> str:
    return value if isinstance(value, str) else repr(value)


def _plain(text: str) -> str:
    return text.replace("`", "")


def markdown_table() -> str:
    """The table as docs/guides/from-maxtext.md shows it (tests/test_from_maxtext.py)."""
    lines = ["| MaxText setting | Paxloom | note |", "| --- | --- | --- |"]
    for s in SETTINGS:
        lines.append(f"| `{s.maxtext}` | {s.paxloom} | {s.note.replace('|', '/')} |")
    return "\n".join(lines)
