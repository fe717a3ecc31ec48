"""Test setup: 8 fake CPU devices, set before anything imports jax."""

import os
import sys

import pytest

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

# Tests import praxis directly; the compat patches must be in place first.
import layers  # noqa: E402,F401


@pytest.fixture(scope="module")
def compilation_cache(tmp_path_factory):
    """Every job.run builds a new Trainer, which compiles its step again: a persistent
    compilation cache turns all but the first compile of each program into a load."""
    import jax
    from jax._src import compilation_cache as cache

    previous = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("jax_cache")))
    yield
    jax.config.update("jax_compilation_cache_dir", previous)
    cache.reset_cache()  # later test modules see the cache set up as before
