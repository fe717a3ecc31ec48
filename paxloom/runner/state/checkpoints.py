"""Checkpoints: the train state saved and restored with orbax, asynchronously.

Each step is one directory, job_log_dir/checkpoints/<step>/, holding three items:

    state/     {'step', 'params', 'opt_state'}: the sharded arrays, written by every
               process for its own shards (orbax PyTree handler, tensorstore)
    input/     the input pipeline's position, `data.get_state()` (JSON)
    metadata/  experiment name, shape hyperparameters, parameter shapes and dtypes (JSON)

There is no RNG item: the step's dropout key is fold_in(key(RANDOM_SEED), step)
(Trainer._train_step), so restoring the step restores the random stream.

Orbax writes a step into `<step>.orbax-checkpoint-tmp` and renames it once every
item is complete, and deletes old steps only after that; so a save cut short by
a crash, SIGKILL or full disk is never taken for a checkpoint and never costs
the previous one.
"""

import contextlib
import dataclasses
import logging
import os
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp

from layers import layer_layout
from paxloom.core.callbacks import Callback, Request, RunInfo, StepInfo
from paxloom.core.errors import UserError
from paxloom.core.log import log

# Hyperparameters that decide parameter shapes: recorded so that a mismatch can
# be explained in the experiment's own terms.
SHAPE_HYPERPARAMETERS = (
    "NUM_LAYERS", "NUM_HEADS", "MODEL_DIMS", "HIDDEN_DIMS", "DIMS_PER_HEAD", "VOCAB_SIZE",
    "MAX_SEQ_LEN", "USE_REPEATED_LAYER", "ICI_MESH_SHAPE", "DCN_MESH_SHAPE",
)


class _OrbaxSaveErrors(logging.Filter):
    """Orbax logs a failed background save as several tracebacks, and asyncio adds "Task
    exception was never retrieved" for each of orbax's write tasks that failed after the
    first; the Checkpointer reports the same failure as one UserError line (naming the step
    and the intact checkpoint)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR
                    and ("/orbax/" in record.pathname or "/orbax/" in record.getMessage()))


logging.getLogger("absl").addFilter(_OrbaxSaveErrors())
logging.getLogger("asyncio").addFilter(_OrbaxSaveErrors())


def _quiet_closed_event_loop(unraisable, default=sys.unraisablehook) -> None:
    """After a failed save (a full disk), tensorstore's pending write callbacks still call
    into orbax's event loop, already closed, each printing a traceback; the failure itself
    is reported once, as the UserError."""
    if not (isinstance(unraisable.exc_value, RuntimeError)
            and str(unraisable.exc_value) == "Event loop is closed"):
        default(unraisable)


sys.unraisablehook = _quiet_closed_event_loop


def job_checkpoint_dir(job_log_dir: str) -> str:
    return os.path.join(os.path.abspath(job_log_dir), "checkpoints")


def _handlers() -> dict:
    # Orbax's replica-parallel save splits each replicated array so that every
    # replica writes a part: worth it when replicas sit on different hosts, but in
    # one process it only adds eager slice ops (a tiny model's first save: 11 s
    # instead of 0.2 s on CPU, compiling them).
    arrays = ocp.type_handlers.ArrayHandler(use_replica_parallel=jax.process_count() > 1)
    registry = ocp.type_handlers.create_type_handler_registry(
        (np.ndarray, ocp.type_handlers.NumpyHandler()),  # for load_numpy
        (jax.Array, arrays),
    )
    return {
        "state": ocp.PyTreeCheckpointHandler(type_handler_registry=registry),
        "input": ocp.JsonCheckpointHandler(),
        "metadata": ocp.JsonCheckpointHandler(),
    }


def param_path(path) -> str:
    """A parameter's path in a tree as checkpoints and errors name it: "lm/final_ln/scale"."""
    return jax.tree_util.keystr(path, simple=True, separator="/")


def flat_params(tree) -> dict:
    """{parameter path: leaf} of a parameter tree (arrays, numpy or abstract)."""
    return {param_path(path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def nested_params(flat: dict) -> dict:
    """The parameter tree of {parameter path: leaf}: flat_params' inverse."""
    tree: dict = {}
    for name, leaf in flat.items():
        *parents, last = name.split("/")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = leaf
    return tree


def param_shapes(params) -> dict[str, dict]:
    """{'lm/softmax/embedding/w': {'shape': [V, D], 'dtype': 'float32'}, ...} of a (abstract) tree."""
    return {
        param_path(path): {"shape": list(leaf.shape), "dtype": str(leaf.dtype)}
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    }


def run_metadata(experiment: str, hyperparameters: dict, abstract_params) -> dict:
    """The metadata item: what a person (or a refusal message) needs to know about a checkpoint."""
    return {
        "experiment": experiment,
        "hyperparameters": {k: hyperparameters[k] for k in SHAPE_HYPERPARAMETERS
                            if k in hyperparameters},
        "params": param_shapes(abstract_params),
    }


@contextlib.contextmanager
def _orbax_warnings_off():
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        absl_logger.setLevel(level)


@contextlib.contextmanager
def _reader(directory: str):
    """A read-only CheckpointManager over `directory` (which may not exist)."""
    # Orbax warns on every read-only open that the directory is read-only; that is the point.
    with _orbax_warnings_off():
        manager = ocp.CheckpointManager(
            os.path.abspath(directory), item_handlers=_handlers(),
            options=ocp.CheckpointManagerOptions(read_only=True, create=False,
                                                 save_interval_steps=0),
        )
    try:
        yield manager
    finally:
        manager.close()


def all_steps(directory: str) -> list[int]:
    """The complete checkpoints' steps in `directory`, ascending ([] when it does not exist)."""
    if not os.path.isdir(directory):
        return []
    with _reader(directory) as manager:
        return sorted(manager.all_steps())


def latest_step(directory: str) -> int | None:
    """The newest complete checkpoint in `directory`, or None (also when it does not exist)."""
    if not os.path.isdir(directory):
        return None
    with _reader(directory) as manager:
        return manager.latest_step()


def read_metadata(directory: str, step: int) -> dict:
    with _reader(directory) as manager:
        restored = manager.restore(step, args=ocp.args.Composite(metadata=ocp.args.JsonRestore()))
    return restored["metadata"] or {}


def check_experiment(directory: str, experiment: str) -> None:
    """Refuse to train `experiment` into a checkpoint directory that belongs to another one."""
    # The newest step whose metadata reads: a damaged one is named (and, with
    # --skip_broken_checkpoints, set aside) by the restore that follows.
    for step in reversed(all_steps(directory)):
        try:
            with _orbax_warnings_off():
                saved = read_metadata(directory, step).get("experiment")
            break
        except Exception:
            continue
    else:
        return
    if saved is not None and saved != experiment:
        job_log_dir = os.path.dirname(directory)
        raise UserError(
            f"--job_log_dir={job_log_dir} holds checkpoints of {saved} (latest step {step}), "
            f"not {experiment}; use another --job_log_dir (add "
            f"--restore_checkpoint_dir={directory} to start from those weights)"
        )


def _check_shapes(directory: str, step: int, saved_params, abstract_params,
                  note: str = "") -> None:
    """UserError naming the first parameter whose saved shape differs from this model's.

    Dtypes may differ: orbax casts on restore, as a change of parameter dtype intends.
    `note` follows the checkpoint's name (the layer layouts, when they differ).
    """
    saved = {param_path(p): leaf.shape
             for p, leaf in jax.tree_util.tree_flatten_with_path(saved_params)[0]}
    where = f"checkpoint {os.path.join(directory, str(step))}{note}"
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_params)[0]:
        name = param_path(path)
        if name not in saved:
            raise UserError(f"{where} has no parameter {name} {tuple(leaf.shape)}: it holds "
                            f"another model; check the shape hyperparameters (NUM_LAYERS, ...)")
        if tuple(saved[name]) != tuple(leaf.shape):
            raise UserError(f"{where} holds parameter {name} with shape {tuple(saved[name])}, "
                            f"but this model's is {tuple(leaf.shape)}: it is another model; "
                            f"check the shape hyperparameters (MODEL_DIMS, HIDDEN_DIMS, ...)")
    extra = sorted(set(saved) - {param_path(p) for p, _ in
                                 jax.tree_util.tree_flatten_with_path(abstract_params)[0]})
    if extra:
        raise UserError(f"{where} holds parameter {extra[0]} {tuple(saved[extra[0]])}, which "
                        f"this model lacks: it is another model")


def stack_layouts(directory: str, step: int, saved_params, abstract_params
                  ) -> tuple[layer_layout.StackLayout, layer_layout.StackLayout] | None:
    """(the checkpoint's layer layout, this model's) when the two store the decoder layers
    differently (plain, repeated, pipelined: layers/layer_layout.py) and the checkpoint's
    can be relaid into this model's; None when they agree (or either is not a layer stack
    known there). UserError, one line naming both, when the layer counts differ."""
    saved = layer_layout.from_shapes(flat_params(saved_params))
    mine = layer_layout.from_shapes(flat_params(abstract_params))
    def how(layout):  # how the layers are stored, whatever they hold
        return layout.repeated, layout.block, layout.stages, layout.circular_repeat

    if saved is None or mine is None or how(saved) == how(mine):
        return None
    if saved.num_layers != mine.num_layers:
        raise UserError(f"checkpoint {os.path.join(directory, str(step))} holds {saved}; this "
                        f"model has {mine}: it is another model; check NUM_LAYERS")
    try:
        relaid = layer_layout.relayout_tree(saved_params, saved, mine)
    except layer_layout.LayoutMismatch as error:
        raise UserError(f"checkpoint {os.path.join(directory, str(step))} holds {saved}, this "
                        f"model has {mine}, and they do not map: {error}") from None
    _check_shapes(directory, step, relaid, abstract_params,
                  note=f" ({saved}; this model: {mine})")
    return saved, mine


def _host_target(target):
    """`target` (ShapeDtypeStructs with shardings) as plain shapes, with the restore arguments
    that read each array whole into host numpy."""
    shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), target)
    return shapes, jax.tree_util.tree_map(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray), shapes)


def _place(array, like) -> jax.Array:
    """A host array as a global array with `like`'s dtype and sharding; each process puts
    only its own devices' blocks (every process holds the whole array)."""
    array = np.asarray(array, like.dtype)
    return jax.make_array_from_callback(array.shape, like.sharding, lambda index: array[index])


def restore_source(job_dir: str, restore_dir: str | None, restore_step: int | None,
                   mode: str) -> tuple[str, int] | None:
    """The (directory, step) a run starts from, or None for freshly initialised parameters.

    Training resumes from the job's own checkpoints whenever it has any, so running
    the same command again after a preemption continues where it stopped, even a
    fine-tuning command: --restore_checkpoint_dir only seeds a job that has none.
    Evaluation takes --restore_checkpoint_dir whenever it is given.
    """
    own = latest_step(job_dir)
    if restore_dir and (mode == "eval" or own is None):
        directory = os.path.abspath(restore_dir)
        if os.path.isdir(os.path.join(directory, "checkpoints")):  # a job_log_dir was given
            directory = os.path.join(directory, "checkpoints")
        step = latest_step(directory) if restore_step is None else restore_step
        if step is None:
            raise UserError(f"--restore_checkpoint_dir={restore_dir}: no checkpoint in {directory}")
        return directory, step
    if restore_dir:
        log(f"{job_dir} has checkpoints (latest step {own}): resuming from them; "
            f"--restore_checkpoint_dir only seeds a job that has none")
        return job_dir, own
    if restore_step is None:
        return None if own is None else (job_dir, own)
    if own is None:
        raise UserError(f"--restore_checkpoint_step={restore_step}: {job_dir} has no checkpoints")
    steps = all_steps(job_dir)
    if restore_step not in steps:
        raise UserError(f"--restore_checkpoint_step={restore_step}: {job_dir} has no such "
                        f"checkpoint; it has steps {steps}")
    if mode == "train" and restore_step != own:
        raise UserError(
            f"--restore_checkpoint_step={restore_step}: {job_dir} has later checkpoints (latest "
            f"step {own}), and training on from an earlier one would mix two histories in one "
            f"directory; use a new --job_log_dir with --restore_checkpoint_dir={job_dir} "
            f"--restore_checkpoint_step={restore_step}")
    return job_dir, restore_step


class BrokenCheckpointError(UserError):
    """A checkpoint that orbax lists as complete cannot be read (a file missing or garbled)."""

    def __init__(self, directory: str, step: int, error: Exception):
        self.directory, self.step = directory, step
        # The complete steps before this one, oldest first: where a fallback would go.
        self.earlier = [s for s in all_steps(directory) if s < step]
        detail = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        if self.earlier:
            fix = (f"--skip_broken_checkpoints sets it aside (into {set_aside_dir(directory)}) "
                   f"and resumes from step {self.earlier[-1]}")
        else:
            fix = (f"there is no earlier checkpoint: move {directory}/{step} away to start "
                   f"over, or put back an intact copy")
        super().__init__(f"checkpoint step {step} in {directory} is damaged ({detail}); {fix}")


def set_aside_dir(directory: str) -> str:
    return os.path.abspath(directory).rstrip("/") + "-broken"


def set_aside(directory: str, step: int) -> str:
    """Move a damaged checkpoint out of the checkpoint directory (never delete it)."""
    target = os.path.join(set_aside_dir(directory), f"{step}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.replace(os.path.join(directory, str(step)), target)
    return target


@dataclasses.dataclass
class Restored:
    step: int
    path: str
    state: dict  # {'step', 'params', 'opt_state'}, or only {'params'}
    input_state: dict | None
    metadata: dict


def restore(directory: str, step: int | None, abstract_state: dict, *,
            params_only: bool = False) -> Restored:
    """Read a checkpoint straight into the layout of `abstract_state` (ShapeDtypeStructs with
    shardings): each device reads only its own shards, whatever mesh wrote them."""
    with _reader(directory) as manager:
        steps = manager.all_steps()
        if step is None:
            step = manager.latest_step()
            if step is None:
                raise UserError(f"no checkpoint in {directory}")
        elif step not in steps:
            raise UserError(f"no checkpoint for step {step} in {directory}; it has steps "
                            f"{sorted(steps) or 'none'}")
        try:
            with _orbax_warnings_off():  # a damaged item's warning; the error says it all
                saved = manager.item_metadata(step)["state"]
        except Exception as error:
            raise BrokenCheckpointError(directory, step, error) from None
        if saved is None:
            raise BrokenCheckpointError(directory, step, FileNotFoundError("no state metadata"))
        layouts = stack_layouts(directory, step, saved["params"], abstract_state["params"])
        if layouts is None:
            _check_shapes(directory, step, saved["params"], abstract_state["params"])
        target = {"params": abstract_state["params"]} if params_only else abstract_state
        if layouts is None:  # the common case: each device reads its own shards
            item = target
            restore_args = ocp.checkpoint_utils.construct_restore_args(target)
        else:
            # The checkpoint stores the decoder layers in another layout (say, pipeline
            # stages): read its state whole into host numpy on every process, in its own
            # layout, then relay every params-shaped subtree (params, Adam moments) below.
            # Slower and host-memory hungry, but only a change of layout takes this path.
            item, restore_args = _host_target(
                layer_layout.relayout_tree(target, layouts[1], layouts[0]))
        try:
            restored = manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.PyTreeRestore(
                    item=item,
                    restore_args=restore_args,
                    # Evaluation needs no optimizer moments: skip reading them.
                    partial_restore=params_only,
                ),
                input=ocp.args.JsonRestore(),
                metadata=ocp.args.JsonRestore(),
            ))
        except Exception as error:
            raise BrokenCheckpointError(directory, step, error) from None
    state = restored["state"]
    if layouts is not None:
        state = jax.tree_util.tree_map(
            _place, layer_layout.relayout_tree(state, layouts[0], layouts[1]), target)
    return Restored(step=step, path=os.path.join(directory, str(step)), state=state,
                    input_state=restored["input"], metadata=restored["metadata"] or {})


def _saved_state_metadata(directory: str, step: int):
    with _reader(directory) as manager:
        try:
            with _orbax_warnings_off():
                saved = manager.item_metadata(step)["state"]
        except Exception as error:
            raise BrokenCheckpointError(directory, step, error) from None
    if saved is None:
        raise BrokenCheckpointError(directory, step, FileNotFoundError("no state metadata"))
    return saved


def saved_param_shapes(directory: str, step: int) -> dict[str, tuple[int, ...]]:
    """{parameter path: shape} of a checkpoint's parameters, read from its metadata."""
    saved = _saved_state_metadata(directory, step)
    return {param_path(path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_flatten_with_path(saved["params"])[0]}


def relaid_params(directory: str, step: int, abstract_params: dict) -> dict | None:
    """{parameter path: host numpy array} of a checkpoint whose decoder layers are stored in
    another layout than `abstract_params`' (every parameter, relaid into this model's
    layout; shapes checked); None when the layouts agree (restore_params reads those)."""
    saved = _saved_state_metadata(directory, step)["params"]
    layouts = stack_layouts(directory, step, saved, abstract_params)
    if layouts is None:
        return None
    item, restore_args = _host_target(
        layer_layout.relayout_tree({"params": abstract_params}, layouts[1], layouts[0]))
    with _reader(directory) as manager:
        try:
            restored = manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.PyTreeRestore(item=item, restore_args=restore_args,
                                             partial_restore=True)))
        except Exception as error:
            raise BrokenCheckpointError(directory, step, error) from None
    return flat_params(layer_layout.relayout_tree(restored["state"], *layouts)["params"])


def restore_params(directory: str, step: int, abstract_params: dict) -> dict:
    """The parameters of a checkpoint that `abstract_params` names (a subset of the saved
    tree is fine), read straight into its shardings; nothing else is read."""
    target = {"params": abstract_params}
    with _reader(directory) as manager:
        try:
            restored = manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.PyTreeRestore(
                    item=target,
                    restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                    partial_restore=True)))
        except Exception as error:
            raise BrokenCheckpointError(directory, step, error) from None
    return restored["state"]["params"]


def load_numpy(directory: str, step: int | None = None) -> tuple[int, dict]:
    """(step, train state as host numpy arrays) of a checkpoint, on any devices: for
    inspecting checkpoints and comparing runs, not for training."""
    with _reader(directory) as manager:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise UserError(f"no checkpoint in {directory}")
        saved = manager.item_metadata(step)["state"]
        as_numpy = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                                          saved)
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(restore_args=as_numpy)))
    return step, restored["state"]


class Checkpointer(Callback):
    """Saves one run's checkpoints, as a training-loop callback: it requests a save every
    `every_n_steps` and writes in on_save. Use as a context manager (close() waits for the
    save in flight).

    Saves are asynchronous: `save` blocks only while the arrays are copied to host
    memory (and while a previous save still writes), then training goes on while
    orbax writes files. The last step is always saved, and waited for.
    """

    def __init__(self, directory: str, *, metadata: dict, every_n_steps: int, max_to_keep: int):
        self.directory = os.path.abspath(directory)
        self.metadata, self.save_every = metadata, every_n_steps
        self.publish = lambda split, step, scalars: None  # the loop's, from on_start
        try:
            self._manager = ocp.CheckpointManager(
                self.directory, item_handlers=_handlers(),
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=max_to_keep or None,
                    enable_async_checkpointing=True,
                    # Remove `<step>.orbax-checkpoint-tmp` left by a killed save.
                    cleanup_tmp_directories=True,
                ),
            )
        except OSError as error:
            raise UserError(f"cannot create the checkpoint directory {self.directory}: "
                            f"{error}") from error
        self._saved_step = self._manager.latest_step()  # also counts a save still being written
        self._writing: int | None = None  # the step orbax is writing in the background

    def on_start(self, run: RunInfo) -> None:
        self.publish = run.publish

    def after_step(self, info: StepInfo) -> Request:
        self.check()
        return Request(save=self.should_save(info.step))

    def on_save(self, info: StepInfo, final: bool) -> None:
        self.save(info.step, info.state, info.input_state, final=final)

    def should_save(self, step: int) -> bool:
        return bool(self.save_every) and step % self.save_every == 0

    def save(self, step: int, state: dict, input_state: dict | None, final: bool = False) -> None:
        """Start saving `state` at `step`; with `final`, also wait until it is on disk."""
        start = time.perf_counter()
        if self._saved_step is None or step > self._saved_step:
            self.wait()  # orbax would wait too; this names the step if it failed
            with self._errors_as_user_error(step):
                self._manager.save(step, force=True, args=ocp.args.Composite(
                    state=ocp.args.PyTreeSave(state),
                    input=ocp.args.JsonSave(input_state or {}),
                    metadata=ocp.args.JsonSave({**self.metadata, "step": step}),
                ))
            # Training was blocked this long: the device-to-host copy, plus any wait
            # for the previous save.
            blocking = time.perf_counter() - start
            self._saved_step, self._writing = step, step
            self.publish("train", step, {"checkpoint/save_seconds": blocking})
            if not final:
                log(f"step {step:>6} | checkpoint {self._path(step)} | blocked {blocking:.2f}s, "
                    f"writing in the background")
        if final:  # also when this step was already saved (a periodic save, a finished run)
            self.wait()
            log(f"step {step:>6} | checkpoint {self._path(step)} complete "
                f"({time.perf_counter() - start:.2f}s)")

    def writing(self) -> bool:
        """Whether a save is still being written in the background."""
        return self._writing is not None and self._manager.is_saving_in_progress()

    def check(self) -> None:
        """Cheap, after every step: a background save that has failed stops the run now,
        not at the next checkpoint (which may be an hour of training away)."""
        if self._writing is not None and not self._manager.is_saving_in_progress():
            self.wait()

    def wait(self) -> None:
        """Block until the save in flight (if any) is written; UserError if it failed."""
        if self._writing is not None:
            with self._errors_as_user_error(self._writing):
                self._manager.wait_until_finished()
                self._manager.check_for_errors()
            self._writing = None

    def close(self) -> None:
        """Wait for the save in flight; UserError if it failed."""
        if self._manager is not None:
            self.wait()
            self._manager.close()
            self._manager = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
            return
        # Another error is on its way out: still finish the (good) save in flight,
        # but report a failure of it rather than replace that error.
        try:
            self.close()
        except UserError as close_error:
            log(f"also: {close_error}")

    def _path(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    @contextlib.contextmanager
    def _errors_as_user_error(self, step: int):
        try:
            yield
        except Exception as error:
            self._writing = None
            latest = latest_step(self.directory)  # from disk: orbax's own list drops old steps early
            kept = (f"the last complete checkpoint, step {latest}, is intact"
                    if latest is not None and latest != step else "there is no earlier checkpoint")
            raise UserError(
                f"could not write checkpoint step {step} to {self.directory} "
                f"({type(error).__name__}: {error}); {kept}; check free space and permissions"
            ) from error
