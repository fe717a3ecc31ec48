"""Test setup: 8 fake CPU devices, set before anything imports jax.

Tests that start main.py in a subprocess pass this environment on: the same devices, XLA:CPU
compiling with its cheap settings (tests are mostly compile time on 2 cores; the maths is
unchanged), one persistent compilation cache for the whole session, so a program that
several runs compile is compiled once, and one token cache for the session's tokenized data. main.py's cache is on by default, in the user's
~/.cache/paxloom: a test that starts it without JAX_COMPILATION_CACHE_DIR must pass
--jax_compilation_cache_dir (or JAX_COMPILATION_CACHE_DIR="", none) instead.
"""

import os
import subprocess
import sys
import tempfile

import pytest

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="paxloom-jax-cache-"))
# The token cache (tokenized data) of every run of the session: never the user's ~/.cache.
os.environ.setdefault("PAXLOOM_TOKEN_CACHE_DIR", tempfile.mkdtemp(prefix="paxloom-tokens-"))

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

# Tests import praxis directly; the compat patches must be in place first.
import layers  # noqa: E402,F401

# A test whose pytest-xdist worker dies runs once more (tests/support/crash_rerun.py says why).
from tests.support.crash_rerun import (  # noqa: E402,F401
    pytest_handlecrashitem,
    pytest_report_teststatus,
    pytest_terminal_summary,
)


@pytest.fixture(autouse=True)
def processes_only_where_marked(request, monkeypatch):
    """A test that starts a program of this repository or its environment (python, bash,
    a .venv/bin tool) must be marked `process` (setup.cfg), so that the unit tests, which
    run in the test's own process, can be run apart (`make test-unit`)."""
    if request.node.get_closest_marker("process"):
        yield
        return
    start = subprocess.Popen.__init__

    def guarded(self, args, *rest, **options):
        program = (args.split() if isinstance(args, str) else list(args))[0]
        if _is_repository_program(os.fspath(program)):
            pytest.fail(f"{request.node.nodeid} starts {program}: mark it "
                        f"@pytest.mark.process", pytrace=False)
        start(self, args, *rest, **options)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)
    yield


def _is_repository_program(program: str) -> bool:
    name = os.path.basename(program)
    return (name.startswith("python") or name in ("bash", "sh")
            or program.startswith((sys.prefix, REPO_ROOT)) or program.endswith(".sh"))


@pytest.fixture
def exact_matmuls():
    """float32 matmuls at full precision, for checks against an independent float32
    reference (XLA may otherwise lower them at a reduced precision, as TF32 on GPUs)."""
    import jax

    with jax.default_matmul_precision("highest"):
        yield


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
