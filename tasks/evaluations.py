"""The evaluation sets experiments name in their Fiddle graph (core.spec.Evaluation).

A user adds an evaluation the same way, in their own module: subclass
`paxloom.core.spec.Evaluation`, give it `metrics` (and, if it needs other per-example
arrays, `batch_outputs`), and put it in the experiment's `evals`.
"""

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from paxloom.core.spec import Evaluation
from tasks import lambada


@dataclasses.dataclass(frozen=True)
class TokenLossEval(Evaluation):
    """Language-model loss over every weighted token (Pile validation, synthetic data)."""

    def metrics(self, outputs):
        real = outputs["num_targets"] > 0  # rows without targets are batch padding
        tokens = float(outputs["num_targets"][real].sum())
        loss = -float(outputs["logprob"][real].sum()) / tokens
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)),
                "accuracy": float(outputs["num_correct"][real].sum()) / tokens}


@dataclasses.dataclass(frozen=True)
class LambadaEval(Evaluation):
    """Lambada: a passage is right when every token of its last word is the argmax.

    `make_input` returns a tasks.nodes.LambadaEvalInput, whose `examples` and
    `vocab` the predictions file uses.
    """

    def batch_outputs(self, predictions, batch):
        return {
            **super().batch_outputs(predictions, batch),
            # Per-token outputs, for the per-example predictions file.
            "argmax": predictions.per_example_argmax.astype(jnp.int32),  # [B, T]
            "weights": batch["weights"],  # [B, T]
        }

    def metrics(self, outputs):
        return lambada.lambada_metrics(outputs["num_correct"], outputs["num_targets"],
                                       outputs["logprob"])

    def write_outputs(self, directory, data, outputs):
        """lambada_predictions.jsonl: context, target, decoded prediction, correct, logprob."""
        count = len(data.examples)  # rows past the last example are batch padding
        targets = outputs["weights"][:count] > 0  # [N, T]
        predicted = [row[mask].tolist()
                     for row, mask in zip(outputs["argmax"][:count], targets, strict=True)]
        return str(lambada.write_predictions(
            f"{directory}/lambada_predictions.jsonl", data.examples, data.vocab,
            outputs["num_correct"][:count], outputs["num_targets"][:count],
            np.asarray(outputs["logprob"][:count]), predicted))
