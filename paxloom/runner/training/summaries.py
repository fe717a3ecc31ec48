"""Console lines and TensorBoard event files for training and evaluation scalars.

Only process 0 writes, so a multi-process job has one console stream and one
set of event files under job_log_dir/tb/{train,eval}.
"""

import json
import os
import sys
import time
import types

import jax

from paxloom.core.callbacks import Callback
from paxloom.core.errors import UserError

# TensorBoard's writer imports TensorFlow whenever it is installed (which `.[tfds]` does),
# costing seconds, console noise and possibly GPU memory; a `tensorboard.compat.notf`
# module is TensorBoard's own switch to its TF-free stub (its no_tensorflow build target).
sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))


class SummaryWriter:
    """Scalars to TensorBoard event files and to metrics.jsonl beside them, on process 0;
    a no-op elsewhere.

    Written with the `tensorboard` package's own event writer and protos as simple
    scalar values (what tensorboardX writes, and what TensorBoard's EventAccumulator
    reads as scalars), so TensorFlow is never imported: GPU machines often lack it, and it
    must never take a GPU from JAX.
    """

    def __init__(self, logdir: str):
        self._writer = None
        self.logdir = logdir
        if jax.process_index() != 0:
            return
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._writer = EventFileWriter(logdir)
        self._jsonl = os.path.join(logdir, "metrics.jsonl")

    def restart(self, step: int) -> None:
        """A run resumed at `step`: TensorBoard drops what earlier runs logged from `step`
        on (those steps are trained again), so curves never double back."""
        if self._writer is None:
            return
        from tensorboard.compat.proto import event_pb2

        self._writer.add_event(event_pb2.Event(
            wall_time=time.time(), step=int(step),
            session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self._writer is None:
            return
        from tensorboard.compat.proto import event_pb2, summary_pb2

        summary = summary_pb2.Summary(value=[
            summary_pb2.Summary.Value(tag=name, simple_value=float(value))
            for name, value in values.items()
        ])
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step),
                                               summary=summary))
        self._writer.flush()  # on disk when the console shows it: a killed run keeps its curves
        with open(self._jsonl, "a") as f:
            f.write(json.dumps({"step": int(step), **{k: float(v) for k, v in values.items()}})
                    + "\n")

    def hyperparameters(self, values: dict) -> None:
        """The run's hyperparameters for TensorBoard's HPARAMS tab (values it cannot
        hold, such as mesh shapes, as text)."""
        if self._writer is None:
            return
        from tensorboard.compat.proto import event_pb2
        from tensorboard.plugins.hparams import summary_v2

        shown = {k: v if isinstance(v, (bool, int, float, str)) else str(v)
                 for k, v in values.items()}
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=0,
                                               summary=summary_v2.hparams_pb(shown)))
        self._writer.flush()

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()


class WandbRun(Callback):
    """Optional Weights & Biases logging (--wandb_project), process 0 only: every published
    scalar as SPLIT/NAME. A resumed job continues its W&B run: the run id is kept in
    job_log_dir/wandb_run_id."""

    def __init__(self, project: str, job_log_dir: str, hyperparameters: dict):
        try:
            import wandb
        except ImportError:
            raise UserError("--wandb_project needs the wandb package: pip install wandb") from None
        id_path = os.path.join(job_log_dir, "wandb_run_id")
        run_id = open(id_path).read().strip() if os.path.exists(id_path) else None
        self.run = wandb.init(project=project, id=run_id, resume="allow", dir=job_log_dir,
                              name=os.path.basename(os.path.abspath(job_log_dir)),
                              config=json.loads(json.dumps(hyperparameters)))
        with open(id_path, "w") as f:
            f.write(self.run.id + "\n")

    def on_scalars(self, split: str, step: int, scalars: dict) -> None:
        self.run.log({f"{split}/{k}": float(v) for k, v in scalars.items()}, step=int(step))

    def on_end(self, info) -> None:
        self.run.finish()


