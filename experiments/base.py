"""BaseExperiment: every hyperparameter, declared once with its type and default.

An experiment is a class whose UPPER_CASE attributes are hyperparameters. A
subclass may only *assign* names declared here (or declared by annotation in a
parent): a misspelt attribute such as `LR_COS_MIN_RATO = 0.1` is an error when
the class is created, with the near match, instead of being silently ignored.
A user declares a new hyperparameter by annotating it (`MY_KNOB: int = 3`).

`run_config()` turns the hyperparameters into the whole run as a Fiddle graph:
model, optimizer with its schedule, input, evaluations, mesh and loop settings.
It reads the experiment and never mutates it.
"""

import math
import os
import types
import typing

import fiddle as fdl

if typing.TYPE_CHECKING:
    from praxis import pax_fiddle

    from core import data
    from core.target import TargetDevice

from core import batch
from core.errors import UserError, near_matches
from core.mesh_axes import with_stage_axis

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
    "ATTENTION_IMPL": ("praxis", "xla", "cudnn", "pallas", "auto"),
    "LORA_TARGET_LAYERS": ("all", "attention", "mlp"),
}


class BaseExperiment:
    """Defaults describe a tiny GPT that trains on one CPU; subclasses set real sizes."""

    # --- Model (GPT-3 style praxis TransformerLm) ---
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
    # Pax's architecture names (paxml TransformerLmSpmdAdafactor / TransformerLmSpmdAdam),
    # at the values of the Pax GPU configs; read by the GPT (layers/gpt.py). A model family
    # that builds its own layers (Llama) refuses values other than these defaults.
    ACTIVATION_CLS: str | type = "GELU"  # feed-forward activation: praxis class or its name
    USE_GATED_ACTIVATION: bool = False  # gated feed-forward (a second input projection)
    USE_BIAS: bool = True  # attention projections with biases
    ATTEN_LOGIT_CAP: float = -1.0  # cap * tanh(logits / cap) on attention logits; <= 0: off
    SEPARATE_EMBEDDING: bool = False  # untied input embedding and output softmax
    TRAINABLE_POSITION_EMB: bool = True  # learned positions; False: praxis's sinusoidal ones
    TRAINABLE_PE_MAX_SEQ_LEN: int | None = None  # learned position table size; None: MAX_SEQ_LEN
    COMBINE_QKV: bool = True  # one fused q/k/v projection; False: three separate ones
    SOFTMAX_CAP_LOGITS: float | None = None  # cap * tanh(logits / cap) on the output; None/0: off
    # Pax names Paxloom accepts only at the value that is its model (validate() refuses others).
    RELATIVE_BIAS: bool = False  # praxis RelativeBias in attention: not in Paxloom
    USE_ROTARY_POSITION_EMB: bool = False  # rotary positions: the Llama family's, not the GPT's
    NORM_POLICY: str = "pre"  # layer norm before each sub-layer: the only policy Paxloom has
    ENABLE_DCONV: bool = False  # Primer's depthwise convolutions on q/k/v: not in Paxloom

    # --- Parallelism (axes replica, data, mdl = DP, FSDP, TP; stage = PP) ---
    # [replica, data, mdl], or [stage, replica, data, mdl] with pipeline stages (as Pax's
    # pipelined configs); a three-entry shape has one stage.
    ICI_MESH_SHAPE: list[int] = [1, 8, 1]  # within a node / process
    # Pax's set_sharding_params_v1(training_optimized=...): Paxloom always shards for training.
    TRAINING_OPTIMIZED_SHARDING: bool = True
    DCN_MESH_SHAPE: list[int] = [1, 1, 1]  # across nodes / processes
    # GLOBAL_BATCH_SIZE = this x number of devices: the sequences of one optimizer update.
    PERCORE_BATCH_SIZE: float = 1
    # Split each update's global batch into this many sub-batches run one after another
    # inside the step; their gradients are summed, then one update (MaxText's name).
    GRADIENT_ACCUMULATION_STEPS: int = 1

    # --- Pipeline parallelism (Pax's TransformerLmSpmdPipelineAdam names; praxis
    # PipelinedTransformer). Used when the mesh has more than one stage. ---
    NUM_STAGES: int | None = None  # None: the mesh's stage size; if set, it must equal it
    NUM_MICROBATCHES: int | None = None  # microbatches per sub-batch; or MICROBATCH_SIZE
    MICROBATCH_SIZE: int | None = None  # sequences per microbatch; or NUM_MICROBATCHES
    CIRCULAR_REPEAT: int = 1  # >1: each stage holds this many layer blocks, visited in turn
    STREAM_IO: bool = False  # stream microbatch inputs/outputs across stages (for DCN)

    # --- Optimizer: AdamW, global-norm clipping, linear rampup + cosine decay ---
    LEARNING_RATE: float = 6e-4
    LR_COS_WARMUP: int = 10  # steps of linear rampup from 0
    LR_COS_DECAY_START: int = 10  # step at which cosine decay begins
    LR_COS_DECAY_END: int = 100  # step at which the rate reaches its minimum
    LR_COS_MIN_RATIO: float = 0.1  # minimum rate as a fraction of LEARNING_RATE
    LR_COS_MAX: float = 1.0  # peak multiplier of LEARNING_RATE (praxis schedule's `max`)
    LR_SCHEDULE: str = "linear_rampup_cosine_decay"  # the only schedule Paxloom has
    # Pax's exponential-decay schedule (LinearRampupExponentialDecay): unread, accepted only at
    # the values paxml's TransformerLmSpmdAdam (LR_LRED_*) / Adafactor (DECAY_END) give them.
    LR_LRED_WARMUP: int = 4000
    LR_LRED_DECAY_START: int = 4001
    LR_LRED_DECAY_END: int = 300000
    LR_LRED_MIN_RATIO: float = 0.1
    LR_LRED_MAX: float = 1.0
    DECAY_END: int = 100000  # paxml set_default_adafactor's decay_end
    ADAM_BETA1: float = 0.9
    ADAM_BETA2: float = 0.95
    ADAM_EPSILON: float = 1e-8
    ADAM_EPSILON_ROOT: float = 0.0  # inside the square root: m / (sqrt(v + this) + EPSILON)
    ADAM_CLIP_THRESHOLD: float = -1.0  # cap each tensor's update RMS (praxis); <= 0: off
    WEIGHT_DECAY: float = 0.1  # decoupled, x learning rate, on every parameter (as Pax)
    CLIP_GRADIENT_NORM_TO_VALUE: float = 1.0  # 0 disables clipping

    # --- Data (the data seam: dataset() below) ---
    # A registered dataset (tasks/datasets.py): "pile": The Pile under --data_dir; "sample":
    # the built-in corpus (Python's docs in Pile format); "synthetic": generated sequences;
    # "none": evaluation only; or a user's own registered name.
    DATASET: str = "synthetic"
    LAMBADA_EVAL: bool = False  # evaluate on Lambada at every eval interval
    EVAL_BATCHES: int = 4  # Pile validation batches per evaluation
    LAMBADA_MAX_EXAMPLES: int = 0  # 0 = the whole Lambada set

    # --- Starting weights (Pax's CheckpointRestoreMixin; runner/state/initial_weights.py) ---
    # Initialise a new run's parameters from another run's job or checkpoint directory, one
    # checkpoint step directory, a Hugging Face model directory (config.json + safetensors)
    # or a Pax checkpoint (checkpoint_XXXXXXXX/); the optimizer starts fresh. Only a run
    # whose own job directory has no checkpoint reads it: a restart resumes its own.
    CHECKPOINT_RESTORE_PATH: str | None = None
    # Regexes over parameter paths ("lm/transformer/x_layers_0/ff_layer/..."): matching
    # parameters keep their fresh initialisation instead of being read.
    CHECKPOINT_IGNORE_RULES: list[str] | None = None

    # --- LoRA (Pax's LoRAMixin; layers/lora.py) ---
    USE_LORA: bool = False  # train only low-rank adapters; the base weights stay frozen
    LORA_RANK: int = 8
    LORA_TARGET_LAYERS: str = "all"  # all | attention | mlp

    # --- Loop ---
    MAX_STEPS: int = 100
    SUMMARY_INTERVAL_STEPS: int = 10
    EVAL_INTERVAL_STEPS: int = 0  # 0 = no interleaved evaluation
    CHECKPOINT_EVERY_N_STEPS: int = 0  # 0 = only at the end
    CHECKPOINT_MAX_TO_KEEP: int = 3
    SKIP_NONFINITE_STEPS: bool = False  # skip NaN/Inf steps instead of stopping

    # --- Seeds ---
    RANDOM_SEED: int = 1234  # parameter init and dropout
    TRAIN_INPUT_RANDOM_SEED: int = 4321  # data order

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        declared = cls.hyperparameter_types()
        own_annotations = cls.__dict__.get("__annotations__", {})
        for name, value in vars(cls).items():
            if not _is_hyperparameter_name(name):
                continue
            if name in PAX_REFUSED:
                raise UserError(f"{cls.__module__}.{cls.__name__} sets {name}: "
                                f"{PAX_REFUSED[name]}")
            if name not in declared:
                raise UserError(
                    f"{cls.__module__}.{cls.__name__} sets {name}, which is not a declared "
                    f"hyperparameter{near_matches(name, declared)}; to add a new one, "
                    f"annotate it: `{name}: int = ...`"
                )
            if name not in own_annotations:
                _check_value(f"{cls.__name__}.{name}", name, value, declared[name])

    @classmethod
    def hyperparameter_types(cls) -> dict[str, type]:
        """Declared hyperparameter names and their types, base class first."""
        types: dict[str, type] = {}
        for klass in reversed(cls.__mro__):
            for name, hint in vars(klass).get("__annotations__", {}).items():
                if _is_hyperparameter_name(name):
                    types[name] = hint
        return types

    def __init__(self, **overrides):
        """An experiment instance: class defaults plus `overrides` (from `--fdl.NAME=VALUE`)."""
        declared = self.hyperparameter_types()
        for name, value in overrides.items():
            if name not in declared:
                raise UserError(
                    f"--fdl.{name}: {type(self).__name__} has no hyperparameter {name}"
                    f"{near_matches(name, declared)}"
                )
            _check_value(f"--fdl.{name}", name, value, declared[name])
            if float in (declared[name], _optional_of(declared[name])) and value is not None:
                value = float(value)
            elif isinstance(value, tuple):
                value = list(value)
            setattr(self, name, value)
        self.validate()

    def hyperparameters(self) -> dict[str, typing.Any]:
        """The effective value of every hyperparameter, in declaration order. A class (Pax's
        `ACTIVATION_CLS = layers.GELU`) is given by name, as `--fdl.NAME=` takes it back."""
        return {name: _class_name(getattr(self, name)) for name in self.hyperparameter_types()}

    def validate(self) -> None:
        """Checks that need several hyperparameters at once. Raise UserError."""
        for name in ("NUM_LAYERS", "NUM_HEADS", "MODEL_DIMS", "HIDDEN_DIMS", "DIMS_PER_HEAD",
                     "VOCAB_SIZE", "MAX_SEQ_LEN", "MAX_STEPS", "SUMMARY_INTERVAL_STEPS"):
            if getattr(self, name) <= 0:
                raise UserError(f"{name}={getattr(self, name)} must be positive")
        if self.LOSS_CHUNK_LEN < 0:
            raise UserError(f"LOSS_CHUNK_LEN={self.LOSS_CHUNK_LEN} must be >= 0 (0 computes the "
                            f"loss in one pass)")
        if self.PERCORE_BATCH_SIZE <= 0:
            raise UserError(f"PERCORE_BATCH_SIZE={self.PERCORE_BATCH_SIZE} must be positive")
        if self.GRADIENT_ACCUMULATION_STEPS < 1:
            raise UserError(f"GRADIENT_ACCUMULATION_STEPS={self.GRADIENT_ACCUMULATION_STEPS} "
                            f"must be >= 1 (1: one pass over the global batch per update)")
        for name in ("ICI_MESH_SHAPE", "DCN_MESH_SHAPE"):
            shape = getattr(self, name)
            if len(shape) not in (3, 4) or any(d < 1 for d in shape):
                raise UserError(
                    f"{name}={shape} must be three positive sizes [data, fsdp, tensor], "
                    f"e.g. [8,1,1] for pure data parallelism on 8 devices, or four with "
                    f"pipeline stages first, e.g. [2,1,4,1]"
                )
        self._validate_pipeline()
        if not (math.isfinite(self.LEARNING_RATE) and self.LEARNING_RATE > 0):
            raise UserError(f"LEARNING_RATE={self.LEARNING_RATE} must be a positive number, "
                            f"e.g. 6e-4")
        if self.CHECKPOINT_MAX_TO_KEEP < 0 or self.CHECKPOINT_EVERY_N_STEPS < 0:
            raise UserError("CHECKPOINT_MAX_TO_KEEP and CHECKPOINT_EVERY_N_STEPS must be >= 0 "
                            "(0 keeps every checkpoint / saves only at the end)")
        if not self.LR_COS_WARMUP <= self.LR_COS_DECAY_START <= self.LR_COS_DECAY_END:
            raise UserError(
                f"learning-rate schedule needs LR_COS_WARMUP ({self.LR_COS_WARMUP}) <= "
                f"LR_COS_DECAY_START ({self.LR_COS_DECAY_START}) <= LR_COS_DECAY_END "
                f"({self.LR_COS_DECAY_END})"
            )
        for name in ("DROPOUT_PROB", "INPUT_DROPOUT_PROB", "ATTEN_DROPOUT_PROB",
                     "RESIDUAL_DROPOUT_PROB", "RELU_DROPOUT_PROB"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise UserError(f"{name}={value} must be a probability in [0, 1)")
        if self.USE_FP8 and self.num_stages() > 1:
            raise UserError("USE_FP8 with pipeline stages is not supported: praxis's pipeline "
                            "runs each stage's layers once per microbatch, and the FP8 scaling "
                            "state's update would be summed over them; use a mesh without "
                            "stages (three-entry ICI_MESH_SHAPE) or USE_FP8=False")
        if self.USE_LORA and self.LORA_RANK < 1:
            raise UserError(f"LORA_RANK={self.LORA_RANK} must be >= 1 (USE_LORA=False turns "
                            f"LoRA off)")
        self._validate_pax_names()
        if type(self).dataset is BaseExperiment.dataset:
            self.dataset()  # an unregistered DATASET fails now, with its near match

    # The Pax architecture names layers/gpt.py reads; a family whose model_template builds
    # other layers (experiments/llama.py) sets this False and refuses other values.
    reads_gpt_architecture = True

    def _validate_pax_names(self) -> None:
        """Pax's names Paxloom honours only in part: one line naming the value and why."""
        if self.LR_SCHEDULE != "linear_rampup_cosine_decay":
            raise UserError(f"LR_SCHEDULE={self.LR_SCHEDULE!r}: Paxloom has only praxis's "
                            f"'linear_rampup_cosine_decay' (LR_COS_*), not Pax's "
                            f"LinearRampupExponentialDecay (LR_LRED_*)")
        if not (math.isfinite(self.LR_COS_MAX) and self.LR_COS_MAX > 0):
            raise UserError(f"LR_COS_MAX={self.LR_COS_MAX} must be a positive multiplier of "
                            f"LEARNING_RATE (praxis asserts max > 0)")
        if self.ADAM_EPSILON_ROOT < 0:
            raise UserError(f"ADAM_EPSILON_ROOT={self.ADAM_EPSILON_ROOT} must be >= 0")
        if self.ADAM_CLIP_THRESHOLD == 0:
            raise UserError("ADAM_CLIP_THRESHOLD=0: paxml reads 0 as its default 1.0 "
                            "(`ADAM_CLIP_THRESHOLD or 1.0`); set 1.0, or -1 for no update "
                            "clipping")
        if self.ATTEN_LOGIT_CAP > 0 and self.ATTENTION_IMPL not in ("auto", "praxis"):
            raise UserError(f"ATTEN_LOGIT_CAP={self.ATTEN_LOGIT_CAP}: ATTENTION_IMPL="
                            f"{self.ATTENTION_IMPL!r} has no attention logit cap; use "
                            f"'praxis' (or 'auto', which picks it)")
        lred = {name: getattr(self, name) for name in PAX_EXPONENTIAL_DECAY}
        for name, value in lred.items():
            if value != getattr(BaseExperiment, name):
                what = "DECAY_END ends" if name == "DECAY_END" else "LR_LRED_* configure"
                raise UserError(f"{name}={value}: {what} Pax's exponential-decay schedule "
                                f"(LinearRampupExponentialDecay), which Paxloom does not have; "
                                f"set LR_COS_*")
        if self.RELATIVE_BIAS:
            raise UserError(f"RELATIVE_BIAS={self.RELATIVE_BIAS}: praxis's RelativeBias "
                            f"(bucketed relative position bias) is not in Paxloom's models")
        if self.USE_ROTARY_POSITION_EMB != (not self.reads_gpt_architecture):
            raise UserError(
                f"USE_ROTARY_POSITION_EMB={self.USE_ROTARY_POSITION_EMB}: "
                + ("the GPT's positions are TRAINABLE_POSITION_EMB's (learned or sinusoidal); "
                   "rotary positions are the Llama family's (experiments/llama.py)"
                   if self.reads_gpt_architecture else
                   f"{type(self).__name__}'s layers (layers/llama.py) always use rotary "
                   f"positions"))
        if self.NORM_POLICY != "pre":
            raise UserError(f"NORM_POLICY={self.NORM_POLICY!r}: Paxloom's models are pre-norm "
                            f"only ('pre'; the Hugging Face export reads no other)")
        if self.ENABLE_DCONV:
            raise UserError(f"ENABLE_DCONV={self.ENABLE_DCONV}: Primer's depthwise convolutions "
                            f"on q/k/v (praxis dconv_qkv) are not in Paxloom's attention")
        if not self.TRAINING_OPTIMIZED_SHARDING:
            raise UserError("TRAINING_OPTIMIZED_SHARDING=False: Paxloom always shards for "
                            "training (set_sharding_params_v1(training_optimized=True) in "
                            "runner/state/partitioning.py)")
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
            value, default = getattr(self, name), getattr(BaseExperiment, name)
            if _class_name(value) != _class_name(default):
                raise UserError(f"{name}={_class_name(value)!r}: {type(self).__name__}'s "
                                f"model_template builds its own layers and does not read "
                                f"{name} (a GPT architecture name); leave it at "
                                f"{_class_name(default)!r}")

    def num_stages(self) -> int:
        """Pipeline stages: the stage entries of a four-entry ICI x DCN mesh shape."""
        return math.prod(shape[0] for shape in (self.ICI_MESH_SHAPE, self.DCN_MESH_SHAPE)
                         if len(shape) == 4)

    def batch_layout(self) -> batch.BatchLayout:
        """Global batch, sub-batches and microbatches on this mesh (core/batch.py), or
        UserError naming what to change."""
        mesh = [i * d for i, d in zip(with_stage_axis(self.ICI_MESH_SHAPE),
                                      with_stage_axis(self.DCN_MESH_SHAPE), strict=True)]
        return batch.layout(self.PERCORE_BATCH_SIZE, mesh, self.GRADIENT_ACCUMULATION_STEPS,
                            num_microbatches=self.NUM_MICROBATCHES,
                            microbatch_size=self.MICROBATCH_SIZE)

    def _validate_pipeline(self) -> None:
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

    # --- The model seam -------------------------------------------------------------

    def model_template(self) -> "pax_fiddle.Config":
        """The model: an unsharded praxis LanguageModel config (here, the Pax GPU GPT).

        Override it to build another family (experiments/llama.py), or call super()
        and swap a layer template (attention, feed-forward, norm). Sharding for the
        mesh is added afterwards by the runtime (runner/state/partitioning.py).
        """
        from layers import gpt

        return gpt.gpt_model(
            self.transformer_stack(),
            model_dims=self.MODEL_DIMS,
            vocab_size=self.VOCAB_SIZE,
            max_seq_len=self.MAX_SEQ_LEN,
            packed_input=self.PACKED_INPUT,
            fprop_dtype=self.FPROP_DTYPE,
            init_std=self.INIT_STD,
            softmax_init_std=self.SOFTMAX_INIT_STD,
            layernorm_epsilon=self.LAYERNORM_EPSILON,
            embedding_lookup_style=self.EMBEDDING_LOOKUP_STYLE,
            loss_chunk_len=self.loss_chunk_len(),
            activation=self.ACTIVATION_CLS,
            use_gated_activation=self.USE_GATED_ACTIVATION,
            use_bias=self.USE_BIAS,
            atten_logit_cap=self.ATTEN_LOGIT_CAP,
            separate_embedding=self.SEPARATE_EMBEDDING,
            trainable_position_emb=self.TRAINABLE_POSITION_EMB,
            trainable_pe_max_seq_len=self.TRAINABLE_PE_MAX_SEQ_LEN,
            combine_qkv=self.COMBINE_QKV,
            softmax_cap_logits=self.SOFTMAX_CAP_LOGITS,
        )

    def loss_chunk_len(self) -> int:
        """LOSS_CHUNK_LEN as the model builders take it: 0 where one chunk would hold the
        whole sequence, so that such a model keeps praxis's own softmax class."""
        return self.LOSS_CHUNK_LEN if self.LOSS_CHUNK_LEN < self.MAX_SEQ_LEN else 0

    def transformer_stack(self) -> "pax_fiddle.Config":
        """The stack of decoder layers with praxis's default layers (layers/stack.py)."""
        from layers import stack

        return stack.transformer_stack(
            num_layers=self.NUM_LAYERS,
            model_dims=self.MODEL_DIMS,
            hidden_dims=self.HIDDEN_DIMS,
            num_heads=self.NUM_HEADS,
            dims_per_head=self.DIMS_PER_HEAD,
            packed_input=self.PACKED_INPUT,
            use_repeated_layer=self.USE_REPEATED_LAYER,
            checkpoint_policy_name=self.CHECKPOINT_POLICY,
            dropout_prob=self.DROPOUT_PROB,
            input_dropout_prob=self.INPUT_DROPOUT_PROB,
            atten_dropout_prob=self.ATTEN_DROPOUT_PROB,
            residual_dropout_prob=self.RESIDUAL_DROPOUT_PROB,
            relu_dropout_prob=self.RELU_DROPOUT_PROB,
        )

    # --- The data seam -------------------------------------------------------------

    def dataset(self) -> "data.Dataset":
        """What the run trains and evaluates on (core/data.py's Dataset protocol).

        Default: the dataset registered under DATASET (tasks/datasets.py). Override it to
        train on your own files (`tasks.text.TextFiles(train="data/*.jsonl.gz", ...)`) or
        to return any dataset of your own.
        """
        from tasks import datasets

        return datasets.lookup(self.DATASET)

    def data_settings(self, data_dir: str | None = None, vocab_path: str | None = None,
                      cache_dir: str | None = None) -> "data.DataSettings":
        """The hyperparameters a dataset reads, and where the flags say data live. Without
        a --vocab_path, a run that starts from a Hugging Face model directory encodes with
        that model's own tokenizer.json."""
        from core import data

        if vocab_path is None and self.CHECKPOINT_RESTORE_PATH:
            model_tokenizer = os.path.join(self.CHECKPOINT_RESTORE_PATH, "tokenizer.json")
            vocab_path = model_tokenizer if os.path.isfile(model_tokenizer) else None

        return data.DataSettings(
            seq_len=self.MAX_SEQ_LEN, vocab_size=self.VOCAB_SIZE,
            seed=self.TRAIN_INPUT_RANDOM_SEED, packed=self.PACKED_INPUT,
            eval_batches=self.EVAL_BATCHES, lambada_eval=self.LAMBADA_EVAL,
            lambada_max_examples=self.LAMBADA_MAX_EXAMPLES, data_dir=data_dir,
            vocab_path=vocab_path, cache_dir=cache_dir)

    def train_dataset(self, settings: "data.DataSettings"):
        """The train input's graph node (None: evaluation only). Default: the dataset's."""
        return self.dataset().train_input(settings)

    def evaluations(self, settings: "data.DataSettings") -> list:
        """The evaluation sets' graph nodes. Default: the dataset's; extend with super()."""
        return list(self.dataset().evaluations(settings))

    # --- The callback seam ---------------------------------------------------------

    def callbacks(self) -> list:
        """Extra training-loop callbacks (core.callbacks.Callback) for this
        experiment, beside the built-in ones the launcher adds."""
        return []

    def run_config(self, data_dir: str | None = None, vocab_path: str | None = None,
                   cache_dir: str | None = None, target: "TargetDevice | None" = None
                   ) -> fdl.Config:
        """The whole run as a Fiddle graph (see experiments/run_graph.py).

        `data_dir`, `vocab_path` and `cache_dir` (tokenized data) say where this machine
        keeps the data; they are not hyperparameters, so they come from flags.
        `target` (core/target.py): the devices to build for, this process's by default
        (--mode=plan passes the GPU it plans for).
        """
        from experiments import run_graph

        return run_graph.build_run_config(self, data_dir=data_dir, vocab_path=vocab_path,
                                          cache_dir=cache_dir, target=target)

    @classmethod
    def command(cls) -> str:
        """The command line that runs this experiment (also in each docstring)."""
        return f"python main.py --fdl_config={cls.__module__}.{cls.__name__} --job_log_dir=runs/{cls.__name__}"


# Read by layers/gpt.py (BaseExperiment.model_template), not by other model families.
GPT_ARCHITECTURE = ("ACTIVATION_CLS", "USE_GATED_ACTIVATION", "USE_BIAS", "ATTEN_LOGIT_CAP",
                    "SEPARATE_EMBEDDING", "TRAINABLE_POSITION_EMB", "TRAINABLE_PE_MAX_SEQ_LEN",
                    "COMBINE_QKV", "SOFTMAX_CAP_LOGITS")

# Pax's exponential-decay schedule names, accepted at their paxml defaults only.
PAX_EXPONENTIAL_DECAY = ("LR_LRED_WARMUP", "LR_LRED_DECAY_START", "LR_LRED_DECAY_END",
                         "LR_LRED_MIN_RATIO", "LR_LRED_MAX", "DECAY_END")

# Names a Pax config sets that Paxloom refuses at class creation, with the reason.
PAX_REFUSED = {
    "R_COS_MIN_RATIO": "a typo in paxml's GPU configs (GPT126M), which Pax never read (its "
                       "minimum ratio is the inherited LR_COS_MIN_RATIO = 0.1); set "
                       "LR_COS_MIN_RATIO",
}


def _class_name(value):
    """A class as the name ACTIVATION_CLS takes back: praxis activations by bare name,
    others as module.Class; any other value as it is."""
    if not isinstance(value, type):
        return value
    from praxis.layers import activations

    if getattr(activations, value.__name__, None) is value:
        return value.__name__
    return f"{value.__module__}.{value.__qualname__}"


def _is_hyperparameter_name(name: str) -> bool:
    return (name.isupper() and not name.startswith("_")
            and name not in ("CHOICES", "GPT_ARCHITECTURE", "PAX_REFUSED",
                             "PAX_EXPONENTIAL_DECAY"))


def _type_name(hint) -> str:
    if _optional_of(hint) is not None:
        return f"{_type_name(_optional_of(hint))} or None"
    return str(hint) if typing.get_origin(hint) else hint.__name__


def _optional_of(hint):
    """T for a `T | None` hint, else None."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return inner
    return None


def _check_value(where: str, name: str, value, hint) -> None:
    """Raise UserError unless `value` fits the declared type (and choices) of `name`."""
    if not _fits(value, hint):
        example = {int: "8", float: "0.5", bool: "True", str: '"bfloat16"',
                   list[str]: '["^.*lora.*$"]'}.get(_optional_of(hint) or hint, "[1,8,1]")
        raise UserError(
            f"{where}={value!r} has type {type(value).__name__}, but {name} is "
            f"{_type_name(hint)} (e.g. {example})"
        )
    if name in CHOICES and value not in CHOICES[name]:
        raise UserError(
            f"{where}={value!r} is not one of {', '.join(CHOICES[name])}"
            f"{near_matches(str(value), CHOICES[name])}"
        )


def _fits(value, hint) -> bool:
    """`value` is of the declared type `hint` (T, list[T], or either `| None`)."""
    if _optional_of(hint) is not None:
        return value is None or _fits(value, _optional_of(hint))
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, (list, tuple)) and all(_is_instance(v, item) for v in value)
    return _is_instance(value, hint)


def _is_instance(value, hint) -> bool:
    if hint is float:  # an int is a fine float; a bool is not a number here
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)
