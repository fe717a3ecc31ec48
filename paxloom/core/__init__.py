"""The small core every other package may import: the one user-error type (errors), console
lines (log), the run spec that the runtime receives instead of an experiment (spec), the batch
layout derived once from PERCORE_BATCH_SIZE and the mesh (batch), the mesh's axis names
(mesh_axes), the devices a graph is built for (target), the batch contract with the train
and evaluation input protocols (data), and the training-loop callback protocol (callbacks).
It imports no other Paxloom package, so both a dataset in tasks/ and the loop in training/
can name these types without either knowing the other."""
