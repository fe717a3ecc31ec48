"""One job: resolve the run, record its config, lay out the mesh, then train or evaluate."""

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import time

import fiddle as fdl
from fiddle import printing
from fiddle.experimental import serialization
from praxis import pax_fiddle

from core import data, spec
from core.errors import UserError
from core.log import log
from runner.cluster import mesh as mesh_lib
from runner.state import checkpoints, initial_weights
from runner.training import accumulation, goodput, preemption, profiling, summaries
from runner.training.callbacks import CallbackList, ConsoleSummaries, TensorBoard
from runner.training.trainer import Trainer


def describe(exp, config: fdl.Config) -> str:
    """Effective hyperparameters and the Fiddle graph, as shown by --print_config."""
    lines = [f"# {type(exp).__module__}.{type(exp).__name__}", "", "## Hyperparameters"]
    lines += [f"{name} = {value!r}" for name, value in exp.hyperparameters().items()]
    lines += ["", "## Batch", accumulation.describe_batch(
        config.loop.percore_batch_size, math.prod(spec.mesh_size(config.mesh)),
        config.loop.gradient_accumulation_steps)]
    lines += ["", "## Model layers", *_layer_classes(config.model, "model")]
    lines += ["", "## Fiddle graph", printing.as_str_flattened(config)]
    return "\n".join(lines)


# The templates that say what the architecture is (others are ops, inits and shardings).
_ARCHITECTURE_TEMPLATES = (
    "lm_tpl", "position_emb_tpl", "separate_embedding_tpl", "softmax_tpl", "final_ln_tpl",
    "stacked_transformer_tpl", "block", "transformer_layer_params_tpl", "ln_tpl",
    "tr_atten_tpl", "tr_fflayer_tpl", "activation_tpl")


def _layer_classes(config: fdl.Buildable, path: str):
    """`path = Class` for the model's architecture templates (the flat listing omits classes)."""
    yield f"{path} = {fdl.get_callable(config).__name__}"
    for name in _ARCHITECTURE_TEMPLATES:
        value = config.__arguments__.get(name)
        if isinstance(value, fdl.Buildable):
            yield from _layer_classes(value, f"{path}.{name}")


def load_config(path: str) -> fdl.Config:
    """A run's graph as write_config recorded it (fiddle_graph.json), to run it again."""
    try:
        with open(path) as f:
            return serialization.load_json(f.read())
    except OSError as error:
        raise UserError(f"--fdl_config_file={path}: {error.strerror}; pass a run's "
                        f"job_log_dir/fiddle_graph.json") from None
    except Exception as error:  # not JSON, or not a Fiddle serialization
        detail = " ".join(str(error).split())[:200]
        raise UserError(f"--fdl_config_file={path} is not a Fiddle graph written by a run "
                        f"({type(error).__name__}: {detail})") from None


def recorded_experiment(graph_path: str) -> tuple[str | None, dict]:
    """(experiment name, hyperparameters) from the hyperparameters.json beside a recorded
    graph, or (None, {}) when there is none."""
    if not os.path.isfile(graph_path):
        raise UserError(f"--fdl_config_file={graph_path}: No such file; pass a run's "
                        f"job_log_dir/fiddle_graph.json")
    path = os.path.join(os.path.dirname(os.path.abspath(graph_path)), "hyperparameters.json")
    if not os.path.isfile(path):
        return None, {}
    record = read_record(path)
    if record is None:
        raise UserError(f"{path} is damaged (not a run's record of its experiment and "
                        f"hyperparameters); pass --fdl_config=experiments.NAME with the "
                        f"run's --fdl.NAME=VALUE overrides, or move the file away")
    return record["experiment"], record["hyperparameters"]


def read_record(path: str) -> dict | None:
    """hyperparameters.json as write_config wrote it, or None when it is damaged."""
    try:
        with open(path, errors="replace") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if (not isinstance(record, dict) or not isinstance(record.get("experiment"), str)
            or not isinstance(record.get("hyperparameters"), dict)):
        return None
    return record


def set_eval_during_training(config: fdl.Config, enabled: bool) -> None:
    """--eval_on_test / --noeval_on_test: evaluate in the training loop, or train only."""
    if not enabled:
        config.loop.eval_interval_steps = 0
    elif not config.evals or not config.loop.eval_interval_steps:
        raise UserError("--eval_on_test: this experiment has no evaluation during training; "
                        "set --fdl.EVAL_INTERVAL_STEPS and --fdl.EVAL_BATCHES or "
                        "--fdl.LAMBADA_EVAL=True")


def write_config(job_log_dir: str, exp, config: fdl.Config, extra: dict | None = None) -> None:
    """hyperparameters.json (reload: Cls(**json)), fiddle_graph.json (serialization.load_json)
    and fiddle_graph.txt (for people). `extra`: more keys of hyperparameters.json (run_record)."""
    os.makedirs(job_log_dir, exist_ok=True)
    record = {
        "experiment": f"{type(exp).__module__}.{type(exp).__name__}",
        "hyperparameters": exp.hyperparameters(),
        **(extra or {}),
    }
    with open(os.path.join(job_log_dir, "hyperparameters.json"), "w") as f:
        json.dump(record, f, indent=2)
    with open(os.path.join(job_log_dir, "fiddle_graph.txt"), "w") as f:
        f.write(printing.as_str_flattened(config) + "\n")
    with open(os.path.join(job_log_dir, "fiddle_graph.json"), "w") as f:
        f.write(serialization.dump_json(config, indent=2))


def record_config(job_log_dir: str, exp, config: fdl.Config, resumed_step: int | None,
                  extra: dict | None = None) -> None:
    """Write the run's config (write_config); a resume keeps the run's first record, so it
    still describes the checkpoints, and appends any changed hyperparameters, with the step
    they start at, to hyperparameters_history.jsonl."""
    path = os.path.join(job_log_dir, "hyperparameters.json")
    if resumed_step is None or not os.path.exists(path):
        write_config(job_log_dir, exp, config, extra)
        return
    record = read_record(path)
    if record is None:
        aside = f"{path}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
        os.replace(path, aside)
        log(f"warning: {path} is damaged; set aside as {os.path.basename(aside)} and "
            f"written again from this run's hyperparameters")
        write_config(job_log_dir, exp, config, extra)
        return
    recorded = record["hyperparameters"]
    current = json.loads(json.dumps(exp.hyperparameters()))  # as the record holds them
    changed = {name: [recorded.get(name), value] for name, value in current.items()
               if recorded.get(name) != value}
    if changed:
        with open(os.path.join(job_log_dir, "hyperparameters_history.jsonl"), "a") as f:
            f.write(json.dumps({"step": resumed_step, "changed": changed}) + "\n")
        log(f"resuming at step {resumed_step} with changed hyperparameters (appended to "
            f"hyperparameters_history.jsonl): " + ", ".join(
                f"{name} {old!r} -> {new!r}" for name, (old, new) in changed.items()))


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What the command line says about one --mode=train or --mode=eval run (main.py builds
    it from the flags; tests and scripts build it directly)."""

    job_log_dir: str
    mode: str = "train"  # train | eval
    peak_tflops: float = 0.0  # per device; 0: looked up from the device kind
    restore_checkpoint_dir: str | None = None
    restore_checkpoint_step: int | None = None
    preemption_signal: str | None = "SIGUSR1"
    save_checkpoints: bool = True
    skip_broken_checkpoints: bool = False
    profiler_port: int | None = None
    wandb_project: str | None = None
    profile_steps: tuple[int, int] | None = None  # (start step, number of steps)
    # Where the command line said the data live (data_dir, vocab_path, cache_dir): recorded
    # in hyperparameters.json, so that --mode=decode and --mode=eval can reuse them.
    data_locations: dict | None = None


def run(exp, options: RunOptions, config: fdl.Config | None = None):
    """Train or evaluate `exp`, as its graph `config` says (default: exp.run_config())."""
    experiment = f"{type(exp).__module__}.{type(exp).__name__}"
    job_log_dir, mode = options.job_log_dir, options.mode
    checkpoint_dir = checkpoints.job_checkpoint_dir(job_log_dir)
    preemption.parse_signal(options.preemption_signal)  # a bad flag fails before any work
    check_writable(job_log_dir)
    if mode == "train":
        # Before anything is written there: one directory never mixes two experiments.
        checkpoints.check_experiment(checkpoint_dir, experiment)
    config = exp.run_config() if config is None else config
    run_spec = pax_fiddle.build(config)
    # The mesh the graph names is the one the run uses (the model was sharded for it).
    mesh = mesh_lib.create_mesh(run_spec.mesh.ici_mesh_shape, run_spec.mesh.dcn_mesh_shape)
    global_batch = mesh_lib.global_batch_size(run_spec.loop.percore_batch_size, mesh)  # fail fast
    if mode == "train":
        accumulation.check_split(global_batch, run_spec.loop.gradient_accumulation_steps, mesh,
                                 run_spec.loop.percore_batch_size)
    source = checkpoints.restore_source(checkpoint_dir, options.restore_checkpoint_dir,
                                        options.restore_checkpoint_step, mode)
    if source is None and run_spec.initial_weights is not None:
        initial_weights.check_source(run_spec.initial_weights)
    check_inputs(run_spec, mode)
    if mode == "eval":
        check_vocabulary(run_spec.tokenizer, options.restore_checkpoint_dir or job_log_dir,
                         (options.data_locations or {}).get("vocab_path"))
        return _evaluate(exp, config, run_spec, mesh, source, options)
    if run_spec.make_train_input is None:
        raise UserError(f"{run_spec.name} is evaluation-only; run it with --mode=eval")
    with contextlib.ExitStack() as stack:
        # The callbacks the run has, decided once, in the order the loop calls them.
        callbacks = [ConsoleSummaries(), TensorBoard(job_log_dir, exp.hyperparameters())]
        trainer = Trainer(run_spec, mesh, job_log_dir, peak_tflops=options.peak_tflops)
        # Every process has looked for checkpoints before any creates the directory (the
        # Checkpointer below): a process that finds it created mid-check would enter
        # orbax's collective directory handling alone and fail with a sync mismatch.
        _barrier("paxloom:restore_source")
        state = input_state = resumed_step = None
        start_step = 0
        if source is not None:
            restored = _restore(source, trainer.abstract_state, options.skip_broken_checkpoints,
                                checkpoint_dir)
            state, input_state, start_step = restored.state, restored.input_state, restored.step
            log(f"restored step {restored.step} from {restored.path}")
            resumed_step = restored.step if source[0] == checkpoint_dir else None
        elif run_spec.initial_weights is not None:  # a new run from trained weights
            state = trainer.init_state()
            state["params"] = initial_weights.load(
                run_spec.initial_weights, state["params"], trainer.abstract_state["params"],
                config.model)
        if _is_primary():  # only once training is sure to start: a refused run records nothing
            record_config(job_log_dir, exp, config, resumed_step,
                          run_record(options.data_locations, run_spec.tokenizer))
        if options.wandb_project and _is_primary():
            callbacks.append(summaries.WandbRun(options.wandb_project, job_log_dir,
                                                exp.hyperparameters()))
        # The run's wall time, from its process's start, counts in the job's goodput ledger.
        callbacks.append(goodput.Ledger(job_log_dir, process_start=goodput.process_start_time(),
                                        start_step=start_step, primary=_is_primary()))
        if options.profiler_port is not None:
            profiling.start_server(options.profiler_port)
        if options.profile_steps is not None:
            callbacks.append(profiling.StepProfiler(os.path.join(job_log_dir, "tb"),
                                                    *options.profile_steps))
        if options.save_checkpoints:
            metadata = checkpoints.run_metadata(experiment, exp.hyperparameters(),
                                                trainer.abstract_state["params"])
            callbacks.append(stack.enter_context(checkpoints.Checkpointer(
                checkpoint_dir, metadata=metadata,
                every_n_steps=run_spec.loop.checkpoint_every_n_steps,
                max_to_keep=run_spec.loop.checkpoint_max_to_keep)))
        else:
            log("--enable_checkpoint_saving=false: this run saves no checkpoints")
        callbacks.append(stack.enter_context(
            preemption.PreemptionWatcher(options.preemption_signal)))
        callbacks += exp.callbacks()  # the experiment's own, last: they see every save
        return trainer.train(state, input_state, callbacks)


def _evaluate(exp, config, run_spec, mesh, source, options: RunOptions):
    """--mode=eval: every evaluation set once, on a checkpoint's parameters."""
    checkpoint_dir = checkpoints.job_checkpoint_dir(options.job_log_dir)
    # An evaluation writes a config only into a directory of its own: evaluating a training
    # run's directory (e.g. Lambada126M on a GPT126M run) must not overwrite that run's record.
    if _is_primary() and checkpoints.latest_step(checkpoint_dir) is None:
        write_config(options.job_log_dir, exp, config)
    trainer = Trainer(run_spec, mesh, options.job_log_dir, peak_tflops=options.peak_tflops)
    _barrier("paxloom:restore_source")
    if not run_spec.evals:
        raise UserError(f"{run_spec.name} has no evaluation sets; set --fdl.EVAL_BATCHES "
                        f"or --fdl.LAMBADA_EVAL=True")
    if source is None and run_spec.initial_weights is not None:
        # Pax's EVAL_ONLY: the starting weights themselves (an imported model, zero-shot).
        abstract = trainer.abstract_state["params"]
        params = initial_weights.load(run_spec.initial_weights, trainer.init_state()["params"],
                                      abstract, config.model)
        log(f"evaluating the starting weights ({run_spec.initial_weights.path})")
        step = 0
    elif source is None:
        raise UserError(f"--mode=eval evaluates a checkpoint, and {checkpoint_dir} has none; "
                        f"train first, or pass --restore_checkpoint_dir or "
                        f"--fdl.CHECKPOINT_RESTORE_PATH")
    else:
        restored = _restore(source, trainer.abstract_state, options.skip_broken_checkpoints,
                            checkpoint_dir, params_only=True)
        log(f"evaluating step {restored.step} ({restored.metadata.get('experiment', '?')}) "
            f"from {restored.path}")
        params, step = restored.state["params"], restored.step
    return trainer.evaluate(params, step,
                            predictions_dir=options.job_log_dir,
                            callbacks=CallbackList([TensorBoard(options.job_log_dir)]))


def _restore(source, abstract_state, skip_broken: bool, own_dir: str, **kwargs):
    """checkpoints.restore; with `skip_broken`, a damaged checkpoint gives way to the newest
    earlier one. In the job's own directory the damaged one is moved aside (never deleted):
    training on would otherwise save new steps beside, and below, a broken latest step."""
    while True:
        try:
            return checkpoints.restore(*source, abstract_state, **kwargs)
        except checkpoints.BrokenCheckpointError as error:
            if not skip_broken or not error.earlier:
                raise
            where = "left in place"
            if error.directory == own_dir:
                where = "moved aside"
                if _is_primary():
                    where = f"moved to {checkpoints.set_aside(error.directory, error.step)}"
                _barrier("paxloom:set_aside")
            log(f"warning: checkpoint step {error.step} is damaged ({where}); restoring "
                f"step {error.earlier[-1]} instead")
            source = (error.directory, error.earlier[-1])


# Encoded to fingerprint a vocabulary: two that encode it alike read a checkpoint alike.
_PROBE_TEXT = ("The quick brown fox jumps over the lazy dog. 0123456789 (x, y) = {'a': [1]}\n"
               "Ünïcödé façade — naïve café; def f(self): return None  # tokens")


def tokenizer_fingerprint(tokenizer) -> dict | None:
    """What identifies a text tokenizer (core.data.Tokenizer) for a checkpoint: its
    size, EOS id and a hash of its encoding of a fixed text; None without one."""
    if tokenizer is None:
        return None
    ids = json.dumps([int(i) for i in tokenizer.encode(_PROBE_TEXT)])
    return {"vocab_size": int(tokenizer.vocab_size), "eos_id": int(tokenizer.eos_id),
            "encoding_sha256": hashlib.sha256(ids.encode()).hexdigest()[:16]}


def run_record(data_locations: dict | None, tokenizer) -> dict:
    """What hyperparameters.json records beside the hyperparameters: where the data and
    vocabulary were (the flags) and the vocabulary's fingerprint."""
    record = {"data_locations": {k: (os.path.abspath(v) if v else v)
                                 for k, v in (data_locations or {}).items()}}
    fingerprint = tokenizer_fingerprint(tokenizer)
    if fingerprint is not None:
        record["tokenizer"] = fingerprint
    return record


def recorded_run(directory: str | None) -> dict | None:
    """The hyperparameters.json record of the run in `directory` (a job_log_dir, or its
    checkpoints/), or None when it has none."""
    if not directory:
        return None
    directory = os.path.abspath(directory)
    for where in (directory, os.path.dirname(directory)):
        path = os.path.join(where, "hyperparameters.json")
        if os.path.isfile(path):
            record = read_record(path)
            return None if record is None else {**record, "path": path}
    return None


def check_vocabulary(tokenizer, run_dir: str | None, vocab_path: str | None) -> None:
    """Refuse, in one line, a tokenizer that is not the one the run in `run_dir` trained
    with (its recorded fingerprint): its checkpoint would read the prompts as other words."""
    record = recorded_run(run_dir)
    recorded = (record or {}).get("tokenizer")
    current = tokenizer_fingerprint(tokenizer)
    if not recorded or current is None or current == recorded:
        return
    trained_with = (record.get("data_locations") or {}).get("vocab_path")
    given = f"--vocab_path={vocab_path}" if vocab_path else "this run's vocabulary"
    raise UserError(
        f"{given} ({current['vocab_size']} ids, encoding {current['encoding_sha256']}) is not "
        f"the vocabulary this run trained with ({recorded['vocab_size']} ids, encoding "
        f"{recorded['encoding_sha256']}, recorded in {record['path']}"
        + (f": {trained_with}" if trained_with else "")
        + "); drop --vocab_path to use the recorded one, or pass that one")


def check_inputs(run_spec, mode: str) -> None:
    """Every data file the run will read, before its first step: the training input, and
    each evaluation the run will run (all of them for --mode=eval; during training, those of
    an EVAL_INTERVAL_STEPS above 0). A missing one stops the run in one line naming it and
    the flag that runs without it, not after EVAL_INTERVAL_STEPS steps of training."""
    if mode == "train" and run_spec.make_train_input is not None:
        data.check_input(run_spec.make_train_input)
    if mode == "eval" or run_spec.loop.eval_interval_steps:
        for evaluation in run_spec.evals:
            evaluation.check()


def check_writable(job_log_dir: str) -> None:
    """Create --job_log_dir and write a little to it, so that a file in its place, a
    read-only or full disk fails now, in one line, not at the first checkpoint."""
    flag = f"--job_log_dir={job_log_dir}"
    try:
        os.makedirs(job_log_dir, exist_ok=True)
    except FileExistsError:
        raise UserError(f"{flag} is a file, not a directory; pass a directory") from None
    except NotADirectoryError:
        raise UserError(f"{flag}: a part of the path is a file, not a directory; pass a "
                        f"directory path") from None
    except OSError as error:
        raise UserError(f"{flag}: cannot create it ({error.strerror}); pass a writable "
                        f"directory") from None
    probe = os.path.join(job_log_dir, f".write_test.{os.uname().nodename}.{os.getpid()}")
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * 65536)  # enough to hit a full disk, not just a free inode
            f.flush()
            os.fsync(f.fileno())
    except OSError as error:
        raise UserError(f"{flag} is not writable ({error.strerror}); free space or pass a "
                        f"writable directory") from None
    finally:
        if os.path.exists(probe):
            os.remove(probe)


def _barrier(name: str) -> None:
    import jax
    from jax.experimental import multihost_utils

    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def _is_primary() -> bool:
    import jax

    return jax.process_index() == 0
