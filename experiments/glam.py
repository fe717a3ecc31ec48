"""Pax's GLaM experiments (mixtures of experts on praxis's GShard layers) and a tiny CPU one.

Every value of GLaM126M64EBase and GLaM64B64EBase is copied from paxml's
`paxml/contrib/gpu/scripts_gpu/configs.py` (head), with what they inherit from its
GPT126MBase (here experiments.GPT126M); the model is layers/glam.py, built with the
arguments of their `task()`. paxml defines PileGLaM126M64E, PileGLaM64B64E,
LambadaGLaM126M64E and LambadaGLaM64B64E without registering them; here they are
registered, so both `--fdl_config=experiments.PileGLaM126M64E` and Pax's
`--fdl_config=paxml.contrib.gpu.scripts_gpu.configs.PileGLaM126M64E` run them.

What Pax's task() derives, and where it is here:
- each mixture layer's load-balancing weight is LOAD_BALANCING_WEIGHT / (NUM_LAYERS / 2),
  the total spread over the NUM_LAYERS / 2 mixture layers (`moe_load_balance_loss_weight`
  of the graph's moe_layer_tpl);
- the routing groups are the product of the mesh's data-parallel axes, ICI and DCN
  (`num_groups`), each with a capacity of CAPACITY_FACTOR x its share of the tokens
  (Pax: 2.0, written into task(); here the MixtureOfExperts group's CAPACITY_FACTOR);
- the experts are split over the `data` axis (praxis's set_sharding_params_v1, which the
  runtime applies to every model: paxloom/runner/state/partitioning.py).
Differences, each on purpose:
- The names Pax's GLaM task() does not read (the GPT's architecture names, LAYERNORM_EPSILON:
  GLaM's RMSNorm keeps praxis's 1e-6, SOFTMAX_INIT_STD, the dropless layer's MoE names)
  are not read here either; they keep what GLaM inherits, and another value is refused
  rather than silently ignored.
- DIMS_PER_HEAD is the head size, where Pax's task() computes MODEL_DIMS // NUM_HEADS (the
  same in both configs); MOE_HIDDEN_DIMS is the experts' width (None: HIDDEN_DIMS, Pax's).
- NUM_GPUS is declared with Pax's values and read by nothing, as in Pax once its class is
  defined (the mesh shapes were computed from it then).
- ATTENTION_IMPL is 'praxis': the fused kernels have no relative position bias.
- Pax's model reports Lambada's strict accuracy itself (`report_strict_acc`); here the
  Lambada evaluation does, as for the GPT. DCN_MESH_SHAPE and the evaluations: as
  experiments/gpt.py says for the GPT.
"""

import math

from experiments import groups
from experiments.base import BaseExperiment
from experiments.gpt import GPT126M
from experiments.hyperparameters import class_name
from experiments.recipes import SampleCorpusOnCPU
from experiments.registry import register
from paxloom.core.errors import UserError

# The names a GLaM model reads from the MixtureOfExperts group; the rest of that group
# configures the dropless layer (layers/moe.py) and must keep GLaM's values.
_MOE_NAMES_READ = ("NUM_EXPERTS", "MOE_HIDDEN_DIMS", "CAPACITY_FACTOR", "LOAD_BALANCING_WEIGHT")


class GLaMBase(BaseExperiment):
    """GLaM: [MoE, dense] decoder blocks on praxis's GShard layers (layers/glam.py); a
    subclass sets the sizes. Not registered."""

    # Pax's: the GPUs its configs compute their mesh shapes from, once, when the class is
    # defined. Read by nothing else, in Pax or here: the mesh shapes decide (so a mesh
    # override, or a tool running the model on one device, needs no NUM_GPUS).
    NUM_GPUS: int = 8
    # GShard's softmax z-loss: Z_LOSS_WEIGHT x logsumexp(logits)^2 of the output layer, added
    # to the loss (not the router's z-loss, ROUTER_Z_LOSS_WEIGHT, which GLaM does not have).
    Z_LOSS_WEIGHT: float = 0.0

    NUM_EXPERTS = 8
    CAPACITY_FACTOR = 2.0  # Pax's task(): GShard's top-2 capacity factor
    LOAD_BALANCING_WEIGHT = 0.01  # the whole model's; each mixture layer gets its share
    ATTENTION_IMPL = "praxis"

    def validate(self) -> None:
        super().validate()
        if self.NUM_EXPERTS < 1:
            raise UserError(f"NUM_EXPERTS={self.NUM_EXPERTS}: GLaM's blocks hold a mixture of "
                            f"experts; use at least 1 (e.g. 8)")
        if self.NUM_LAYERS % 2:
            raise UserError(f"NUM_LAYERS={self.NUM_LAYERS}: GLaM's layers come in [MoE, dense] "
                            f"pairs; use an even number")
        if self.CAPACITY_FACTOR <= 0:
            raise UserError(f"CAPACITY_FACTOR={self.CAPACITY_FACTOR}: GShard's top-2 gating "
                            f"always caps the experts (it has no dropless mode); use e.g. 2.0")
        if self.LOAD_BALANCING_WEIGHT <= 0:
            raise UserError(f"LOAD_BALANCING_WEIGHT={self.LOAD_BALANCING_WEIGHT}: praxis's GShard "
                            f"layer needs a positive load-balancing weight, e.g. 0.01")
        if self.Z_LOSS_WEIGHT < 0:
            raise UserError(f"Z_LOSS_WEIGHT={self.Z_LOSS_WEIGHT} must be >= 0 (0: no z-loss)")
        if self.ATTENTION_IMPL != "praxis":
            raise UserError(f"ATTENTION_IMPL={self.ATTENTION_IMPL!r}: GLaM's attention has "
                            f"relative position biases, which only 'praxis' computes")
        if self.num_stages() > 1:
            raise UserError(f"{self.num_stages()} pipeline stages: praxis's GShard layer routes "
                            f"in groups over every data axis, the stages' included (Pax's GLaM "
                            f"has no pipeline); use a three-entry ICI_MESH_SHAPE, or a Llama "
                            f"family mixture (NUM_EXPERTS on experiments.LlamaBase)")
        if self.USE_LORA:
            raise UserError("USE_LORA: GLaM's attention projections keep their heads combined "
                            "([D, N*H], GShard's layout), which layers/lora.py's adapters do not "
                            "take; set USE_LORA=False")
        for name in self.unused_hyperparameters():
            value, own = getattr(self, name), getattr(type(self), name)
            if class_name(value) != class_name(own):
                raise UserError(f"{name}={class_name(value)!r}: GLaM's layers (layers/glam.py, "
                                f"as Pax's GLaM) do not read {name}; leave it at "
                                f"{class_name(own)!r}")

    def unused_hyperparameters(self) -> tuple[str, ...]:
        """The names GLaM's layers do not read (as Pax's GLaM task() does not)."""
        model = ("LAYERNORM_EPSILON", "SOFTMAX_INIT_STD", "EMBEDDING_LOOKUP_STYLE",
                 "LOSS_CHUNK_LEN")
        moe = [name for name in vars(groups.MixtureOfExperts)["__annotations__"]
               if name not in _MOE_NAMES_READ]
        return (*model, *groups.GPT_ARCHITECTURE, *moe)

    def num_groups(self) -> int:
        """GShard's routing groups: the data-parallel devices (Pax: the product of every
        mesh axis but the last, the tensor axis, ICI and DCN)."""
        return math.prod(self.ICI_MESH_SHAPE[:-1]) * math.prod(self.DCN_MESH_SHAPE[:-1])

    def model_template(self):
        from layers import glam

        return glam.glam_model(
            num_layers=self.NUM_LAYERS, model_dims=self.MODEL_DIMS, hidden_dims=self.HIDDEN_DIMS,
            moe_hidden_dims=self.MOE_HIDDEN_DIMS or self.HIDDEN_DIMS,
            num_heads=self.NUM_HEADS, dims_per_head=self.DIMS_PER_HEAD,
            vocab_size=self.VOCAB_SIZE,
            num_experts=self.NUM_EXPERTS, num_groups=self.num_groups(),
            capacity_factor=self.CAPACITY_FACTOR,
            moe_load_balance_loss_weight=self.LOAD_BALANCING_WEIGHT / (self.NUM_LAYERS / 2),
            z_loss_weight=self.Z_LOSS_WEIGHT,
            use_repeated_layer=self.USE_REPEATED_LAYER,
            checkpoint_policy_name=self.CHECKPOINT_POLICY,
            packed_input=self.PACKED_INPUT, fprop_dtype=self.FPROP_DTYPE,
            init_std=self.INIT_STD, dropout=self.dropout(),
        )


class GLaM126M64EBase(GLaMBase, GPT126M):
    """GPT126M's sizes and recipe with 64 experts in every other layer, on 64 GPUs. Not
    registered (as in paxml): PileGLaM126M64E and LambadaGLaM126M64E are."""

    NUM_GPUS = 64
    NUM_EXPERTS = 64
    ICI_MESH_SHAPE = [1, 64, 1]
    DCN_MESH_SHAPE = [1, 1, 1]
    USE_REPEATED_LAYER = False
    PERCORE_BATCH_SIZE = 4
    LOAD_BALANCING_WEIGHT = 0.01
    Z_LOSS_WEIGHT = 0.0


class GLaM64B64EBase(GLaM126M64EBase):
    """GLaM 64B/64E (Du et al. 2022, table 4): 64 layers 8192 wide, 64 experts, on 64 nodes
    of 8 GPUs (8-way tensor parallelism within a node, the experts across nodes). Not
    registered (as in paxml): PileGLaM64B64E and LambadaGLaM64B64E are."""

    MAX_SEQ_LEN = 1024
    NUM_GPUS = 512
    DCN_MESH_SHAPE = [1, 64, 1]
    ICI_MESH_SHAPE = [1, 1, 8]
    NUM_LAYERS = 64
    NUM_HEADS = 64
    DIMS_PER_HEAD = 128
    MODEL_DIMS = 8192
    HIDDEN_DIMS = 32768
    NUM_EXPERTS = 64
    USE_REPEATED_LAYER = True
    CHECKPOINT_POLICY = "save_nothing"  # praxis's GLaM helper's remat of each block
    ADAM_BETA1 = 0.0
    ADAM_BETA2 = 0.99
    CLIP_GRADIENT_NORM_TO_VALUE = 1.0
    PERCORE_BATCH_SIZE = 4
    # Pax: "in units of steps for BS 1k"; its global batch is 4 x 512 = 2048 sequences.
    LEARNING_RATE = 2e-5
    LR_SCHEDULE = "linear_rampup_cosine_decay"
    LR_COS_WARMUP = 398
    LR_COS_DECAY_START = 399
    LR_COS_DECAY_END = 162900
    LR_COS_MAX = 1.0
    LR_COS_MIN_RATIO = 0.1
    EVAL_INTERVAL_STEPS = 100
    SUMMARY_INTERVAL_STEPS = 10
    CHECKPOINT_EVERY_N_STEPS = 100
    CHECKPOINT_MAX_TO_KEEP = 2


@register
class PileGLaM126M64E(GLaM126M64EBase):
    """GLaM126M64EBase on The Pile (paxml scripts_gpu configs.PileGLaM126M64E).

    VOCAB_PATH=spm.model python main.py --fdl_config=experiments.PileGLaM126M64E --data_dir=$TFDS_DATA_DIR --job_log_dir=runs/pile-glam126m64e
    """


@register
class PileGLaM64B64E(GLaM64B64EBase):
    """GLaM64B64EBase on The Pile (paxml scripts_gpu configs.PileGLaM64B64E).

    VOCAB_PATH=spm.model python main.py --fdl_config=experiments.PileGLaM64B64E --data_dir=$TFDS_DATA_DIR --job_log_dir=runs/pile-glam64b64e
    """


@register
class LambadaGLaM126M64E(GLaM126M64EBase):
    """Zero-shot Lambada evaluation of a GLaM126M64E checkpoint (configs.LambadaGLaM126M64E).

    VOCAB_PATH=spm.model python main.py --fdl_config=experiments.LambadaGLaM126M64E --mode=eval --data_dir=$TFDS_DATA_DIR --job_log_dir=runs/pile-glam126m64e
    """

    DATASET = "none"
    LAMBADA_EVAL = True


@register
class LambadaGLaM64B64E(GLaM64B64EBase):
    """Zero-shot Lambada evaluation of a GLaM64B64E checkpoint (configs.LambadaGLaM64B64E).

    VOCAB_PATH=spm.model python main.py --fdl_config=experiments.LambadaGLaM64B64E --mode=eval --data_dir=$TFDS_DATA_DIR --job_log_dir=runs/pile-glam64b64e
    """

    DATASET = "none"
    LAMBADA_EVAL = True


@register
class GLaMTiny(SampleCorpusOnCPU, GLaMBase):
    """4 layers x 64 (2 of them with 8 experts, split over the data axis) on the built-in
    sample corpus, 8 fake CPU devices (like Tiny).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py --fdl_config=experiments.GLaMTiny --job_log_dir=runs/glam-tiny
    """

    NUM_GPUS = 8
    NUM_EXPERTS = 8
    NUM_LAYERS = 4
    ICI_MESH_SHAPE = [1, 8, 1]
