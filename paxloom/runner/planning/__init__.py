"""--mode=plan: the train step compiled for the whole GPU mesh, by XLA:GPU for the planned
GPU without one (gpu_target) or by XLA:CPU on fake CPU devices, with nothing allocated, read
(hlo_text) for memory, FLOPs and collective bytes, and re-planned (plan) with cheaper
changes to the experiment (the launcher hands it a function that builds a changed
experiment's graph, so planning imports no experiment code). A compiled plan's step time is
estimated term by term (step_time) from its matmul FLOPs, a measured efficiency curve
(efficiency) and its collectives' bytes over the GPUs' links (links); its kernels are
accounted one by one, FLOPs, bytes and roofline time (step_account)."""

from layers import praxis_compat  # noqa: F401  (before any praxis import)
