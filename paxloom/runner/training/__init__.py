"""The training loop and what acts around it: the jitted, state-donating train step and
evaluation steps, input prefetch, and the callbacks the loop calls at fixed points
(summaries and TensorBoard/W&B, checkpoints, preemption, profiling, the goodput ledger),
plus the throughput and compilation accounting they report."""

from layers import praxis_compat  # noqa: F401  (before any praxis import)
