"""A Llama-style family through the model seam: nothing in runner/ knows it exists.

`LlamaBase.model_template` returns layers/llama.py's praxis config; the runtime
shards it like any other template. This module is also the docs' example of
adding a model family from a user's own module.

Sizes are published ones: Llama1B is TinyLlama-1.1B (Zhang et al. 2024, "TinyLlama:
An Open-Source Small Language Model", table 1 and its released config: 22 layers,
2048 wide, 5632 feed-forward, 32 heads in 4 key/value groups, 2048 tokens,
peak learning rate 4e-4 with 2000 warmup steps down to 4e-5); Llama2_7B is Llama 2 7B
(Touvron et al. 2023, "Llama 2", tables 1 and section 2.2: 32 layers, 4096 wide,
11008 feed-forward, 32 heads, 4096 tokens, AdamW beta2 0.95, epsilon 1e-5,
weight decay 0.1, clipping 1.0, peak 3e-4 with 2000 warmup steps, cosine to 10%).
Both use a 32000-piece vocabulary and RMSNorm epsilon 1e-5.

The mixtures of experts (layers/moe.py) are shaped like published ones too: Mixtral8x7B is
Mixtral 8x7B (Jiang et al. 2024, "Mixtral of Experts", table 1 and its released config: 32
layers, 4096 wide, 32 heads in 8 key/value groups of 128, 8 experts of 14336 in every
layer, top-2, RoPE theta 1e6, the 32000-piece vocabulary); Qwen3MoE30B_A3B is Qwen3-30B-A3B
(Qwen Team 2025, "Qwen3 Technical Report", table 2 and its released config: 48 layers, 2048
wide, 32 query heads of 128 in 4 key/value groups, 128 experts of 768, top-8 renormalised,
no shared expert, RoPE theta 1e6, RMSNorm epsilon 1e-6, a 151936-piece vocabulary), with
its per-head RMSNorm of queries and keys before RoPE (QK-norm, USE_QK_NORM): Qwen3's
architecture exactly, so its released weights import (paxloom/runner/state/hf_format.py).
Neither publishes its training recipe; theirs here is Llama 2's (PileTraining's AdamW,
peak 3e-4 with 2000 warmup steps, cosine to 10%).
"""

from experiments.base import BaseExperiment
from experiments.recipes import PileTraining, SampleCorpusOnCPU
from experiments.registry import register
from paxloom.core.errors import UserError


class LlamaBase(BaseExperiment):
    """Llama-style decoder; a subclass sets the sizes. Not registered."""

    NUM_KV_HEADS: int = 4  # key/value heads; NUM_HEADS = grouped-query, 1 = multi-query
    ROPE_MAX_WAVELENGTH: float = 10000.0  # RoPE base ("theta")
    # RoPE scaling for a longer context (layers/rope.py; Hugging Face's rope_parameters).
    # The defaults are Llama 3.1's published values and the YaRN paper's betas.
    ROPE_SCALING_TYPE: str = "none"  # "linear", "llama3" (Llama 3.1) or "yarn" (YaRN)
    ROPE_SCALING_FACTOR: float = 8.0  # how many times longer the new context is
    ROPE_LOW_FREQ_FACTOR: float = 1.0  # llama3
    ROPE_HIGH_FREQ_FACTOR: float = 4.0  # llama3
    ROPE_ORIGINAL_MAX_POSITION: int = 8192  # llama3, yarn: the context trained before
    ROPE_BETA_FAST: float = 32.0  # yarn
    ROPE_BETA_SLOW: float = 1.0  # yarn
    # Qwen3's QK-norm: each head's queries and keys RMS-normalised before RoPE, one learned
    # [DIMS_PER_HEAD] scale for the queries and one for the keys (layers/qk_norm.py).
    USE_QK_NORM: bool = False
    CHOICES = {**BaseExperiment.CHOICES,
               # layers/rope.py's SCALINGS (tests/test_rope.py checks they agree)
               "ROPE_SCALING_TYPE": ("none", "linear", "llama3", "yarn")}

    EMBEDDING_LOOKUP_STYLE = "index"
    LAYERNORM_EPSILON = 1e-5  # RMSNorm epsilon
    USE_ROTARY_POSITION_EMB = True  # Pax's name for what layers/llama.py always builds
    reads_gpt_architecture = False  # SiLU-gated, bias-free, untied, RoPE: layers/llama.py

    def validate(self) -> None:
        super().validate()
        if self.NUM_KV_HEADS < 1 or self.NUM_HEADS % self.NUM_KV_HEADS:
            raise UserError(f"NUM_HEADS={self.NUM_HEADS} must be a multiple of "
                            f"NUM_KV_HEADS={self.NUM_KV_HEADS}")
        tensor_parallel = self.ICI_MESH_SHAPE[-1] * self.DCN_MESH_SHAPE[-1]
        if self.NUM_KV_HEADS % tensor_parallel:
            raise UserError(f"NUM_KV_HEADS={self.NUM_KV_HEADS} does not split over the "
                            f"{tensor_parallel}-way tensor-parallel mesh axis; use a multiple "
                            f"of {tensor_parallel}, or less tensor parallelism")
        if self.CHECKPOINT_POLICY == "save_qkv_out_proj" and self.NUM_KV_HEADS != self.NUM_HEADS:
            raise UserError("CHECKPOINT_POLICY='save_qkv_out_proj' saves the combined QKV "
                            "projection, which grouped-query attention does not have; use "
                            "'save_qkv_out_proj_separate'")
        for name in ("ROPE_SCALING_FACTOR", "ROPE_LOW_FREQ_FACTOR", "ROPE_ORIGINAL_MAX_POSITION",
                     "ROPE_BETA_SLOW"):
            if getattr(self, name) <= 0:
                raise UserError(f"{name}={getattr(self, name)} must be positive")
        # llama3 divides the frequencies turning fewer than LOW times over the original
        # context and keeps those turning more than HIGH times: LOW < HIGH. YaRN likewise
        # with BETA_SLOW < BETA_FAST.
        for low, high in (("ROPE_LOW_FREQ_FACTOR", "ROPE_HIGH_FREQ_FACTOR"),
                          ("ROPE_BETA_SLOW", "ROPE_BETA_FAST")):
            if getattr(self, low) >= getattr(self, high):
                raise UserError(f"{low}={getattr(self, low)} must be below "
                                f"{high}={getattr(self, high)}")

    def model_template(self):
        from layers import llama, rope

        return llama.llama_model(
            self.transformer_stack(),
            model_dims=self.MODEL_DIMS, vocab_size=self.VOCAB_SIZE,
            num_heads=self.NUM_HEADS, num_kv_heads=self.NUM_KV_HEADS,
            packed_input=self.PACKED_INPUT, fprop_dtype=self.FPROP_DTYPE,
            init_std=self.INIT_STD, softmax_init_std=self.SOFTMAX_INIT_STD,
            norm_epsilon=self.LAYERNORM_EPSILON,
            rope_max_wavelength=self.ROPE_MAX_WAVELENGTH,
            rope_scaling=rope.RopeScaling(
                kind=self.ROPE_SCALING_TYPE, factor=self.ROPE_SCALING_FACTOR,
                low_freq_factor=self.ROPE_LOW_FREQ_FACTOR,
                high_freq_factor=self.ROPE_HIGH_FREQ_FACTOR,
                original_max_position_embeddings=self.ROPE_ORIGINAL_MAX_POSITION,
                beta_fast=self.ROPE_BETA_FAST, beta_slow=self.ROPE_BETA_SLOW),
            embedding_lookup_style=self.EMBEDDING_LOOKUP_STYLE,
            loss_chunk_len=self.loss_chunk_len(),
            experts=self.experts_template(),
            experts_interval=self.MOE_LAYER_INTERVAL,
            use_qk_norm=self.USE_QK_NORM,
        )

    def experts_template(self):
        """The mixture-of-experts feed-forward (layers/moe.py), or None when NUM_EXPERTS=0."""
        if not self.NUM_EXPERTS:
            return None
        from praxis import pax_fiddle

        from layers import moe

        return pax_fiddle.Config(
            moe.MoeFeedForward,
            num_experts=self.NUM_EXPERTS, num_experts_per_token=self.NUM_EXPERTS_PER_TOKEN,
            expert_hidden_dims=self.MOE_HIDDEN_DIMS or self.HIDDEN_DIMS,
            renormalize_top_k=self.MOE_RENORMALIZE, capacity_factor=self.CAPACITY_FACTOR,
            load_balancing_weight=self.LOAD_BALANCING_WEIGHT,
            router_z_loss_weight=self.ROUTER_Z_LOSS_WEIGHT,
            shared_hidden_dims=self.MOE_SHARED_HIDDEN_DIMS,
            gate_shared_expert=self.MOE_SHARED_EXPERT_GATE, backend=self.MOE_BACKEND,
            buffer_factor=self.MOE_BUFFER_FACTOR,
            expert_axis=None if self.EXPERT_AXIS == "none" else self.EXPERT_AXIS,
        )


class _LlamaOnThePile(LlamaBase, PileTraining):
    """Training settings shared by the full-size Llama experiments (with PileTraining's)."""

    VOCAB_SIZE = 32000
    USE_REPEATED_LAYER = True
    CHECKPOINT_POLICY = "save_dot_with_no_batch_dims"
    ADAM_EPSILON = 1e-5
    LR_COS_WARMUP = 2000
    LR_COS_DECAY_START = 2000
    ICI_MESH_SHAPE = [1, 8, 1]
    SUMMARY_INTERVAL_STEPS = 10
    EVAL_INTERVAL_STEPS = 1000
    CHECKPOINT_EVERY_N_STEPS = 1000


@register
class Llama1B(_LlamaOnThePile):
    """TinyLlama-1.1B shape: grouped-query attention (32 heads, 4 key/value groups).

    VOCAB_PATH=spm.model python main.py --fdl_config=experiments.Llama1B --data_dir=$TFDS_DATA_DIR --job_log_dir=runs/llama1b
    """

    NUM_LAYERS = 22
    MODEL_DIMS = 2048
    HIDDEN_DIMS = 5632
    NUM_HEADS = 32
    NUM_KV_HEADS = 4
    DIMS_PER_HEAD = 64
    MAX_SEQ_LEN = 2048
    PERCORE_BATCH_SIZE = 8
    LEARNING_RATE = 4e-4
    LR_COS_DECAY_END = 100000
    MAX_STEPS = 100000


@register
class Llama2_7B(_LlamaOnThePile):
    """Llama 2 7B shape (multi-head attention: NUM_KV_HEADS = NUM_HEADS).

    VOCAB_PATH=spm.model python main.py --fdl_config=experiments.Llama2_7B --data_dir=$TFDS_DATA_DIR --job_log_dir=runs/llama2_7b
    """

    NUM_LAYERS = 32
    MODEL_DIMS = 4096
    HIDDEN_DIMS = 11008
    NUM_HEADS = 32
    NUM_KV_HEADS = 32
    DIMS_PER_HEAD = 128
    MAX_SEQ_LEN = 4096
    PERCORE_BATCH_SIZE = 1
    LEARNING_RATE = 3e-4
    LR_COS_DECAY_END = 500000
    MAX_STEPS = 500000


@register
class Llama31_8B(_LlamaOnThePile):
    """Llama 3.1 8B shape (grouped-query attention, 32 heads over 8 key/value heads, RoPE
    theta 500000 with its "llama3" scaling, a 128256-token vocabulary) at its pre-training
    length, 8192, on one node: weights split 8 ways (FSDP). Import its weights from Hugging
    Face with CHECKPOINT_RESTORE_PATH (docs/guides/trained-weights.md); train longer with
    Llama31_8B_32K or Llama31_8B_128K (docs/guides/long-context.md).

    VOCAB_PATH=tokenizer.json python main.py --fdl_config=experiments.Llama31_8B --data_dir=$TFDS_DATA_DIR --job_log_dir=runs/llama31-8b
    """

    NUM_LAYERS = 32
    MODEL_DIMS = 4096
    HIDDEN_DIMS = 14336
    NUM_HEADS = 32
    NUM_KV_HEADS = 8
    DIMS_PER_HEAD = 128
    VOCAB_SIZE = 128256
    ROPE_MAX_WAVELENGTH = 500000.0
    ROPE_SCALING_TYPE = "llama3"  # factor 8, low 1, high 4, from 8192: LlamaBase's defaults
    MAX_SEQ_LEN = 8192
    PERCORE_BATCH_SIZE = 1
    LEARNING_RATE = 3e-4
    LR_COS_DECAY_END = 100000
    MAX_STEPS = 100000


@register
class Llama31_8B_32K(Llama31_8B):
    """Llama31_8B at 32768 tokens on one node of 8 GPUs: each sequence split over 2 (context
    parallelism) and the weights over all 8 (the data and context axes), 4 sequences a
    step. XLA:GPU plans it at 60.9 GiB an H100 (23.9 GiB with CHECKPOINT_POLICY
    'save_nothing', which recomputes more).

    VOCAB_PATH=tokenizer.json python main.py --fdl_config=experiments.Llama31_8B_32K --data_dir=$TFDS_DATA_DIR --job_log_dir=runs/llama31-8b-32k
    """

    MAX_SEQ_LEN = 32768
    ICI_MESH_SHAPE = [1, 1, 4, 2, 1]  # [stage, replica, data, context, mdl]
    PERCORE_BATCH_SIZE = 0.5


@register
class Llama31_8B_128K(Llama31_8B):
    """Llama31_8B at 131072 tokens (Llama 3.1's context) on 8 GPUs: each sequence split 8
    ways (context parallelism 8), the weights too, one sequence a step. XLA:GPU plans it
    at 61.2 GiB an H100 (25.2 GiB with CHECKPOINT_POLICY 'save_nothing').

    VOCAB_PATH=tokenizer.json python main.py --fdl_config=experiments.Llama31_8B_128K --data_dir=$TFDS_DATA_DIR --job_log_dir=runs/llama31-8b-128k
    """

    MAX_SEQ_LEN = 131072
    ICI_MESH_SHAPE = [1, 1, 1, 8, 1]  # [stage, replica, data, context, mdl]
    PERCORE_BATCH_SIZE = 0.125


@register
class LlamaTiny(SampleCorpusOnCPU, LlamaBase):
    """2 layers x 64 on the built-in sample corpus, 8 fake CPU devices (like Tiny).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py --fdl_config=experiments.LlamaTiny --job_log_dir=runs/llama-tiny
    """

    NUM_HEADS = 4
    NUM_KV_HEADS = 2


# ----- Pax's LLaMA experiments (paxml/contrib/gpu/scripts_gpu/configs.py) --------------------


@register
class LLaMA7B(LlamaBase):
    """Pax's LLaMA7B: fine-tune LLaMA(-2) 7B, with LoRA or fully, and evaluate on BoolQ.

    Values are the Pax GPU configs' (configs.py LLaMA7B over llama_utils.BaseLLaMA, c4's
    TransformerLmSpmdAdam, tasks.BoolQDataset, LoRAMixin, CheckpointRestoreMixin); what
    differs, and why, is listed in docs/guides/trained-weights.md ("Pax's LLaMA experiments"). Start from a
    Hugging Face or Pax checkpoint:

    python main.py --fdl_config=experiments.LLaMA7B --fdl.CHECKPOINT_RESTORE_PATH=hf/llama-2-7b --fdl.USE_LORA=True --data_dir=data --job_log_dir=runs/llama7b-boolq
    """

    NUM_LAYERS = 32
    VOCAB_SIZE = 32000
    DIMS_PER_HEAD = 128
    NUM_HEADS = 32
    NUM_KV_HEADS = 32  # Pax: USE_MQA = False
    MODEL_DIMS = 4096
    HIDDEN_DIMS = 11008
    PERCORE_BATCH_SIZE = 16
    ICI_MESH_SHAPE = [1, 8, 1]
    DCN_MESH_SHAPE = [1, 1, 1]
    # BaseLLaMA
    FPROP_DTYPE = "bfloat16"
    LAYERNORM_EPSILON = 1e-5  # RMS_NORM_EPSILON
    PACKED_INPUT = False
    # BoolQDataset
    DATASET = "boolq"
    MAX_SEQ_LEN = 4096
    # TransformerLmSpmdAdafactor / TransformerLmSpmdAdam (c4.py)
    USE_REPEATED_LAYER = False
    CHECKPOINT_POLICY = "save_nothing"
    LEARNING_RATE = 1e-3
    ADAM_BETA1 = 0.9
    ADAM_BETA2 = 0.99
    ADAM_EPSILON = 1e-6
    WEIGHT_DECAY = 1e-3
    CLIP_GRADIENT_NORM_TO_VALUE = 5.0
    LR_COS_WARMUP = 4000
    LR_COS_DECAY_START = 4001
    LR_COS_DECAY_END = 300000
    LR_COS_MIN_RATIO = 0.1
    SUMMARY_INTERVAL_STEPS = 100
    EVAL_INTERVAL_STEPS = 100
    CHECKPOINT_EVERY_N_STEPS = 5000
    CHECKPOINT_MAX_TO_KEEP = 10
    # Pax's are evaluation-only (MAX_STEPS = 0); run_llama_boolq.sh trains 600 LoRA steps.
    MAX_STEPS = 600
    # BoolQDataset's TRUE_TOKEN, FALSE_TOKEN (Pax: s.encode('yes'), s.encode('no')), as the
    # words: each must be one token of the vocabulary, after "answer:" or alone.
    BOOLQ_ANSWER_WORDS: list[str] = ["yes", "no"]
    # LoRAMixin
    USE_LORA = False
    LORA_RANK = 8
    LORA_TARGET_LAYERS = "all"

    def dataset(self):
        """BoolQ rows start with LLaMA's BOS (BaseLLaMA's BOS_ID = 1), as Pax's do, and are
        answered with BOOLQ_ANSWER_WORDS."""
        import dataclasses

        from tasks.boolq import BoolQ

        dataset = super().dataset()
        if not isinstance(dataset, BoolQ):
            return dataset
        return dataclasses.replace(dataset, bos_id=1,
                                   answer_words=tuple(self.BOOLQ_ANSWER_WORDS))


@register
class LLaMA13B(LLaMA7B):
    """Pax's LLaMA13B (LLaMA 13B; otherwise as LLaMA7B).

    python main.py --fdl_config=experiments.LLaMA13B --fdl.CHECKPOINT_RESTORE_PATH=hf/llama-2-13b --fdl.USE_LORA=True --data_dir=data --job_log_dir=runs/llama13b-boolq
    """

    NUM_LAYERS = 40
    VOCAB_SIZE = 32000
    DIMS_PER_HEAD = 128
    NUM_HEADS = 40
    NUM_KV_HEADS = 40
    MODEL_DIMS = 5120
    HIDDEN_DIMS = 13824
    PERCORE_BATCH_SIZE = 8
    ICI_MESH_SHAPE = [1, 8, 1]
    DCN_MESH_SHAPE = [1, 1, 1]


@register
class LLaMA70B(LLaMA7B):
    """Pax's LLaMA70B (LLaMA-2 70B: 64 query heads over 8 key/value heads), on two nodes.

    python main.py --fdl_config=experiments.LLaMA70B --fdl.CHECKPOINT_RESTORE_PATH=hf/llama-2-70b --fdl.USE_LORA=True --data_dir=data --job_log_dir=runs/llama70b-boolq
    """

    NUM_LAYERS = 80
    VOCAB_SIZE = 32000
    DIMS_PER_HEAD = 128
    NUM_HEADS = 64
    NUM_KV_HEADS = 8  # Pax: USE_MQA = True, NUM_KV_HEADS = 8
    MODEL_DIMS = 8192
    HIDDEN_DIMS = 28672
    PERCORE_BATCH_SIZE = 4
    ICI_MESH_SHAPE = [1, 8, 1]
    DCN_MESH_SHAPE = [1, 2, 1]


@register
class LLaMABoolQTiny(LLaMA7B):
    """Pax's LLaMA7B recipe with a 2 x 64 model in float32, for paxml's run_llama_boolq.sh
    on a CPU (CONFIG=LLaMABoolQTiny): BoolQ and the 1024-piece vocabulary of `python -m
    tasks.sample_corpus --boolq_dir=DIR` (docs/guides/trained-weights.md, "BoolQ on a CPU").
    The script passes its own steps, batch, length and meshes.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 VOCAB_PATH=DIR/boolq_spm.model python main.py --fdl_config=experiments.LLaMABoolQTiny --tfds_data_dir=DIR --job_log_dir=runs/llama-boolq-tiny
    """

    NUM_LAYERS = 2
    VOCAB_SIZE = 1024  # tasks/sample_corpus.py's BoolQ vocabulary
    DIMS_PER_HEAD = 8
    NUM_HEADS = 8
    NUM_KV_HEADS = 8
    MODEL_DIMS = 64
    HIDDEN_DIMS = 256
    FPROP_DTYPE = "float32"  # bfloat16 matmuls are slow on CPUs
    PERCORE_BATCH_SIZE = 1
    MAX_SEQ_LEN = 256  # the sample's rows fit
    MAX_STEPS = 20
    SUMMARY_INTERVAL_STEPS = 10
    EVAL_INTERVAL_STEPS = 0  # the script evaluates the last checkpoint with --mode=eval


# ----- Mixtures of experts (layers/moe.py) ---------------------------------------------------


@register
class MixtralTiny(LlamaTiny):
    """LlamaTiny with a Mixtral-style mixture of experts in every layer: 8 experts, top-2,
    split over the mesh's data axis; 8 fake CPU devices.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py --fdl_config=experiments.MixtralTiny --job_log_dir=runs/mixtral-tiny
    """

    NUM_EXPERTS = 8
    NUM_EXPERTS_PER_TOKEN = 2
    MOE_HIDDEN_DIMS = 128
    # Mixtral's router_aux_loss_coef, 0.02, weighs one loss pooled over its layers; here
    # each MoE layer adds its own (paxloom/runner/state/hf_format.py maps one to the other).
    LOAD_BALANCING_WEIGHT = 0.01
    ROUTER_Z_LOSS_WEIGHT = 1e-3


@register
class Mixtral8x7B(_LlamaOnThePile):
    """Mixtral 8x7B shape: 8 experts of 14336 in every layer, top-2 (46.7B parameters,
    12.9B of them a token's), on two nodes of 8 H100s: the experts over the data axis (one
    per GPU pair, the all_to_all across the nodes), 2-way tensor parallelism in a node.

    VOCAB_PATH=tokenizer.model python main.py --fdl_config=experiments.Mixtral8x7B --data_dir=$TFDS_DATA_DIR --job_log_dir=runs/mixtral8x7b
    """

    NUM_LAYERS = 32
    MODEL_DIMS = 4096
    HIDDEN_DIMS = 14336
    NUM_HEADS = 32
    NUM_KV_HEADS = 8
    DIMS_PER_HEAD = 128
    ROPE_MAX_WAVELENGTH = 1e6
    NUM_EXPERTS = 8
    NUM_EXPERTS_PER_TOKEN = 2
    MOE_HIDDEN_DIMS = 14336
    # Mixtral's router_aux_loss_coef (0.02) weighs one loss pooled over its 32 layers; here
    # each layer adds its own (paxloom/runner/state/hf_format.py maps one to the other).
    LOAD_BALANCING_WEIGHT = 0.02 / 32
    MAX_SEQ_LEN = 4096
    ICI_MESH_SHAPE = [1, 4, 2]
    DCN_MESH_SHAPE = [1, 2, 1]
    PERCORE_BATCH_SIZE = 1
    LEARNING_RATE = 3e-4
    LR_COS_DECAY_END = 100000
    MAX_STEPS = 100000


@register
class Qwen3MoE30B_A3B(_LlamaOnThePile):
    """Qwen3-30B-A3B (its QK-norm included): 128 experts of 768 in every layer, top-8
    renormalised, dropless (30.5B parameters, 3.35B of them a token's), on 8 GPUs: the
    experts over the data axis (16 per GPU), the other weights split over it too (FSDP).
    XLA:GPU plans it at 111 GiB a GPU, for H200s; `--mode=plan` says what fits others.

    VOCAB_PATH=tokenizer.json python main.py --fdl_config=experiments.Qwen3MoE30B_A3B --data_dir=$TFDS_DATA_DIR --job_log_dir=runs/qwen3moe30b-a3b
    """

    NUM_LAYERS = 48
    MODEL_DIMS = 2048
    HIDDEN_DIMS = 6144  # intermediate_size: k x MOE_HIDDEN_DIMS, a dense peer's width
    NUM_HEADS = 32
    NUM_KV_HEADS = 4
    DIMS_PER_HEAD = 128
    VOCAB_SIZE = 151936
    LAYERNORM_EPSILON = 1e-6
    ROPE_MAX_WAVELENGTH = 1e6
    USE_QK_NORM = True
    NUM_EXPERTS = 128
    NUM_EXPERTS_PER_TOKEN = 8
    MOE_HIDDEN_DIMS = 768
    MOE_RENORMALIZE = True  # norm_topk_prob
    # Qwen3's router_aux_loss_coef (0.001), pooled over its 48 layers, per layer.
    LOAD_BALANCING_WEIGHT = 0.001 / 48
    MAX_SEQ_LEN = 4096
    ICI_MESH_SHAPE = [1, 8, 1]
    PERCORE_BATCH_SIZE = 1
    LEARNING_RATE = 3e-4
    LR_COS_DECAY_END = 100000
    MAX_STEPS = 100000
