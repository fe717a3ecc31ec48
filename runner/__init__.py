"""The runtime: mesh, sharded train state, train/eval loop, summaries, checkpoints.

Importing the package applies the praxis compat patches first, so every
runner module may import praxis.
"""

from layers import praxis_compat  # noqa: F401
