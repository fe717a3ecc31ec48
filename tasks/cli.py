"""Shared entry-point wrapper for the data commands (`python -m tasks.prepare` etc.)."""

import sys

from absl import app

from paxloom.core.errors import UserError


def run(main) -> None:
    """absl's app.run, but a UserError prints one line and exits 2, like main.py."""

    def wrapped(argv):
        try:
            return main(argv)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)

    app.run(wrapped)
