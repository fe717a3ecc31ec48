"""Processes and devices: starting jax.distributed from SLURM/Open MPI/flags (with a roll
call), the ICI x DCN mesh over (replica, data, mdl) and how a global batch's rows map onto
it, XLA flags the Pax scripts pass, and the persistent compilation cache. Everything here is
decided before a model exists, so it knows nothing of models, training or data."""
