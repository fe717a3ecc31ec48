"""Shared entry-point wrapper for the data commands (`python -m tasks.prepare` etc.)."""

import sys

from absl import app

from tasks.errors import DataError


def run(main) -> None:
    """absl's app.run, but a DataError prints one line and exits 2, like main.py."""

    def wrapped(argv):
        try:
            return main(argv)
        except DataError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)

    app.run(wrapped)
