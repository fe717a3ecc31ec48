"""A trained model used for inference: loading a checkpoint's parameters for a run spec,
the KV-cached generation loop with its sampling options, and --mode=decode's prompt reading
and output writing."""

from layers import praxis_compat  # noqa: F401  (before any praxis import)
