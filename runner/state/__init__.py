"""The sharded train state: the model template's sharding for the mesh (applied once,
last), the optax optimizer and schedule, parameter partition specs, initialisation straight
onto the devices, and orbax checkpoints of the state. Training and inference both build on
it, so it sits below them."""

from layers import praxis_compat  # noqa: F401  (before any praxis import)
