"""Console lines and TensorBoard event files for training and evaluation scalars.

Only process 0 writes, so a multi-process job has one console stream and one
set of event files under job_log_dir/tb/{train,eval}.
"""

import time

import jax
import numpy as np


class SummaryWriter:
    """Scalars to TensorBoard event files on process 0; a no-op elsewhere.

    Written with the `tensorboard` package's own event writer and protos, as
    tf.summary.scalar would write them (a float32 tensor with the scalars plugin's
    metadata), so TensorFlow is never imported: GPU machines often lack it, and it
    must never take a GPU from JAX.
    """

    def __init__(self, logdir: str):
        self._writer = None
        self.logdir = logdir
        if jax.process_index() != 0:
            return
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._writer = EventFileWriter(logdir)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self._writer is None:
            return
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.scalar import metadata
        from tensorboard.util import tensor_util

        summary = summary_pb2.Summary(value=[
            summary_pb2.Summary.Value(
                tag=name,
                tensor=tensor_util.make_tensor_proto(np.float32(value)),
                metadata=metadata.create_summary_metadata(display_name=name, description=""),
            )
            for name, value in values.items()
        ])
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step),
                                               summary=summary))

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()


def log(message: str) -> None:
    """One console line, from process 0 only."""
    if jax.process_index() == 0:
        print(message, flush=True)


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"
