"""Training settings that experiments of several model families share. Not registered:
an experiment class lists a recipe before its family's base (`class _GPT(PileTraining)`,
`class Synthetic126M(SyntheticData, GPT126M)`), and its own values still win."""

from experiments.base import BaseExperiment


class PileTraining(BaseExperiment):
    """Pretraining on The Pile as the Pax GPU configs do it: bfloat16, AdamW (0.9, 0.95)
    with decoupled weight decay 0.1, gradients clipped to norm 1.0, cosine decay to 10% of
    the peak rate, Pile validation and Lambada at every evaluation."""

    FPROP_DTYPE = "bfloat16"
    ADAM_BETA1 = 0.9
    ADAM_BETA2 = 0.95
    WEIGHT_DECAY = 0.1
    CLIP_GRADIENT_NORM_TO_VALUE = 1.0
    LR_COS_MIN_RATIO = 0.1
    DATASET = "pile"
    LAMBADA_EVAL = True
    EVAL_BATCHES = 10


class SampleCorpusOnCPU(BaseExperiment):
    """A tiny model's run on the built-in sample corpus (Python's docs in Pile format) on 8
    fake CPU devices: Lambada too, a warm learning rate, 800 steps in under 2 minutes on 2
    cores (the Tiny experiments of every family)."""

    DATASET = "sample"
    LAMBADA_EVAL = True
    VOCAB_SIZE = 1024  # the sample vocabulary's size
    MAX_SEQ_LEN = 128
    ICI_MESH_SHAPE = [2, 2, 2]
    PERCORE_BATCH_SIZE = 2
    LEARNING_RATE = 3e-3
    LR_COS_WARMUP = 20
    LR_COS_DECAY_START = 20
    LR_COS_DECAY_END = 800
    MAX_STEPS = 800
    SUMMARY_INTERVAL_STEPS = 50
    EVAL_INTERVAL_STEPS = 200
    CHECKPOINT_EVERY_N_STEPS = 200


class SyntheticData(BaseExperiment):
    """Generated token sequences instead of a corpus, for throughput benchmarks."""

    DATASET = "synthetic"
    LAMBADA_EVAL = False
