"""--mode=plan: the train step compiled for the whole GPU mesh on fake CPU devices, with
nothing allocated, read for memory, FLOPs and collective bytes, and re-planned with cheaper
changes to the experiment. Because it rebuilds experiments with changed hyperparameters, it
sits above experiments/."""

from layers import praxis_compat  # noqa: F401  (before any praxis import)
