"""The launcher: the only runtime code that sees an experiment object. It turns the
command line's options and an experiment into a recorded Fiddle graph and a run spec,
decides once which training callbacks exist, and hands the spec to training or
inference."""

from layers import praxis_compat  # noqa: F401  (before any praxis import)
