"""Plans `--plan_search` compiled before, kept per user ($XDG_CACHE_HOME/paxloom/plans), so
that a search run again compiles only what changed. A plan is found again by a hash of all
that makes it: the experiment class, its hyperparameters, the graph overrides, the device,
its memory, the compiler, jax's version and the source of paxloom/, layers/ and
experiments/ (any edit there plans afresh). Entries are Plan.portable() pickles; one that
cannot be read is planned again."""

import functools
import hashlib
import os
import pickle
from pathlib import Path

import jax

from paxloom.core.user_cache import user_cache_dir

ROOT = Path(__file__).resolve().parent.parent.parent
SOURCES = ("paxloom", "layers", "experiments")


@functools.cache
def source_hash(root: Path = ROOT) -> str:
    """sha256 over the .py files of paxloom/, layers/ and experiments/ (paths and bytes)."""
    digest = hashlib.sha256()
    for top in SOURCES:
        for path in sorted((root / top).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def key(experiment: type, hyperparameters: dict, graph_overrides: dict, *, device: str,
        device_memory_gb: float, compiler: str) -> str:
    """The cache key of one plan."""
    parts = [f"{experiment.__module__}.{experiment.__qualname__}",
             repr(sorted(hyperparameters.items())), repr(sorted(graph_overrides.items())),
             device, repr(float(device_memory_gb)), compiler, jax.__version__, source_hash()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def directory() -> Path:
    return user_cache_dir("plans")


def get(cache_key: str):
    """The plan kept under `cache_key`, or None."""
    path = directory() / f"{cache_key}.pkl"
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
        return None


def put(cache_key: str, plan) -> None:
    """Keep `plan` (a Plan.portable()); a cache that cannot be written is no error."""
    path = directory() / f"{cache_key}.pkl"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        with open(temporary, "wb") as f:
            pickle.dump(plan, f)
        os.replace(temporary, path)
    except OSError:
        pass
