"""BaseExperiment's hyperparameters, declared in groups, each with its own checks.

The groups are BaseExperiment's bases (experiments/base.py), so every name stays a flat
UPPER_CASE attribute of an experiment (`exp.NUM_LAYERS`, `--fdl.NUM_LAYERS=`), as in Pax;
`_check` of each group runs when an experiment is created, in the order the groups are
listed there. The machinery is experiments/hyperparameters.py.
"""

import importlib.util
import math

from experiments import pax_compat
from experiments.hyperparameters import Group, class_name
from paxloom.core import batch, mesh_axes, sequence_order
from paxloom.core.errors import UserError

# Allowed values of the string hyperparameters that name a choice.
CHOICES = {
    "FPROP_DTYPE": ("float32", "bfloat16", "float16"),
    # praxis AutodiffCheckpointType names, lower case; "none" disables remat.
    "CHECKPOINT_POLICY": (
        "none",
        "save_nothing",
        "save_everything",
        "save_dot_only",
        "save_dot_with_no_batch_dims",
        "save_dot_except_logits",
        "save_dot_except_logits_ffn1",  # praxis's own default
        "save_dot_for_mlperf_200b",
        "save_qkv_out_proj",
        "save_qkv_out_proj_separate",
        "save_out_proj",
        "save_context",
        "save_encoded_and_out_proj",
        "save_iteration_input",
        "save_transformer_layer_output",
    ),
    "EMBEDDING_LOOKUP_STYLE": ("matmul", "index"),
    # layers/attention.py
    "ATTENTION_IMPL": ("praxis", "xla", "cudnn", "pallas", "flash", "auto"),
    "CONTEXT_PARALLEL_STRATEGY": ("all_gather", "ring"),
    "LORA_TARGET_LAYERS": ("all", "attention", "mlp"),
    # The mesh axis the experts are split over (layers/moe.py).
    "EXPERT_AXIS": ("data", "replica", "none"),
}
# Grouped matmuls other projects use that Paxloom has not wired in (layers/moe.py BACKENDS
# has those it has).
_OTHER_MOE_BACKENDS = {"te": "Transformer Engine's grouped GEMM",
                       "megablox": "MaxText's megablox kernel"}


def _positive(exp, *names: str) -> None:
    for name in names:
        if getattr(exp, name) <= 0:
            raise UserError(f"{name}={getattr(exp, name)} must be positive")


class Model(Group):
    """Sizes, precision, rematerialisation, attention kernel and dropout of the transformer."""

    NUM_LAYERS: int = 2
    NUM_HEADS: int = 4
    MODEL_DIMS: int = 64
    HIDDEN_DIMS: int = 256  # feed-forward hidden size
    DIMS_PER_HEAD: int = 16
    VOCAB_SIZE: int = 512
    MAX_SEQ_LEN: int = 64
    USE_REPEATED_LAYER: bool = False  # scan one layer (StackedTransformerRepeated)
    CHECKPOINT_POLICY: str = "save_nothing"  # rematerialisation policy
    FPROP_DTYPE: str = "float32"  # compute dtype; parameters stay float32
    INIT_STD: float = 0.02  # Gaussian init of every weight without its own
    SOFTMAX_INIT_STD: float = 0.02  # Gaussian init of the output (tied embedding) weights
    LAYERNORM_EPSILON: float = 1e-5  # epsilon of every norm (LayerNorm; RMSNorm in Llama)
    PACKED_INPUT: bool = True  # segment ids keep attention inside documents
    # The most segments (documents, a row's trailing padding counting as one) the packer
    # puts in one row, MaxText's max_segments_per_seq: cuDNN's packed attention sizes its
    # buffers by it (layers/attention.py), so a row of T tokens is not T possible segments.
    # The packer cuts a row short after its (M-1)-th document rather than exceed it
    # (tasks/packing.py); batches that arrive packed with more are refused. At least 2.
    MAX_SEGMENTS_PER_SEQ: int = 32
    EMBEDDING_LOOKUP_STYLE: str = "matmul"  # one-hot "matmul" (as Pax) or gather "index"
    ATTENTION_IMPL: str = "auto"  # auto | praxis | xla | cudnn | pallas (layers/attention.py)
    # Training cross-entropy over chunks of this many positions of every sequence, so only
    # one chunk's [batch, chunk, vocab] logits exist at a time (layers/softmax.py); 0, or a
    # value >= MAX_SEQ_LEN, computes it in one pass as praxis does. Parameters are the same.
    LOSS_CHUNK_LEN: int = 512
    # The transformer's projection and feed-forward matmuls in float8 with delayed scaling
    # (layers/fp8.py; Pax/Rosetta's name). Needs FP8 tensor cores (Ada, Hopper or newer);
    # on a CPU the FP8 numerics run emulated, slowly, for tests.
    USE_FP8: bool = False
    # Dropout, praxis StackedTransformer's names; None = DROPOUT_PROB.
    DROPOUT_PROB: float = 0.0
    INPUT_DROPOUT_PROB: float = 0.0  # on the stack's input (embeddings)
    ATTEN_DROPOUT_PROB: float | None = None  # on attention probabilities
    RESIDUAL_DROPOUT_PROB: float | None = None  # on each residual branch
    RELU_DROPOUT_PROB: float | None = None  # inside the feed-forward

    def _check(self) -> None:
        _positive(self, "NUM_LAYERS", "NUM_HEADS", "MODEL_DIMS", "HIDDEN_DIMS",
                  "DIMS_PER_HEAD", "VOCAB_SIZE", "MAX_SEQ_LEN")
        if self.MAX_SEGMENTS_PER_SEQ < 2:
            raise UserError(f"MAX_SEGMENTS_PER_SEQ={self.MAX_SEGMENTS_PER_SEQ} must be at least "
                            f"2: a row's trailing padding counts as one segment, so a padded "
                            f"row holds at most MAX_SEGMENTS_PER_SEQ-1 documents")
        if self.LOSS_CHUNK_LEN < 0:
            raise UserError(f"LOSS_CHUNK_LEN={self.LOSS_CHUNK_LEN} must be >= 0 (0 computes the "
                            f"loss in one pass)")
        for name in ("DROPOUT_PROB", "INPUT_DROPOUT_PROB", "ATTEN_DROPOUT_PROB",
                     "RESIDUAL_DROPOUT_PROB", "RELU_DROPOUT_PROB"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise UserError(f"{name}={value} must be a probability in [0, 1)")


# Read by layers/gpt.py (BaseExperiment.model_template), not by other model families.
GPT_ARCHITECTURE = ("ACTIVATION_CLS", "USE_GATED_ACTIVATION", "USE_BIAS", "ATTEN_LOGIT_CAP",
                    "SEPARATE_EMBEDDING", "TRAINABLE_POSITION_EMB", "TRAINABLE_PE_MAX_SEQ_LEN",
                    "COMBINE_QKV", "SOFTMAX_CAP_LOGITS")


class Architecture(Group):
    """Pax's architecture names (paxml TransformerLmSpmdAdafactor / TransformerLmSpmdAdam), at
    the values of the Pax GPU configs; read by the GPT (layers/gpt.py). A model family that
    builds its own layers (Llama) refuses values other than these defaults."""

    ACTIVATION_CLS: str | type = "GELU"  # feed-forward activation: praxis class or its name
    USE_GATED_ACTIVATION: bool = False  # gated feed-forward (a second input projection)
    USE_BIAS: bool = True  # attention projections with biases
    ATTEN_LOGIT_CAP: float = -1.0  # cap * tanh(logits / cap) on attention logits; <= 0: off
    SEPARATE_EMBEDDING: bool = False  # untied input embedding and output softmax
    TRAINABLE_POSITION_EMB: bool = True  # learned positions; False: praxis's sinusoidal ones
    TRAINABLE_PE_MAX_SEQ_LEN: int | None = None  # learned position table size; None: MAX_SEQ_LEN
    COMBINE_QKV: bool = True  # one fused q/k/v projection; False: three separate ones
    SOFTMAX_CAP_LOGITS: float | None = None  # cap * tanh(logits / cap) on the output; None/0: off
    # Rotary positions: the Llama family's (always), not the GPT's (never).
    USE_ROTARY_POSITION_EMB: bool = False

    # The names above that layers/gpt.py reads; a family whose model_template builds other
    # layers (experiments/llama.py) sets this False and refuses other values.
    reads_gpt_architecture = True

    def unused_hyperparameters(self) -> tuple[str, ...]:
        """The names of this group that this experiment's model does not read (at their
        defaults: _check refuses other values); --print_config lists them apart."""
        return () if self.reads_gpt_architecture else GPT_ARCHITECTURE

    def _check(self) -> None:
        if self.ATTEN_LOGIT_CAP > 0 and self.ATTENTION_IMPL not in ("auto", "praxis"):
            raise UserError(f"ATTEN_LOGIT_CAP={self.ATTEN_LOGIT_CAP}: ATTENTION_IMPL="
                            f"{self.ATTENTION_IMPL!r} has no attention logit cap; use "
                            f"'praxis' (or 'auto', which picks it)")
        if self.USE_ROTARY_POSITION_EMB != (not self.reads_gpt_architecture):
            raise UserError(
                f"USE_ROTARY_POSITION_EMB={self.USE_ROTARY_POSITION_EMB}: "
                + ("the GPT's positions are TRAINABLE_POSITION_EMB's (learned or sinusoidal); "
                   "rotary positions are the Llama family's (experiments/llama.py)"
                   if self.reads_gpt_architecture else
                   f"{type(self).__name__}'s layers (layers/llama.py) always use rotary "
                   f"positions"))
        if self.SOFTMAX_CAP_LOGITS is not None and not self.SOFTMAX_CAP_LOGITS >= 0:
            raise UserError(f"SOFTMAX_CAP_LOGITS={self.SOFTMAX_CAP_LOGITS} must be > 0 "
                            f"(None or 0: no cap)")
        if (self.TRAINABLE_PE_MAX_SEQ_LEN is not None
                and self.TRAINABLE_PE_MAX_SEQ_LEN < self.MAX_SEQ_LEN):
            raise UserError(f"TRAINABLE_PE_MAX_SEQ_LEN={self.TRAINABLE_PE_MAX_SEQ_LEN} is "
                            f"shorter than MAX_SEQ_LEN={self.MAX_SEQ_LEN}: positions past it "
                            f"have no embedding")
        if self.reads_gpt_architecture:
            from layers import gpt

            try:
                gpt.activation_class(self.ACTIVATION_CLS)
            except ValueError as e:
                raise UserError(str(e)) from None
            return
        for name in GPT_ARCHITECTURE:
            value, default = getattr(self, name), getattr(Architecture, name)
            if class_name(value) != class_name(default):
                raise UserError(f"{name}={class_name(value)!r}: {type(self).__name__}'s "
                                f"model_template builds its own layers and does not read "
                                f"{name} (a GPT architecture name); leave it at "
                                f"{class_name(default)!r}")


class Parallelism(Group):
    """The mesh (axes stage, replica, data, context, mdl = PP, DP, FSDP, CP, TP) and the
    batch on it."""

    # [replica, data, mdl], or [stage, replica, data, mdl] with pipeline stages (as Pax's
    # pipelined configs), or [stage, replica, data, context, mdl] with each sequence split
    # over context (context parallelism); shorter shapes have 1 for what they leave out.
    ICI_MESH_SHAPE: list[int] = [1, 8, 1]  # within a node / process
    DCN_MESH_SHAPE: list[int] = [1, 1, 1]  # across nodes / processes
    # With a context axis: keys and values gathered whole ("all_gather"), or passed around
    # the axis one device's at a time ("ring": less memory, as many steps as devices).
    CONTEXT_PARALLEL_STRATEGY: str = "all_gather"
    # GLOBAL_BATCH_SIZE = this x number of devices: the sequences of one optimizer update.
    PERCORE_BATCH_SIZE: float = 1
    # Split each update's global batch into this many sub-batches run one after another
    # inside the step; their gradients are summed, then one update (MaxText's name).
    GRADIENT_ACCUMULATION_STEPS: int = 1

    def _check(self) -> None:
        if self.PERCORE_BATCH_SIZE <= 0:
            raise UserError(f"PERCORE_BATCH_SIZE={self.PERCORE_BATCH_SIZE} must be positive")
        if self.GRADIENT_ACCUMULATION_STEPS < 1:
            raise UserError(f"GRADIENT_ACCUMULATION_STEPS={self.GRADIENT_ACCUMULATION_STEPS} "
                            f"must be >= 1 (1: one pass over the global batch per update)")
        for name in ("ICI_MESH_SHAPE", "DCN_MESH_SHAPE"):
            shape = getattr(self, name)
            if len(shape) not in (3, 4, 5) or any(d < 1 for d in shape):
                raise UserError(
                    f"{name}={shape} must be three positive sizes [replica, data, mdl], "
                    f"e.g. [8,1,1] for pure data parallelism on 8 devices, four with "
                    f"pipeline stages first, e.g. [2,1,4,1], or five with a context axis "
                    f"before mdl, [stage, replica, data, context, mdl], e.g. [1,1,2,4,1]"
                )
        context = mesh_axes.axis_size(self.ICI_MESH_SHAPE, self.DCN_MESH_SHAPE,
                                      mesh_axes.CONTEXT_AXIS)
        sequence_order.check_divisible(self.MAX_SEQ_LEN, context)
        if (context > 1 and self.CONTEXT_PARALLEL_STRATEGY == "ring"
                and self.ATTENTION_IMPL not in ("auto", "pallas", "flash")):
            raise UserError(f"CONTEXT_PARALLEL_STRATEGY='ring' computes each step with a "
                            f"flash kernel; set ATTENTION_IMPL='auto', 'pallas' or 'flash' "
                            f"(is {self.ATTENTION_IMPL!r})")


class MixtureOfExperts(Group):
    """A mixture-of-experts feed-forward (layers/moe.py: dropless top-k, Mixtral / Qwen-MoE
    style), in the model families that build one (Llama); Pax's GLaM experiments build
    praxis's GShard layer from NUM_EXPERTS and LOAD_BALANCING_WEIGHT (experiments/glam.py)."""

    NUM_EXPERTS: int = 0  # routed experts; 0: a dense feed-forward (Pax's name)
    NUM_EXPERTS_PER_TOKEN: int = 2  # top-k (Hugging Face's num_experts_per_tok)
    MOE_HIDDEN_DIMS: int | None = None  # each expert's hidden width; None: HIDDEN_DIMS
    # Every Nth decoder layer is a mixture (the last of each N, as Qwen2-MoE's
    # decoder_sparse_step); the others keep the dense feed-forward.
    MOE_LAYER_INTERVAL: int = 1
    MOE_RENORMALIZE: bool = True  # a token's top-k router weights sum to 1 (norm_topk_prob)
    MOE_SHARED_HIDDEN_DIMS: int = 0  # > 0: a shared expert every token uses (Qwen2-MoE)
    MOE_SHARED_EXPERT_GATE: bool = False  # scale the shared expert by sigmoid(x @ w)
    CAPACITY_FACTOR: float = 0.0  # 0: dropless; > 0: per-sequence expert capacity (drops)
    LOAD_BALANCING_WEIGHT: float = 0.01  # Switch/Mixtral load-balancing loss, per MoE layer
    ROUTER_Z_LOSS_WEIGHT: float = 0.0  # ST-MoE router z-loss, per MoE layer
    MOE_BACKEND: str = "ragged_dot"  # the grouped matmul: ragged_dot, tokamax, padded
    EXPERT_AXIS: str = "data"  # the mesh axis the experts are split over ("none": replicated)
    # The expert-parallel all_to_all's buffer per peer: 0: every local assignment (nothing
    # dropped); f > 0: f x a peer's mean share, what overflows it dropped (moe/dropped_fraction).
    MOE_BUFFER_FACTOR: float = 0.0

    def expert_shards(self) -> int:
        """How many ways the experts are split: the size of EXPERT_AXIS (ICI x DCN)."""
        if self.EXPERT_AXIS == "none":
            return 1
        return mesh_axes.axis_size(self.ICI_MESH_SHAPE, self.DCN_MESH_SHAPE, self.EXPERT_AXIS)

    def _check(self) -> None:
        if self.NUM_EXPERTS < 0:
            raise UserError(f"NUM_EXPERTS={self.NUM_EXPERTS} must be >= 0 (0: a dense "
                            f"feed-forward)")
        from layers.moe import BACKENDS

        if self.MOE_BACKEND not in BACKENDS:
            what = _OTHER_MOE_BACKENDS.get(self.MOE_BACKEND, "an unknown grouped matmul")
            raise UserError(f"MOE_BACKEND={self.MOE_BACKEND!r}: {what} is not wired into "
                            f"Paxloom; use one of {', '.join(BACKENDS)}")
        if self.MOE_BACKEND == "tokamax" and not importlib.util.find_spec("tokamax"):
            raise UserError("MOE_BACKEND='tokamax': tokamax is not installed; pip install "
                            "'.[moe]', or use MOE_BACKEND='ragged_dot'")
        if self.MOE_BACKEND == "tokamax":
            from importlib import metadata

            from layers.moe import tokamax_problem

            problem = tokamax_problem(metadata.version("tokamax"), metadata.version("jax"))
            if problem:
                raise UserError(f"MOE_BACKEND='tokamax': {problem}; use "
                                f"MOE_BACKEND='ragged_dot'")
        if self.MOE_BACKEND == "padded" and self.NUM_EXPERTS and self.CAPACITY_FACTOR <= 0:
            raise UserError("MOE_BACKEND='padded' computes each expert over a buffer of its "
                            "capacity; set CAPACITY_FACTOR > 0 (e.g. 1.25), or use "
                            "MOE_BACKEND='ragged_dot' (dropless)")
        if self.CAPACITY_FACTOR < 0:
            raise UserError(f"CAPACITY_FACTOR={self.CAPACITY_FACTOR} must be >= 0: 0 routes "
                            f"dropless, > 0 caps each expert at that many times its mean "
                            f"load, e.g. 1.25")
        if self.MOE_BUFFER_FACTOR < 0:
            raise UserError(f"MOE_BUFFER_FACTOR={self.MOE_BUFFER_FACTOR} must be >= 0: 0 sends "
                            f"every local assignment to each expert shard, > 0 that many "
                            f"times a shard's mean share, e.g. 2.0")
        if not self.NUM_EXPERTS:
            return
        if not 1 <= self.NUM_EXPERTS_PER_TOKEN <= self.NUM_EXPERTS:
            raise UserError(f"NUM_EXPERTS_PER_TOKEN={self.NUM_EXPERTS_PER_TOKEN} must be "
                            f"between 1 and NUM_EXPERTS={self.NUM_EXPERTS}")
        shards = self.expert_shards()
        if self.NUM_EXPERTS % shards:
            raise UserError(f"NUM_EXPERTS={self.NUM_EXPERTS} does not split over the "
                            f"{shards}-way EXPERT_AXIS={self.EXPERT_AXIS!r}; use a multiple "
                            f"of {shards} experts, or EXPERT_AXIS='none'")
        if self.MOE_LAYER_INTERVAL < 1 or self.NUM_LAYERS % self.MOE_LAYER_INTERVAL:
            raise UserError(f"MOE_LAYER_INTERVAL={self.MOE_LAYER_INTERVAL} must be >= 1 and "
                            f"divide NUM_LAYERS={self.NUM_LAYERS}")
        if self.LOAD_BALANCING_WEIGHT < 0 or self.ROUTER_Z_LOSS_WEIGHT < 0:
            raise UserError("LOAD_BALANCING_WEIGHT and ROUTER_Z_LOSS_WEIGHT must be >= 0")
        context = mesh_axes.axis_size(self.ICI_MESH_SHAPE, self.DCN_MESH_SHAPE,
                                      mesh_axes.CONTEXT_AXIS)
        if self.CAPACITY_FACTOR > 0 and context > 1:
            # Capacity keeps a sequence's earlier tokens first; with a context axis the layers
            # see the tokens in paxloom/core/sequence_order.py's order instead.
            raise UserError(f"CAPACITY_FACTOR={self.CAPACITY_FACTOR} with {context}-way "
                            f"context parallelism would drop other tokens than without it; "
                            f"route dropless (CAPACITY_FACTOR=0), or use a mesh without a "
                            f"context axis")
        if self.USE_FP8:
            raise UserError(f"NUM_EXPERTS={self.NUM_EXPERTS} with USE_FP8: FP8 for the "
                            f"experts' grouped matmuls is not built; set USE_FP8=False")
        if self.USE_LORA and self.LORA_TARGET_LAYERS != "attention":
            raise UserError(f"USE_LORA on a mixture of experts: adapters go on attention only; "
                            f"set LORA_TARGET_LAYERS='attention' (is "
                            f"{self.LORA_TARGET_LAYERS!r})")
        blocks = self.num_stages() * self.CIRCULAR_REPEAT  # of layers, in the pipeline
        if self.NUM_LAYERS % (blocks * self.MOE_LAYER_INTERVAL):
            raise UserError(f"MOE_LAYER_INTERVAL={self.MOE_LAYER_INTERVAL} over {blocks} "
                            f"pipeline blocks of NUM_LAYERS={self.NUM_LAYERS}: every block "
                            f"must hold whole runs of {self.MOE_LAYER_INTERVAL} layers; make "
                            f"NUM_LAYERS a multiple of {blocks * self.MOE_LAYER_INTERVAL}")


class Pipeline(Group):
    """Pipeline parallelism (Pax's TransformerLmSpmdPipelineAdam names; praxis
    PipelinedTransformer), used when the mesh has more than one stage."""

    NUM_STAGES: int | None = None  # None: the mesh's stage size; if set, it must equal it
    NUM_MICROBATCHES: int | None = None  # microbatches per sub-batch; or MICROBATCH_SIZE
    MICROBATCH_SIZE: int | None = None  # sequences per microbatch; or NUM_MICROBATCHES
    CIRCULAR_REPEAT: int = 1  # >1: each stage holds this many layer blocks, visited in turn
    STREAM_IO: bool = False  # stream microbatch inputs/outputs across stages (for DCN)

    def num_stages(self) -> int:
        """Pipeline stages: the stage entries of four- and five-entry ICI x DCN mesh shapes."""
        return mesh_axes.axis_size(self.ICI_MESH_SHAPE, self.DCN_MESH_SHAPE, "stage")

    def _check(self) -> None:
        """The pipeline hyperparameters against each other, the layers and the batch (the
        batch of one sub-batch: GLOBAL_BATCH_SIZE / GRADIENT_ACCUMULATION_STEPS)."""
        stages, repeat = self.num_stages(), self.CIRCULAR_REPEAT
        if self.NUM_STAGES is not None and self.NUM_STAGES != stages:
            raise UserError(f"NUM_STAGES={self.NUM_STAGES}, but the mesh has {stages} stage(s) "
                            f"(ICI_MESH_SHAPE[0] x DCN_MESH_SHAPE[0] of four-entry shapes); "
                            f"make them equal")
        if repeat < 1:
            raise UserError(f"CIRCULAR_REPEAT={repeat} must be >= 1 (1 is GPipe)")
        if stages == 1:
            return
        if self.USE_FP8:
            raise UserError("USE_FP8 with pipeline stages is not supported: praxis's pipeline "
                            "runs each stage's layers once per microbatch, and the FP8 scaling "
                            "state's update would be summed over them; use a mesh without "
                            "stages (three-entry ICI_MESH_SHAPE) or USE_FP8=False")
        if self.NUM_LAYERS % (stages * repeat):
            raise UserError(
                f"NUM_LAYERS={self.NUM_LAYERS} does not split into {stages} stages x "
                f"CIRCULAR_REPEAT={repeat} blocks of whole layers; make NUM_LAYERS a multiple "
                f"of {stages * repeat} or change the stage count (ICI_MESH_SHAPE[0])")
        if (self.NUM_MICROBATCHES is None) == (self.MICROBATCH_SIZE is None):
            raise UserError(f"a pipelined mesh ({stages} stages) needs exactly one of "
                            f"NUM_MICROBATCHES or MICROBATCH_SIZE, e.g. "
                            f"--fdl.NUM_MICROBATCHES={2 * stages}")
        try:
            microbatches = self.batch_layout().num_microbatches
        except batch.ScheduleError:
            raise
        except UserError:
            return  # a batch that does not split: the runtime says so, with the devices it has
        if repeat > 1 and microbatches < stages:
            raise UserError(f"the circular schedule (CIRCULAR_REPEAT={repeat}) needs at least "
                            f"as many microbatches as stages: {microbatches} < {stages}")
        if self.STREAM_IO and microbatches % stages:
            raise UserError(f"STREAM_IO needs a number of microbatches ({microbatches}) that "
                            f"is a multiple of the {stages} stages")


class Optimizer(Group):
    """AdamW, global-norm clipping, linear rampup + cosine decay (praxis's)."""

    LEARNING_RATE: float = 6e-4
    LR_COS_WARMUP: int = 10  # steps of linear rampup from 0
    LR_COS_DECAY_START: int = 10  # step at which cosine decay begins
    LR_COS_DECAY_END: int = 100  # step at which the rate reaches its minimum
    LR_COS_MIN_RATIO: float = 0.1  # minimum rate as a fraction of LEARNING_RATE
    LR_COS_MAX: float = 1.0  # peak multiplier of LEARNING_RATE (praxis schedule's `max`)
    ADAM_BETA1: float = 0.9
    ADAM_BETA2: float = 0.95
    ADAM_EPSILON: float = 1e-8
    ADAM_EPSILON_ROOT: float = 0.0  # inside the square root: m / (sqrt(v + this) + EPSILON)
    ADAM_CLIP_THRESHOLD: float = -1.0  # cap each tensor's update RMS (praxis); <= 0: off
    WEIGHT_DECAY: float = 0.1  # decoupled, x learning rate, on every parameter (as Pax)
    CLIP_GRADIENT_NORM_TO_VALUE: float = 1.0  # 0 disables clipping

    def _check(self) -> None:
        if not (math.isfinite(self.LEARNING_RATE) and self.LEARNING_RATE > 0):
            raise UserError(f"LEARNING_RATE={self.LEARNING_RATE} must be a positive number, "
                            f"e.g. 6e-4")
        if (self.LR_SCHEDULE != "constant"  # which reads no LR_COS_* (Pax ignores them too)
                and not self.LR_COS_WARMUP <= self.LR_COS_DECAY_START <= self.LR_COS_DECAY_END):
            raise UserError(
                f"learning-rate schedule needs LR_COS_WARMUP ({self.LR_COS_WARMUP}) <= "
                f"LR_COS_DECAY_START ({self.LR_COS_DECAY_START}) <= LR_COS_DECAY_END "
                f"({self.LR_COS_DECAY_END})"
            )
        if not (math.isfinite(self.LR_COS_MAX) and self.LR_COS_MAX > 0):
            raise UserError(f"LR_COS_MAX={self.LR_COS_MAX} must be a positive multiplier of "
                            f"LEARNING_RATE (praxis asserts max > 0)")
        if self.ADAM_EPSILON_ROOT < 0:
            raise UserError(f"ADAM_EPSILON_ROOT={self.ADAM_EPSILON_ROOT} must be >= 0")
        if self.ADAM_CLIP_THRESHOLD == 0:
            raise UserError("ADAM_CLIP_THRESHOLD=0: paxml reads 0 as its default 1.0 "
                            "(`ADAM_CLIP_THRESHOLD or 1.0`); set 1.0, or -1 for no update "
                            "clipping")


class Data(Group):
    """What the run reads (the data seam: BaseExperiment.dataset, which checks DATASET)."""

    # A registered dataset (tasks/datasets.py): "pile": The Pile under --data_dir; "sample":
    # the built-in corpus (Python's docs in Pile format); "synthetic": generated sequences;
    # "none": evaluation only; or a user's own registered name.
    DATASET: str = "synthetic"
    LAMBADA_EVAL: bool = False  # evaluate on Lambada at every eval interval
    EVAL_BATCHES: int = 4  # Pile validation batches per evaluation
    LAMBADA_MAX_EXAMPLES: int = 0  # 0 = the whole Lambada set
    # Held-out validation without code, for a dataset that takes it (DATASET="text"): files
    # (a path, glob or directory) or a share of the training documents. Pile validation runs
    # EVAL_BATCHES batches of it every EVAL_INTERVAL_STEPS.
    VALIDATION_FILES: str | None = None
    VALIDATION_FRACTION: float = 0.0
    # The jsonl key, or parquet/Arrow column, that holds each document's text: the training
    # files' and their validation files' alike (datasets that take it: "text", "pile").
    TEXT_FIELD: str = "text"
    # The tokens around every document (paxloom/core/framing.py), in training, evaluation,
    # decoding and the exported tokenizer alike. ADD_BOS: a BOS before each document; None:
    # as the tokenizer's own post-processor does (a tokenizer.json that puts a BOS first,
    # as Llama 3's; a SentencePiece model adds none, as Pax). ADD_EOS: an EOS after each.
    ADD_BOS: bool | None = None
    ADD_EOS: bool = True

    def _check(self) -> None:
        if self.ADD_BOS is False and not self.ADD_EOS:
            raise UserError("ADD_BOS=False and ADD_EOS=False: documents would have no mark "
                            "where one ends and the next begins; set --fdl.ADD_EOS=True")
        if not self.TEXT_FIELD:
            raise UserError("TEXT_FIELD='' must name the jsonl key or parquet column that "
                            "holds the text, e.g. --fdl.TEXT_FIELD=content")
        dataset = self.dataset() if self.TEXT_FIELD != "text" else None
        if dataset is not None and not getattr(dataset, "takes_text_field", False):
            raise UserError(f"TEXT_FIELD={self.TEXT_FIELD!r}: {type(self).__name__}'s dataset "
                            f"({type(dataset).__name__}) has no text field to choose; "
                            f"TEXT_FIELD is for jsonl and parquet files (DATASET='text', or "
                            f"'pile' with jsonl of your own)")
        if not 0.0 <= self.VALIDATION_FRACTION < 1.0:
            raise UserError(f"VALIDATION_FRACTION={self.VALIDATION_FRACTION} must be in "
                            f"[0, 1), e.g. 0.01")
        if self.VALIDATION_FILES and self.VALIDATION_FRACTION:
            raise UserError("VALIDATION_FILES and VALIDATION_FRACTION: set one of them")
        if ((self.VALIDATION_FILES or self.VALIDATION_FRACTION)
                and not getattr(self.dataset(), "takes_validation", False)):
            raise UserError(f"VALIDATION_FILES / VALIDATION_FRACTION: DATASET="
                            f"{self.DATASET!r} has its own validation set; they are for "
                            f"DATASET='text' (your own files)")



class StartingWeights(Group):
    """Pax's CheckpointRestoreMixin (paxloom/runner/state/initial_weights.py)."""

    # Initialise a new run's parameters from another run's job or checkpoint directory, one
    # checkpoint step directory, a Hugging Face model directory (config.json + safetensors)
    # or a Pax checkpoint (checkpoint_XXXXXXXX/); the optimizer starts fresh. Only a run
    # whose own job directory has no checkpoint reads it: a restart resumes its own.
    CHECKPOINT_RESTORE_PATH: str | None = None
    # Regexes over parameter paths ("lm/transformer/x_layers_0/ff_layer/..."): matching
    # parameters keep their fresh initialisation instead of being read.
    CHECKPOINT_IGNORE_RULES: list[str] | None = None


class LoRA(Group):
    """Pax's LoRAMixin (layers/lora.py)."""

    USE_LORA: bool = False  # train only low-rank adapters; the base weights stay frozen
    LORA_RANK: int = 8
    LORA_TARGET_LAYERS: str = "all"  # all | attention | mlp

    def _check(self) -> None:
        if self.USE_LORA and self.LORA_RANK < 1:
            raise UserError(f"LORA_RANK={self.LORA_RANK} must be >= 1 (USE_LORA=False turns "
                            f"LoRA off)")


class Loop(Group):
    """The training loop: steps, summaries, evaluation and checkpoint intervals, seeds."""

    MAX_STEPS: int = 100
    SUMMARY_INTERVAL_STEPS: int = 10
    EVAL_INTERVAL_STEPS: int = 0  # 0 = no interleaved evaluation
    CHECKPOINT_EVERY_N_STEPS: int = 0  # 0 = only at the end
    CHECKPOINT_MAX_TO_KEEP: int = 3
    SKIP_NONFINITE_STEPS: bool = False  # skip NaN/Inf steps instead of stopping
    RANDOM_SEED: int = 1234  # parameter init and dropout
    TRAIN_INPUT_RANDOM_SEED: int = 4321  # data order

    def _check(self) -> None:
        _positive(self, "MAX_STEPS", "SUMMARY_INTERVAL_STEPS")
        if self.CHECKPOINT_MAX_TO_KEEP < 0 or self.CHECKPOINT_EVERY_N_STEPS < 0:
            raise UserError("CHECKPOINT_MAX_TO_KEEP and CHECKPOINT_EVERY_N_STEPS must be >= 0 "
                            "(0 keeps every checkpoint / saves only at the end)")


class PaxDefaults(Group):
    """Pax's names accepted only at the values of its GPU configs and scripts
    (experiments/pax_compat.py says why for each); --print_config lists them apart."""

    # or "constant" (run_llama_boolq.sh with LoRA): LEARNING_RATE throughout
    LR_SCHEDULE: str = "linear_rampup_cosine_decay"
    # and each name of pax_compat.ACCEPTED_AT_DEFAULT, at its default (declared below)

    def _check(self) -> None:
        pax_compat.check(self)


pax_compat.declare_accepted_at_default(PaxDefaults)
