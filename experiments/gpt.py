"""The GPT experiments of the Pax GPU configs (126M, 5B, 175B) and a tiny CPU one.

Every value of GPT126M, GPT5B and GPT175B is copied from paxml's
`paxml/contrib/gpu/scripts_gpu/configs.py` (with what it inherits from paxml's
TransformerLmSpmdAdam and TransformerLmSpmdAdafactor); the model itself is
layers/gpt.py. Differences, each on purpose (also in docs/reference/reference-gpt.md):
- DCN_MESH_SHAPE is [1,1,1] (one node); the reference's is its multi-node launch
  ([8,1,1] for 126M, [1,32,1] for 5B and 175B): pass it with --fdl.DCN_MESH_SHAPE.
- Evaluation: Pile validation on EVAL_BATCHES batches and Lambada every
  EVAL_INTERVAL_STEPS (the reference evaluates the Pile with its own input settings
  and runs Lambada as a separate job).
- The reference's GPT126M sets `R_COS_MIN_RATIO` (a typo), so its minimum ratio is
  the inherited LR_COS_MIN_RATIO = 0.1; the same value is set here.
The Synthetic* variants train on generated data for benchmarks. The dataset is a
hyperparameter like any other: `--fdl.DATASET="synthetic"` switches any of them.
"""

from experiments.recipes import PileTraining, SampleCorpusOnCPU, SyntheticData
from experiments.registry import register


class _GPT(PileTraining):
    """Values shared by the reference's GPT configs (with PileTraining's); not registered."""

    VOCAB_SIZE = 50304  # GPT-2's 50257 rounded up to a multiple of 128
    MAX_SEQ_LEN = 2048
    PACKED_INPUT = True
    LAYERNORM_EPSILON = 1e-5
    EMBEDDING_LOOKUP_STYLE = "matmul"
    DROPOUT_PROB = 0.0
    CHECKPOINT_POLICY = "none"  # a plain (not repeated) stack without remat
    ADAM_EPSILON = 1e-8
    SUMMARY_INTERVAL_STEPS = 100
    EVAL_INTERVAL_STEPS = 100
    CHECKPOINT_EVERY_N_STEPS = 5000
    CHECKPOINT_MAX_TO_KEEP = 10


@register
class GPT126M(_GPT):
    """GPT-3 Small, 126M parameters; pure data parallelism on the 8 GPUs of a node.

    VOCAB_PATH=c4_en_301_5Mexp2_spm.model python main.py --fdl_config=experiments.GPT126M --data_dir=$TFDS_DATA_DIR --job_log_dir=runs/gpt126m
    """

    NUM_LAYERS = 12
    NUM_HEADS = 12
    MODEL_DIMS = 768
    HIDDEN_DIMS = 3072
    DIMS_PER_HEAD = 64
    INIT_STD = 0.023
    SOFTMAX_INIT_STD = 0.023
    ICI_MESH_SHAPE = [8, 1, 1]
    PERCORE_BATCH_SIZE = 4
    LEARNING_RATE = 6e-4
    LR_COS_WARMUP = 636
    LR_COS_DECAY_START = 637
    LR_COS_DECAY_END = 500000
    MAX_STEPS = 600000


@register
class GPT5B(_GPT):
    """5B parameters; FSDP over the 8 GPUs of a node, one repeated (scanned) layer.

    python main.py --fdl_config=experiments.GPT5B --fdl.PERCORE_BATCH_SIZE=4 --data_dir=$TFDS_DATA_DIR --vocab_path=spm.model --job_log_dir=runs/gpt5b
    """

    NUM_LAYERS = 24
    NUM_HEADS = 32
    MODEL_DIMS = 4096
    HIDDEN_DIMS = 16384
    DIMS_PER_HEAD = 128
    INIT_STD = 0.01
    SOFTMAX_INIT_STD = 0.01
    INPUT_DROPOUT_PROB = 0.1
    ICI_MESH_SHAPE = [1, 8, 1]
    PERCORE_BATCH_SIZE = 8
    USE_REPEATED_LAYER = True
    CHECKPOINT_POLICY = "save_dot_with_no_batch_dims"
    LEARNING_RATE = 1.6e-4
    LR_COS_WARMUP = 115
    LR_COS_DECAY_START = 116
    LR_COS_DECAY_END = 62500
    MAX_STEPS = 75000
    CHECKPOINT_EVERY_N_STEPS = 250
    SUMMARY_INTERVAL_STEPS = 10


@register
class GPT175B(_GPT):
    """GPT-3 175B; FSDP within a node (the reference trains it FSDP256 on 32 nodes).

    python main.py --fdl_config=experiments.GPT175B --fdl.DCN_MESH_SHAPE=[1,32,1] --data_dir=$TFDS_DATA_DIR --vocab_path=spm.model --job_log_dir=runs/gpt175b
    """

    NUM_LAYERS = 96
    NUM_HEADS = 96
    MODEL_DIMS = 12288
    HIDDEN_DIMS = 49152
    DIMS_PER_HEAD = 128
    VOCAB_SIZE = 50257
    # Not set by the reference's GPT175B: inherited from its GPT126M.
    INIT_STD = 0.023
    SOFTMAX_INIT_STD = 0.023
    ICI_MESH_SHAPE = [1, 8, 1]
    PERCORE_BATCH_SIZE = 6
    USE_REPEATED_LAYER = True
    CHECKPOINT_POLICY = "save_nothing"
    LEARNING_RATE = 2e-5
    LR_COS_WARMUP = 265
    LR_COS_DECAY_START = 266
    LR_COS_DECAY_END = 108600
    MAX_STEPS = 75000
    EVAL_INTERVAL_STEPS = 100
    SUMMARY_INTERVAL_STEPS = 10
    CHECKPOINT_EVERY_N_STEPS = 100
    CHECKPOINT_MAX_TO_KEEP = 10


@register
class GPT175BPipelined(GPT175B):
    """GPT175B with pipeline stages across nodes: 12 nodes x 8 H100 80GB, one stage of 8
    layers per node (DCN), tensor parallelism over the node's 8 GPUs (NVLink).

    The layout of paxml's `paxml/tasks/lm/params/nvidia.py` NVIDIA175B (stages over DCN,
    `ICI_MESH_SHAPE=[1,1,1,16]` tensor parallelism, one sequence per microbatch); the model,
    optimizer and schedule are GPT175B's. Differences from NVIDIA175B, each for a reason:
    - 8 GPUs per node (H100 HGX) instead of its 16 A100 40GB: ICI [1,1,1,8], and 12
      stages instead of 6, so the job keeps its 96 GPUs and tensor parallelism stays on
      NVLink.
    - GPT175B's global batch of 1536 (PERCORE_BATCH_SIZE 16 x 96) instead of its 6
      (0.0625 x 96, a proxy benchmark: 6 microbatches for 12 stages would leave the
      stages idle 11/17 of the time), run as 8 sub-batches of 192, each 192 microbatches
      of one sequence: bubble 11/203 = 5.4%.
    - Adam with GPT175B's learning rate and schedule (this project has no Adafactor) instead
      of its Adafactor at NVIDIA5B's 6e-4 without warmup; GPT175B's GPT-3 layers (biases, no
      attention logit cap) instead of NVIDIA5B's USE_BIAS=False and ATTEN_LOGIT_CAP=50.
    - A repeated (scanned) layer inside each stage (GPT175B's USE_REPEATED_LAYER) where its
      NVIDIA5B base unrolls the stage's layers: the same maths, compile time flat in depth.

    python main.py --fdl_config=experiments.GPT175BPipelined --mode=plan
    python main.py --fdl_config=experiments.GPT175BPipelined --data_dir=$TFDS_DATA_DIR --vocab_path=spm.model --job_log_dir=runs/gpt175b_pp
    """

    ICI_MESH_SHAPE = [1, 1, 1, 8]  # [stage, replica, data, mdl] within a node
    DCN_MESH_SHAPE = [12, 1, 1, 1]  # the stages, one node each
    MICROBATCH_SIZE = 1
    PERCORE_BATCH_SIZE = 16
    GRADIENT_ACCUMULATION_STEPS = 8
    # NVIDIA5B's (NVIDIA175B inherits it): GPT175B's 50257 does not split over 8-way
    # tensor parallelism.
    VOCAB_SIZE = 51200


@register
class GPT1_3B(_GPT):
    """A 1.3B GPT for one-GPU speed work: GPT-3 XL's depth, width and learning rate
    (Brown et al. 2020, table 2.1: 24 layers, d_model 2048, 2e-4), with 16 heads of 128
    so the heads span d_model, as MosaicML's MPT-1B (llm-foundry) and Megatron-LM's 1.3B
    configs do. Not a Pax GPU config: its other settings are GPT126M's.

    VOCAB_PATH=spm.model python main.py --fdl_config=experiments.GPT1_3B --data_dir=$TFDS_DATA_DIR --job_log_dir=runs/gpt1_3b
    """

    NUM_LAYERS = 24
    NUM_HEADS = 16
    MODEL_DIMS = 2048
    HIDDEN_DIMS = 8192
    DIMS_PER_HEAD = 128
    INIT_STD = 0.02
    SOFTMAX_INIT_STD = 0.02
    ICI_MESH_SHAPE = [1, 8, 1]
    PERCORE_BATCH_SIZE = 4
    LEARNING_RATE = 2e-4
    # GPT-3's schedule in steps of its 1M-token batch (512 x 2048; set PERCORE_BATCH_SIZE
    # to match): warmup over 375M tokens, cosine decay over 260B, 300B tokens in all.
    LR_COS_WARMUP = 358
    LR_COS_DECAY_START = 359
    LR_COS_DECAY_END = 247955
    MAX_STEPS = 286102


@register
class Pile126M(GPT126M):
    """The reference's name for GPT126M on The Pile (paxml scripts_gpu configs.Pile126M).

    VOCAB_PATH=spm.model python main.py --fdl_config=experiments.Pile126M --data_dir=$TFDS_DATA_DIR --job_log_dir=runs/pile126m
    """


@register
class Pile5B(GPT5B):
    """The current paxml name for GPT5B on The Pile: its configs.py registers Pile5B
    (GPT5BBase + the Pile dataset) and keeps `GPT5B = Pile5B` as a legacy alias; the values
    are GPT5B's. (That newer configs.py also sets PACKED_INPUT=False on all its GPT bases;
    these keep the packed input of the configs GPT5B was copied from: pass
    --fdl.PACKED_INPUT=False for the other.)

    python main.py --fdl_config=experiments.Pile5B --data_dir=$TFDS_DATA_DIR --vocab_path=spm.model --job_log_dir=runs/pile5b
    """


@register
class Pile175B(GPT175B):
    """The current paxml name for GPT175B on The Pile (`GPT175B = Pile175B` there is the
    legacy alias); the values are GPT175B's (PACKED_INPUT as Pile5B says).

    python main.py --fdl_config=experiments.Pile175B --fdl.DCN_MESH_SHAPE=[1,32,1] --data_dir=$TFDS_DATA_DIR --vocab_path=spm.model --job_log_dir=runs/pile175b
    """


@register
class Lambada126M(GPT126M):
    """Zero-shot Lambada evaluation of a GPT126M checkpoint (as run_lambada_singlenode.sh).

    VOCAB_PATH=spm.model python main.py --fdl_config=experiments.Lambada126M --mode=eval --data_dir=$TFDS_DATA_DIR --job_log_dir=runs/pile126m
    """

    DATASET = "none"
    LAMBADA_EVAL = True


@register
class Synthetic126M(SyntheticData, GPT126M):
    """GPT126M on synthetic data, for throughput benchmarks.

    python main.py --fdl_config=experiments.Synthetic126M --fdl.MAX_STEPS=100 --job_log_dir=runs/s126m
    """


@register
class Synthetic5B(SyntheticData, GPT5B):
    """GPT5B on synthetic data, for throughput benchmarks.

    python main.py --fdl_config=experiments.Synthetic5B --fdl.MAX_STEPS=100 --job_log_dir=runs/s5b
    """


@register
class Synthetic175B(SyntheticData, GPT175B):
    """GPT175B on synthetic data, for throughput benchmarks.

    python main.py --fdl_config=experiments.Synthetic175B --fdl.MAX_STEPS=20 --job_log_dir=runs/s175b
    """


@register
class Tiny(SampleCorpusOnCPU):
    """A 2-layer, 64-wide GPT on the built-in sample corpus, 8 fake CPU devices (`make run`).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py --fdl_config=experiments.Tiny --job_log_dir=runs/tiny
    """

