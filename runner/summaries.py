"""Console lines and TensorBoard event files for training and evaluation scalars.

Only process 0 writes, so a multi-process job has one console stream and one
set of event files under job_log_dir/tb/{train,eval}.
"""

import os

import jax


class SummaryWriter:
    """Scalars to TensorBoard event files (via tf.summary) on process 0; a no-op elsewhere."""

    def __init__(self, logdir: str):
        self._writer = None
        self.logdir = logdir
        if jax.process_index() != 0:
            return
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import tensorflow as tf  # imported here: TF is only an event-file writer

        # TensorFlow must never take a GPU from JAX.
        tf.config.set_visible_devices([], "GPU")
        self._tf = tf
        self._writer = tf.summary.create_file_writer(logdir)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self._writer is None:
            return
        with self._writer.as_default(step=step):
            for name, value in values.items():
                self._tf.summary.scalar(name, value)

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
