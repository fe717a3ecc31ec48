"""The launcher: the only runtime code that sees an experiment object. It turns the
command line's options (flags) and an experiment (resolve) into a recorded Fiddle graph
(record) and a run spec, decides once which training callbacks exist (job), and hands the
spec to training, decoding (decode) or planning (plan, which re-plans changed
experiments)."""

from layers import praxis_compat  # noqa: F401  (before any praxis import)
