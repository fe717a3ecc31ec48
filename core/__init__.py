"""The small core every other package may import: the one user-error type, the run spec
that the runtime receives instead of an experiment, the batch contract with the train and
evaluation input protocols, and the training-loop callback protocol. It imports no other
Paxloom package, so both a dataset in tasks/ and the loop in training/ can name these types
without either knowing the other."""
