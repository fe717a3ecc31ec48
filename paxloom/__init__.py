"""Paxloom's runtime: the layers below the experiments (core), the cluster, state,
training, inference and planning (runner), the command line (launch, main) and the tools
that move weights in and out (tools). Importing it imports nothing else."""
