"""The one exception type the data layer raises for bad user input."""


class DataError(ValueError):
    """User-facing data problem; main.py prints its one-line message and exits 2.

    The message names the file (and line, where there is one) and says how to fix
    it, so a user never needs the traceback. Programming errors stay ordinary
    exceptions and keep theirs.
    """
