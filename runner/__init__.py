"""The runtime, in packages by concern, listed from the bottom of the layering up:

    core/       errors, the run spec, the data and callback protocols (imports nothing above)
    cluster/    processes and devices: jax.distributed, the ICI x DCN mesh, XLA flags, the
                compilation cache
    state/      the sharded train state: the model's layout on the mesh, the optimizer,
                initialisation and checkpoints
    training/   the training loop, its callbacks (summaries, checkpoints, preemption,
                profiling, goodput, W&B) and evaluation
    inference/  a trained model's forward pass for decoding and export
    planning/   --mode=plan: the train step compiled for a GPU mesh on CPU devices
    launch/     the launcher: flags' options and an experiment in, a run spec out, wired
                to training or inference

Layering (tests/test_layering.py walks every import): main.py -> launch -> experiments ->
planning -> (training, inference) -> state -> cluster -> (layers, tasks) -> core. A
package imports only itself and packages below it, so runner/ as a whole imports
experiments/ nowhere and tasks/ nowhere (tasks/ builds on core/). The experiment object
stops at the launcher; the runtime sees a RunSpec.

The packages that build on praxis (state and above) apply the praxis compat patches when
imported (layers/praxis_compat.py), so their modules may import praxis.
"""
