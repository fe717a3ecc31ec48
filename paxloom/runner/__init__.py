"""The runtime, in packages by concern, from the bottom of the layering up:

    cluster/    processes and devices: jax.distributed, the ICI x DCN mesh, XLA flags, the
                compilation cache
    state/      the sharded train state: the model's layout on the mesh, the optimizer,
                initialisation, checkpoints and weight formats
    training/   the training loop and its callbacks
    inference/  a trained model's forward pass for decoding and export
    planning/   --mode=plan: the train step compiled for a GPU mesh without the GPU

The runtime sees a run spec (paxloom/core/spec.py), never an experiment: launch/ builds the spec.
Its packages build on praxis and apply the compat patches first (layers/praxis_compat.py).
"""
