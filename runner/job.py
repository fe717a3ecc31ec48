"""One job: resolve the run, record its config, lay out the mesh, then train or evaluate."""

import json
import os

import fiddle as fdl
from fiddle import printing
from fiddle.experimental import serialization
from praxis import pax_fiddle

from runner import mesh as mesh_lib
from runner.errors import UserError
from runner.summaries import log
from runner.trainer import Trainer


def describe(exp, data_dir=None, vocab_path=None) -> str:
    """Effective hyperparameters and the Fiddle graph, as shown by --print_config."""
    lines = [f"# {type(exp).__module__}.{type(exp).__name__}", "", "## Hyperparameters"]
    lines += [f"{name} = {value!r}" for name, value in exp.hyperparameters().items()]
    lines += ["", "## Fiddle graph", printing.as_str_flattened(
        exp.run_config(data_dir=data_dir, vocab_path=vocab_path))]
    return "\n".join(lines)


def write_config(job_log_dir: str, exp, config: fdl.Config) -> None:
    """hyperparameters.json (reload: Cls(**json)), fiddle_graph.json (serialization.load_json)
    and fiddle_graph.txt (for people)."""
    os.makedirs(job_log_dir, exist_ok=True)
    record = {
        "experiment": f"{type(exp).__module__}.{type(exp).__name__}",
        "hyperparameters": exp.hyperparameters(),
    }
    with open(os.path.join(job_log_dir, "hyperparameters.json"), "w") as f:
        json.dump(record, f, indent=2)
    with open(os.path.join(job_log_dir, "fiddle_graph.txt"), "w") as f:
        f.write(printing.as_str_flattened(config) + "\n")
    with open(os.path.join(job_log_dir, "fiddle_graph.json"), "w") as f:
        f.write(serialization.dump_json(config, indent=2))


def run(exp, *, mode: str, job_log_dir: str, data_dir=None, vocab_path=None,
        peak_tflops: float = 0.0):
    config = exp.run_config(data_dir=data_dir, vocab_path=vocab_path)
    mesh = mesh_lib.create_mesh(exp.ICI_MESH_SHAPE, exp.DCN_MESH_SHAPE)
    mesh_lib.global_batch_size(exp.PERCORE_BATCH_SIZE, mesh)  # fail fast on a bad batch
    if _is_primary():
        write_config(job_log_dir, exp, config)
    run_spec = pax_fiddle.build(config)
    trainer = Trainer(run_spec, mesh, job_log_dir, peak_tflops=peak_tflops)
    if mode == "eval":
        if not run_spec.evals:
            raise UserError(f"{run_spec.name} has no evaluation sets; set --fdl.EVAL_BATCHES "
                            f"or --fdl.LAMBADA_EVAL=True")
        state = trainer.init_state()
        log("evaluating freshly initialised parameters (no checkpoint restore yet)")
        return trainer.evaluate(state["params"], int(state["step"]))
    if run_spec.make_train_input is None:
        raise UserError(f"{run_spec.name} is evaluation-only; run it with --mode=eval")
    return trainer.train()


def _is_primary() -> bool:
    import jax

    return jax.process_index() == 0
