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


class SyntheticData(BaseExperiment):
    """Generated token sequences instead of a corpus, for throughput benchmarks."""

    DATASET = "synthetic"
    LAMBADA_EVAL = False
