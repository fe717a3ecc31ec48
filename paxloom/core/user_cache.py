"""Where Paxloom keeps what it can rebuild, per user: tokenized data, the sample corpus,
compiled programs."""

import os
from pathlib import Path


def user_cache_dir(name: str, environ=None) -> Path:
    """$XDG_CACHE_HOME/paxloom/NAME (~/.cache/paxloom/NAME without it): where Paxloom keeps
    what it can rebuild (tokenized data, the sample corpus, compiled programs)."""
    environ = os.environ if environ is None else environ
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "paxloom" / name


# The token cache's directory when --cache_dir names none (a scratch filesystem of the
# cluster, or a test's temporary directory).
TOKEN_CACHE_ENV = "PAXLOOM_TOKEN_CACHE_DIR"


def token_cache_dir(environ=None) -> Path:
    """Where tokenized data go unless --cache_dir says: $PAXLOOM_TOKEN_CACHE_DIR, else
    user_cache_dir("tokenized"). Never the data's own directory, which on a cluster is
    often shared or read-only."""
    environ = os.environ if environ is None else environ
    if environ.get(TOKEN_CACHE_ENV):
        return Path(environ[TOKEN_CACHE_ENV])
    return user_cache_dir("tokenized", environ)
