"""Where Paxloom keeps what it can rebuild, per user: tokenized data, the sample corpus,
compiled programs."""

import os
from pathlib import Path


def user_cache_dir(name: str, environ=None) -> Path:
    """$XDG_CACHE_HOME/paxloom/NAME (~/.cache/paxloom/NAME without it): where Paxloom keeps
    what it can rebuild (tokenized data, the sample corpus, compiled programs)."""
    environ = os.environ if environ is None else environ
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "paxloom" / name
