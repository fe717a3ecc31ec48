"""What the tests share, one definition of each, by concern (import the module you need;
nothing is imported here, so a test that starts processes pays for no jax import):

- paths: the repository root and main.py.
- tiny: the tiny model (TINY, tiny(), tiny_flags(), fdl_flags()) every test trains.
- processes: main.py and the repository's other programs in subprocesses (run_main,
  start_main, run_python, the environments they get, multi-process jobs).
- training: a Trainer of an experiment on the 8 fake CPU devices, and its steps.
- files: digests of directory trees.
- data: small data in the real formats (the Pile, Lambada, TFDS, a user's corpus, vocabularies).
- inference: job directories with a checkpoint, and praxis's forward pass as the reference.
- pax_checkpoints: Pax checkpoints on disk, written as paxml 1.4.0 writes them.
- step_growth: one train step in a fresh process, its resident memory's growth and program
  (run with python -m).
"""
