"""Console lines: every package's progress and warnings go through `log`, so a
multi-process job prints each line once."""

import jax


def log(message: str) -> None:
    """One console line, from process 0 only."""
    if jax.process_index() == 0:
        print(message, flush=True)
