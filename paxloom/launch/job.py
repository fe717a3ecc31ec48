"""One job: resolve the run, record its config, lay out the mesh, then train or evaluate."""

import contextlib
import dataclasses
import os

import fiddle as fdl
from praxis import pax_fiddle

from paxloom.core import data, spec
from paxloom.core.errors import UserError
from paxloom.core.log import log
from paxloom.launch import record
from paxloom.runner.cluster import mesh as mesh_lib
from paxloom.runner.state import checkpoints, initial_weights
from paxloom.runner.training import goodput, preemption, profiling, summaries
from paxloom.runner.training.builtin_callbacks import CallbackList, ConsoleSummaries, TensorBoard
from paxloom.runner.training.trainer import Trainer
from paxloom.runner.training.watchdog import Watchdog


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What the command line says about one --mode=train or --mode=eval run (main.py builds
    it from the flags; tests and scripts build it directly)."""

    job_log_dir: str
    mode: str = "train"  # train | eval
    peak_tflops: float = 0.0  # per device; 0: looked up from the device kind
    device_memory_gb: float = 0.0  # per device, for the check before step 1; 0: ask it
    restore_checkpoint_dir: str | None = None
    restore_checkpoint_step: int | None = None
    preemption_signal: str | None = "SIGUSR1"
    save_checkpoints: bool = True
    skip_broken_checkpoints: bool = False
    profiler_port: int | None = None
    wandb_project: str | None = None
    profile_steps: tuple[int, int] | None = None  # (start step, number of steps)
    hang_timeout_s: float = 3600.0  # the watchdog's (paxloom/runner/training/watchdog.py); 0: off
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
    spec.batch_layout(run_spec)  # fail fast, before any checkpoint is read
    source = checkpoints.restore_source(checkpoint_dir, options.restore_checkpoint_dir,
                                        options.restore_checkpoint_step, mode)
    if source is None and run_spec.initial_weights is not None:
        initial_weights.check_source(run_spec.initial_weights)
    _check_recorded_vocabulary(run_spec, options)
    check_inputs(run_spec, mode)
    if mode == "eval":
        return _evaluate(exp, config, run_spec, mesh, source, options)
    if run_spec.make_train_input is None:
        raise UserError(f"{run_spec.name} is evaluation-only; run it with --mode=eval")
    if run_spec.loop.eval_interval_steps and not run_spec.evals:
        log(_nothing_to_evaluate(exp, run_spec.loop.eval_interval_steps))
    with contextlib.ExitStack() as stack:
        watchdog = stack.enter_context(Watchdog(
            options.hang_timeout_s, "the start of the run (the other processes, the state)"))
        # The callbacks the run has, decided once, in the order the loop calls them.
        callbacks = [watchdog, ConsoleSummaries(),
                     TensorBoard(job_log_dir, exp.hyperparameters())]
        trainer = Trainer(run_spec, mesh, job_log_dir, peak_tflops=options.peak_tflops,
                          device_memory_gb=options.device_memory_gb)
        # Every process has looked for checkpoints before any creates the directory (the
        # Checkpointer below): a process that finds it created mid-check would enter
        # orbax's collective directory handling alone and fail with a sync mismatch.
        _barrier("paxloom:restore_source")
        state, input_state, start_step, resumed_step = _starting_state(
            trainer, source, options, config)
        if start_step < run_spec.loop.max_steps:  # stop here, recording nothing, if it won't fit
            state = trainer.init_state() if state is None else state
            trainer.check_step_fits(state)
        if _is_primary():  # only once training is sure to start: a refused run records nothing
            initial = run_spec.initial_weights
            record.record_config(job_log_dir, exp, config, resumed_step, record.run_record(
                options.data_locations, run_spec.tokenizer, initial and initial.path))
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


def _check_recorded_vocabulary(run_spec, options: RunOptions) -> None:
    """The vocabulary the checkpoints were trained with, by its recorded fingerprint: this
    job's own when training resumes, and an evaluation's source run. Before any data is
    tokenized or anything is written."""
    vocab_path = (options.data_locations or {}).get("vocab_path")
    record.check_vocabulary(run_spec.tokenizer, options.job_log_dir, vocab_path)
    if options.mode == "eval" and options.restore_checkpoint_dir:
        record.check_vocabulary(run_spec.tokenizer, options.restore_checkpoint_dir, vocab_path)


def _starting_state(trainer: Trainer, source, options: RunOptions, config: fdl.Config):
    """(state, input state, start step, the step resumed in this job's own directory or
    None): restored from `source`, from CHECKPOINT_RESTORE_PATH's weights, or None (the
    trainer initialises it)."""
    checkpoint_dir = checkpoints.job_checkpoint_dir(options.job_log_dir)
    if source is not None:
        restored = _restore(source, trainer.abstract_state, options.skip_broken_checkpoints,
                            checkpoint_dir)
        log(f"restored step {restored.step} from {restored.path}")
        resumed_step = restored.step if source[0] == checkpoint_dir else None
        return restored.state, restored.input_state, restored.step, resumed_step
    initial = trainer.run.initial_weights
    if initial is None:
        return None, None, 0, None
    state = trainer.init_state()  # a new run from trained weights
    state["params"] = initial_weights.load(initial, state["params"],
                                           trainer.abstract_state["params"], config.model)
    return state, None, 0, None


def _nothing_to_evaluate(exp, interval: int) -> str:
    """The note for a run whose evaluation interval has no evaluation to run."""
    held_out = ("--fdl.VALIDATION_FRACTION=0.01 (or --fdl.VALIDATION_FILES=...), "
                if getattr(exp.dataset(), "takes_validation", False) else "")
    return (f"note: EVAL_INTERVAL_STEPS={interval}, but {type(exp).__name__} has nothing to "
            f"evaluate (no validation set, no Lambada): training only; for evaluations set "
            f"{held_out}--fdl.LAMBADA_EVAL=True with Lambada under --data_dir")


def _evaluate(exp, config, run_spec, mesh, source, options: RunOptions):
    """--mode=eval: every evaluation set once, on a checkpoint's parameters."""
    checkpoint_dir = checkpoints.job_checkpoint_dir(options.job_log_dir)
    # An evaluation writes a config only into a directory of its own: evaluating a training
    # run's directory (e.g. Lambada126M on a GPT126M run) must not overwrite that run's record.
    if _is_primary() and checkpoints.latest_step(checkpoint_dir) is None:
        record.write_config(options.job_log_dir, exp, config)
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
