"""From the command line to an experiment and its run graph: the experiment class named by
--fdl_config (or recorded beside --fdl_config_file), its --fdl.NAME overrides, the settings
a trained run recorded (--mode=decode and --mode=eval reuse them), and the graph with the
data locations, the target device and the --fdl.path overrides applied."""

import dataclasses
import json
import os
import sys

import fiddle as fdl

import experiments
from experiments import overrides
from paxloom.core.errors import UserError
from paxloom.core.log import log
from paxloom.core.target import TargetDevice
from paxloom.launch import record


@dataclasses.dataclass(frozen=True)
class Selection:
    """What the command line says to run, and where its data live."""

    fdl_config: str | None = None  # experiments.NAME or my_module.MyClass
    fdl_config_file: str | None = None  # a run's fiddle_graph.json, to run again
    mode: str = "train"
    job_log_dir: str | None = None
    data_dir: str | None = None  # --data_dir, --tfds_data_dir or $TFDS_DATA_DIR
    vocab_path: str | None = None  # --vocab_path or $VOCAB_PATH
    cache_dir: str | None = None
    eval_on_test: bool | None = None

    @property
    def data_locations(self) -> dict:
        """Where the data live (recorded in hyperparameters.json)."""
        return {"data_dir": self.data_dir, "vocab_path": self.vocab_path,
                "cache_dir": self.cache_dir}


def experiment(selection: Selection, hyperparameter_overrides: dict[str, str]):
    """(the experiment instance, the selection completed with the data locations a trained
    run recorded, where the command line gives none)."""
    name = selection.fdl_config
    recorded = {}
    if selection.fdl_config_file:
        if hyperparameter_overrides:
            raise UserError(f"--fdl_config_file reruns a recorded graph, so --fdl."
                            f"{next(iter(hyperparameter_overrides))} cannot change it; "
                            f"override the graph's fields (--fdl.loop.max_steps=...) instead")
        recorded_name, recorded = record.recorded_experiment(selection.fdl_config_file)
        name = name or recorded_name
    run_record = _recorded_run(selection, name)
    if run_record:
        name = name or run_record["experiment"]
    if not name:
        raise UserError("--fdl_config is required (e.g. --fdl_config=experiments.Tiny; "
                        "--list_experiments lists them)")
    cls = experiments.resolve(name)
    if name.startswith(experiments.registry.PAX_GPU_CONFIGS + "."):
        print(f"note: --fdl_config={name} runs Paxloom's experiments.{cls.__name__}",
              file=sys.stderr)
    if selection.fdl_config_file:
        return cls(**{k: v for k, v in recorded.items() if k in cls.hyperparameter_types()}), \
            selection
    values = overrides.hyperparameter_values(hyperparameter_overrides, cls.hyperparameter_types())
    if run_record:
        values, selection = _with_recorded_settings(cls, run_record, values, selection)
    if selection.mode == "eval" and not values.get("CHECKPOINT_RESTORE_PATH"):
        values.update(_pax_job_weights(selection.job_log_dir))
    return cls(**values), selection


def _pax_job_weights(job_log_dir: str | None) -> dict:
    """Pax's EVAL_ONLY=1 (run_llama_boolq.sh: --mode=eval --job_log_dir=$CHECKPOINT_RESTORE_PATH,
    a Pax job directory such as a converted LLaMA's): a job directory whose checkpoints/ holds
    Pax's checkpoint_XXXXXXXX/ is evaluated as the starting weights, CHECKPOINT_RESTORE_PATH."""
    from paxloom.runner.state import pax_format

    checkpoint_dir = os.path.join(job_log_dir or "", "checkpoints")
    if not job_log_dir or not pax_format.is_pax_checkpoint(checkpoint_dir):
        return {}
    # Not core.log.log: jax must not start before jax.distributed does (main.py).
    print(f"note: {job_log_dir} is a Pax job directory: evaluating its checkpoint "
          f"(CHECKPOINT_RESTORE_PATH={checkpoint_dir})", file=sys.stderr)
    return {"CHECKPOINT_RESTORE_PATH": checkpoint_dir}


def _recorded_run(selection: Selection, name: str | None) -> dict | None:
    """--mode=decode and --mode=eval without --fdl_config_file: the record of the run in
    --job_log_dir, when it holds one of the experiment named (or none is named)."""
    if (selection.mode not in ("decode", "eval") or selection.fdl_config_file
            or not selection.job_log_dir):
        return None
    run_record = record.recorded_run(selection.job_log_dir)
    if run_record is None or not os.path.samefile(os.path.dirname(run_record["path"]),
                                                  selection.job_log_dir):
        return None
    try:
        if name and experiments.resolve(name) is not experiments.resolve(run_record["experiment"]):
            return None  # another experiment's evaluation of this run (Lambada126M)
    except UserError:
        return None
    return run_record


def _with_recorded_settings(cls, run_record: dict, values: dict, selection: Selection):
    """The recorded run's hyperparameters and data locations under the command line's: a
    run decodes and evaluates as it trained unless a flag says otherwise. Logs one line."""
    types, defaults = cls.hyperparameter_types(), cls().hyperparameters()
    recorded = {k: v for k, v in run_record["hyperparameters"].items()
                if k in types and k not in values}
    used = [f"{k}={v!r}" for k, v in recorded.items()
            if json.dumps(v) != json.dumps(defaults.get(k))]
    locations = {}
    for key, value in (run_record.get("data_locations") or {}).items():
        if value and key in selection.data_locations and not selection.data_locations[key]:
            locations[key] = value
            used.append(f"--{key}={value}")
    if used:
        log(f"using the run's recorded settings ({run_record['path']}): {', '.join(used)} "
            f"(flags override them)")
    return {**recorded, **values}, dataclasses.replace(selection, **locations)


def run_graph(exp, selection: Selection, graph_overrides: dict[str, str],
              target: TargetDevice | None) -> fdl.Config:
    """The run's Fiddle graph: the experiment's (or the recorded one), as the flags adjust it."""
    if not selection.fdl_config_file:
        config = experiment_graph(exp, selection, graph_overrides, target)
    else:
        config = record.load_config(selection.fdl_config_file)
        overrides.apply_to_graph(config, graph_overrides, exp.hyperparameter_types())
    if selection.eval_on_test is not None:
        _set_eval_during_training(config, selection.eval_on_test)
    return config


def experiment_graph(exp, selection: Selection, graph_overrides: dict[str, str],
                     target: TargetDevice | None) -> fdl.Config:
    """`exp`'s run graph for this command line: data and tokenizer from the flags (and
    TFDS_DATA_DIR, as the Pax README passes the data), built for `target` (None: this
    process's devices), with its --fdl.path overrides."""
    config = exp.run_config(data_dir=selection.data_dir, vocab_path=selection.vocab_path,
                            cache_dir=selection.cache_dir, target=target)
    overrides.apply_to_graph(config, graph_overrides, exp.hyperparameter_types())
    return config


def _set_eval_during_training(config: fdl.Config, enabled: bool) -> None:
    """--eval_on_test / --noeval_on_test: evaluate in the training loop, or train only."""
    if not enabled:
        config.loop.eval_interval_steps = 0
    elif not config.evals or not config.loop.eval_interval_steps:
        raise UserError("--eval_on_test: this experiment has no evaluation during training; "
                        "set --fdl.EVAL_INTERVAL_STEPS and --fdl.EVAL_BATCHES or "
                        "--fdl.LAMBADA_EVAL=True")
