"""The command line of the tools (`python -m paxloom.tools.export_hf`, `python -m paxloom.tools.import_hf`):
absl flags with --help, and a UserError as one line and exit status 2, like main.py."""

import sys

from absl import app, flags

from paxloom.core import errors
from paxloom.core.errors import UserError

app.define_help_flags()  # --help, -?, --helpshort, --helpfull; idempotent


def parse_flags(argv: list[str]) -> None:
    """absl's flags from `argv`. --help (-h) prints the module docstring and the tool's flags
    and exits 1, absl's convention (main.py's own --help exits 0); a bad flag is a UserError."""
    argv = ["--help" if arg == "-h" else arg for arg in argv]  # absl's own short form is -?
    try:
        flags.FLAGS(argv)
    except flags.Error as error:
        raise UserError(str(error)) from None


def run(main) -> None:
    """`main(sys.argv)`, its UserError printed as one line with exit status 2."""
    try:
        main(sys.argv)
    except UserError as error:
        print(f"error: {errors.message(error)}", file=sys.stderr)
        sys.exit(2)
