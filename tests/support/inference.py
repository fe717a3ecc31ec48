"""Helpers for tests of inference (decoding, export): job directories with a checkpoint, and
praxis's own forward pass as the reference."""

import jax
import numpy as np
from praxis import pax_fiddle

from paxloom.launch import record
from paxloom.runner.cluster import mesh as mesh_lib
from paxloom.runner.state import checkpoints
from paxloom.runner.state.train_state import as_model_batch, praxis_context
from paxloom.runner.training.trainer import Trainer

# Parameters are drawn at this scale, far from the init's norm scales of 1 and biases of 0
# (so a wrong scale convention or a misplaced bias changes outputs well beyond tolerances),
# and with logits spread enough that greedy choices are not near ties.
PARAMETER_STD = 0.2


def save_job(job_dir, exp, step: int = 1, devices=None):
    """A job_log_dir as training leaves it: hyperparameters.json and the run graph, and a
    checkpoint at `step` of `exp`'s train state with random parameters (drawn on the host:
    no program to compile). Returns (the parameters on the experiment's mesh, a Trainer)."""
    run = pax_fiddle.build(exp.run_config())
    mesh = mesh_lib.create_mesh(run.mesh.ici_mesh_shape, run.mesh.dcn_mesh_shape,
                                devices=devices)
    trainer = Trainer(run, mesh, str(job_dir))
    rng = np.random.default_rng(7)
    abstract = trainer.abstract_state
    state = {
        "step": np.int32(step),
        "params": jax.tree_util.tree_map(
            lambda a: (PARAMETER_STD * rng.standard_normal(a.shape)).astype(a.dtype),
            abstract["params"]),
        "opt_state": jax.tree_util.tree_map(lambda a: np.zeros(a.shape, a.dtype),
                                            abstract["opt_state"]),
    }
    state = jax.device_put(state, trainer.state_shardings)
    save_state(job_dir, exp, trainer, state)
    return state["params"], trainer


def save_state(job_dir, exp, trainer, state) -> None:
    """Record `exp`'s config in job_dir and checkpoint `state` (of `trainer`) there."""
    record.write_config(str(job_dir), exp, exp.run_config())
    experiment = f"{type(exp).__module__}.{type(exp).__name__}"
    metadata = checkpoints.run_metadata(experiment, exp.hyperparameters(),
                                        trainer.abstract_state["params"])
    with checkpoints.Checkpointer(checkpoints.job_checkpoint_dir(str(job_dir)),
                                  metadata=metadata, every_n_steps=0, max_to_keep=0) as saver:
        saver.save(int(state["step"]), state, None, final=True)


def praxis_logits(trainer, params, sequences: list[list[int]]) -> list[np.ndarray]:
    """praxis's LanguageModel.compute_predictions logits [len, V] of each token sequence
    (each at positions 0.., as one document), on the trainer's mesh."""
    seq_len = trainer.batch_shapes["ids"].shape[1]
    rows = trainer.global_batch_size
    out = []
    for start in range(0, len(sequences), rows):
        chunk = sequences[start:start + rows]
        ids = np.zeros((rows, seq_len), np.int32)
        real = np.zeros((rows, seq_len), np.float32)
        for i, seq in enumerate(chunk):
            ids[i, :len(seq)], real[i, :len(seq)] = seq, 1
        batch = {"ids": ids, "labels": ids, "weights": real, "paddings": 1 - real,
                 "segment_ids": real.astype(np.int32),
                 "segment_pos": (np.arange(seq_len)[None] * real).astype(np.int32)}
        with jax.set_mesh(trainer.mesh):
            logits = _forward(trainer)(params, trainer.to_device(batch))
        logits = np.asarray(jax.device_get(logits))
        out += [logits[i, :len(seq)] for i, seq in enumerate(chunk)]
    return out


def _forward(trainer):
    if not hasattr(trainer, "_reference_forward"):
        model = trainer.model

        def forward(params, batch):
            with praxis_context(do_eval=True):
                predictions = model.apply({"params": params}, as_model_batch(batch),
                                          method=model.compute_predictions)
            return predictions.logits.astype(np.float32)

        trainer._reference_forward = jax.jit(forward)
    return trainer._reference_forward


def greedy_reference(trainer, params, prompts: list[list[int]], steps: int) -> list[list[int]]:
    """Greedy continuations by praxis's full forward pass: `steps` times, run the whole
    sequence and append the argmax of its last position (no cache)."""
    sequences = [list(p) for p in prompts]
    for _ in range(steps):
        logits = praxis_logits(trainer, params, sequences)
        for seq, seq_logits in zip(sequences, logits, strict=True):
            seq.append(int(np.argmax(seq_logits[-1])))
    return [seq[len(p):] for seq, p in zip(sequences, prompts, strict=True)]


def assert_greedy_continuations_equal_transformers(hf_model, arch, mesh, like, params,
                                                   prompts, steps: int, max_seq_len: int):
    """Greedy decoding with the cache (layers/cached_lm.py, through make_generate) of
    `prompts` of several lengths, left-padded into one batch as --mode=decode batches them,
    continues each as transformers' `generate` does with `hf_model`. `like`: the abstract
    parameters (their shardings), `params`: the imported ones on `mesh`."""
    import torch

    from paxloom.runner.inference.generate import SamplingOptions, make_generate

    prompt_len = max(len(p) for p in prompts)
    tokens = np.zeros((len(prompts), prompt_len), np.int32)
    for row, prompt in enumerate(prompts):
        tokens[row, prompt_len - len(prompt):] = prompt
    generate = make_generate(
        arch, mesh=mesh, param_shardings=jax.tree_util.tree_map(lambda a: a.sharding, like),
        batch=len(prompts), prompt_len=prompt_len, steps=steps, max_seq_len=max_seq_len,
        eos_id=None, options=SamplingOptions())
    lengths = np.array([len(p) for p in prompts], np.int32)
    got = np.asarray(generate(params, tokens, lengths, np.arange(len(prompts)), 0))
    for prompt, continuation in zip(prompts, got, strict=True):
        with torch.no_grad():
            want = hf_model.generate(torch.tensor([prompt]), max_new_tokens=steps,
                                     do_sample=False)[0, len(prompt):]
        assert continuation.tolist() == want.tolist()
