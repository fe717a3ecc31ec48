"""--mode=plan: the train step compiled for the whole GPU mesh, by XLA:GPU for the planned
GPU without one (gpu_target) or by XLA:CPU on fake CPU devices, with nothing allocated, read
(hlo_text) for memory, FLOPs and collective bytes, and re-planned (plan) with cheaper
changes to the experiment (the launcher hands it a function that builds a changed
experiment's graph, so planning imports no experiment code)."""

from layers import praxis_compat  # noqa: F401  (before any praxis import)
