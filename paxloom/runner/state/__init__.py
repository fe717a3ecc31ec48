"""The sharded train state: the model template's sharding for the mesh (applied once,
last), the optax optimizer and schedule, parameter partition specs, initialisation straight
onto the devices, and orbax checkpoints of the state; a new run's starting weights
(initial_weights: CHECKPOINT_RESTORE_PATH) and the checkpoint layouts it reads besides its
own (hf_format: Hugging Face, which export writes too; pax_format: paxml's). Training and
inference both build on it, so it sits below them."""

from layers import praxis_compat  # noqa: F401  (before any praxis import)
