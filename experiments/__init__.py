"""Experiments: classes of hyperparameters, registered by name.

    python main.py --fdl_config=experiments.GPT126M --fdl.PERCORE_BATCH_SIZE=4

Importing this package registers the built-in experiments.
"""

from experiments import glam, gpt, llama  # noqa: E402,F401,I001  (registers the built-in experiments)
from experiments.base import BaseExperiment
from experiments.registry import register, registered, resolve

__all__ = ["BaseExperiment", "register", "registered", "resolve"]
