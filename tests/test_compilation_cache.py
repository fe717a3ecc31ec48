"""The persistent compilation cache main.py turns on (paxloom/runner/cluster/compilation_cache.py): where it
goes, how it is turned off, and a second start loading what the first compiled.

Every cache here is under tmp_path: none of these runs writes into the user's ~/.cache.
"""

import os
import re

import pytest

from paxloom.runner.cluster import compilation_cache
from tests.support.processes import run_main
from tests.support.tiny import model_flags


@pytest.mark.parametrize("flag, environ, expected", [
    (None, {"XDG_CACHE_HOME": "/x"}, "/x/paxloom/jax_compilation_cache"),
    (None, {"HOME": "/home/u"}, "/home/u/.cache/paxloom/jax_compilation_cache"),
    (None, {"JAX_COMPILATION_CACHE_DIR": "/j", "XDG_CACHE_HOME": "/x"}, "/j"),
    (None, {"JAX_COMPILATION_CACHE_DIR": ""}, None),  # the user's '' turns it off, as in jax
    ("/f", {"JAX_COMPILATION_CACHE_DIR": "/j"}, "/f"),  # the flag wins
    ("none", {"JAX_COMPILATION_CACHE_DIR": "/j"}, None),
    ("", {}, None),
    ("~/c", {"HOME": "/home/u"}, "/home/u/c"),
])
def test_where_the_cache_goes(monkeypatch, flag, environ, expected):
    if "HOME" in environ:
        monkeypatch.setenv("HOME", environ["HOME"])  # os.path.expanduser reads os.environ
    assert compilation_cache.resolve(flag, environ) == expected


def test_enable_sets_jax_up_and_leaves_the_users_settings(tmp_path):
    import jax

    names = ["jax_compilation_cache_dir", *compilation_cache.SETTINGS]
    before = {name: getattr(jax.config, name) for name in names}
    try:
        environ = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "3"}
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 3.0)
        path = compilation_cache.enable(str(tmp_path / "c"), environ)
        assert path == str(tmp_path / "c") and (tmp_path / "c").is_dir()
        assert jax.config.jax_compilation_cache_dir == path
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 3.0  # the user's
        assert jax.config.jax_persistent_cache_min_entry_size_bytes == -1
        assert compilation_cache.enable("none", environ) is None
        assert jax.config.jax_compilation_cache_dir is None
        # A directory that cannot be made: a note, and no cache rather than a failed run.
        (tmp_path / "file").write_text("")
        assert compilation_cache.enable(str(tmp_path / "file" / "c"), environ) is None
        assert jax.config.jax_compilation_cache_dir is None
    finally:
        for name, value in before.items():
            jax.config.update(name, value)


def two_steps(job_dir, env, *flags) -> str:
    """main.py's output of two steps of the tiny model (as tests/test_main_cli.py's TINY_FLAGS)."""
    return run_main("--fdl_config=experiments.Synthetic126M",
                    *model_flags(NUM_HEADS=4, DIMS_PER_HEAD=16), "--fdl.MAX_STEPS=2",
                    "--fdl.ICI_MESH_SHAPE=[8,1,1]", "--fdl.PERCORE_BATCH_SIZE=1",
                    "--noeval_on_test", "--enable_checkpoint_saving=false",
                    f"--job_log_dir={job_dir}", *flags, env=env, check=True).stdout


@pytest.mark.process
def test_a_second_start_loads_what_the_first_compiled(tmp_path):
    env = {k: v for k, v in os.environ.items()  # conftest: 8 CPU devices
           if k != "JAX_COMPILATION_CACHE_DIR"}
    # Cache whatever compiles, however fast this machine compiles it.
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    # The default directory: under $XDG_CACHE_HOME (here a temporary one).
    first = two_steps(tmp_path / "first", {**env, "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    cache = tmp_path / "xdg" / "paxloom" / "jax_compilation_cache"
    assert re.search(rf"^compiled jit\(_train_step\) in [\d.]+s \(saved to the persistent "
                     rf"compilation cache {re.escape(str(cache))}\)$", first, re.M), first
    assert list(cache.glob("jit__train_step-*-cache")), list(cache.iterdir())
    # The flag names it, and wins over $JAX_COMPILATION_CACHE_DIR.
    again = two_steps(tmp_path / "again",
                      {**env, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "j")},
                      f"--compilation_cache_dir={cache}")
    assert re.search(rf"^compiling the train step \(jit\(_train_step\)\) \.\.\.\n"
                     rf"compiled jit\(_train_step\) in [\d.]+s \(loaded from the persistent "
                     rf"compilation cache {re.escape(str(cache))}\)$", again, re.M), again
    assert not (tmp_path / "j").exists()
