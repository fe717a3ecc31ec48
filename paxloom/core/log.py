"""Console lines: every package's progress and warnings go through `log`, so a
multi-process job prints each line once; durations in them read as `format_duration`."""

def log(message: str) -> None:
    """One console line, from process 0 only."""
    import jax  # here, so that the data layer's progress lines (format_duration) need no jax

    if jax.process_index() == 0:
        print(message, flush=True)


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"
