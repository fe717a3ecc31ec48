"""JAX's persistent compilation cache, on by default: a restart loads its compiled programs.

Every start compiles the train step again: tens of seconds on a GPU for a small GPT, a
large share of a short run (docs/performance.md has the figures). JAX can keep each compiled program in a directory, keyed
by the program, the devices, the compile options, XLA_FLAGS and the jax/jaxlib versions, and
load it on the next start instead, in about a second. MaxText turns this on by
default; main.py does too, for --mode=train, eval and decode:

    --jax_compilation_cache_dir=DIR    (alias --compilation_cache_dir) this directory
    --jax_compilation_cache_dir=none   (or '') no persistent cache
    $JAX_COMPILATION_CACHE_DIR         used when the flag is not given ('' turns it off)
    otherwise                          $XDG_CACHE_HOME/paxloom/jax_compilation_cache
                                       (~/.cache/paxloom/..., where tokenized data goes)

A load is logged by paxloom/runner/training/compile_log.py ("compiled jit(_train_step) in 0.9s (loaded from
the persistent compilation cache DIR)").

Several processes, read from jax 0.10.2's jax/_src/compiler.py, compilation_cache.py and
lru_cache.py: in a jax.distributed job only process 0 writes entries (`_cache_write`
returns early elsewhere; on GPU the per-fusion autotuning cache is likewise read-only
except on process 0). A write is NOT atomic: without a size bound, LRUCache.put checks that
the entry's file is absent and then writes it in place (open 'wb' + write, no lock, no
rename). So two independent runs on one machine that compile the same program together may
both write the file, and a run starting meanwhile may read a partly written one. Neither
breaks a run: a truncated entry fails zstd decompression (and a stray tail after a
complete zstd frame is ignored), and jax catches any error in reading, decompressing or
deserializing an entry, warns, and compiles instead (unless jax_raise_persistent_cache_
errors is set). The one lasting harm: a run killed in the middle of writing leaves a
truncated entry that jax never replaces (put skips existing files), so that program is
compiled, with a warning, on every start until the directory is deleted.

Across processes the key holds on GPU (jax strips the device assignment from it there), so
every process of a restarted job loads process 0's entries. On CPU it does not: a
multi-process CPU job's other processes miss and compile (process 0 still loads).
"""

import os
import sys

from paxloom.core.user_cache import user_cache_dir

# Flag values that turn the cache off.
OFF = ("", "none", "off", "false", "0")

# Settings for the cache main.py turns on, unless the environment sets them (JAX_...).
SETTINGS = {
    # jax writes only programs that took this long to compile (its default: 1 s). The
    # programs that matter take seconds to minutes on a GPU (the train and eval steps, the
    # initial state; a small model's jit(init) can take under 1 s: 0.8 s for a 2-layer
    # model on CPU). A load (read, decompress, deserialize) takes milliseconds from a
    # local disk, ~0.1 s from a network home, so programs down to half a second still
    # gain, while the many small programs below (single ops run outside jit, a few tens
    # of ms each) would only add files.
    "jax_persistent_cache_min_compile_time_secs": 0.5,
    # Entries of any size: jax's default 0 lets a filesystem-specific hook choose a
    # minimum size (0 in open-source jax); -1 fixes "no minimum" so a small but slow
    # program is never skipped for its size.
    "jax_persistent_cache_min_entry_size_bytes": -1,
}
# Left at jax's defaults, on purpose:
# - jax_compilation_cache_max_size (-1: unbounded, as MaxText's ~/jax_cache). A bound makes
#   jax keep an access-time file per entry and take a file lock (filelock) around every
#   read and write; on a network home the lock can stall, and entries written by a jax
#   without a bound have no access-time file, which fails every later write. Delete the
#   directory to reclaim its space.
# - jax_persistent_cache_enable_xla_caches ('xla_gpu_per_fusion_autotune_cache_dir'): on
#   GPU, XLA's autotuning results are kept in a subdirectory too, so even a changed program
#   skips most autotuning. On CPU, jax 0.10.2 caches executables without anything more
#   (tests/test_compilation_cache.py).


def default_dir(environ=None) -> str:
    """$XDG_CACHE_HOME/paxloom/jax_compilation_cache, or ~/.cache/paxloom/..."""
    return str(user_cache_dir("jax_compilation_cache", environ))


def resolve(flag: str | None, environ=None) -> str | None:
    """The cache directory, or None for no cache: the flag when given, else
    $JAX_COMPILATION_CACHE_DIR when set, else default_dir()."""
    environ = os.environ if environ is None else environ
    if flag is not None:
        value = flag
    elif "JAX_COMPILATION_CACHE_DIR" in environ:
        value = environ["JAX_COMPILATION_CACHE_DIR"]
    else:
        return default_dir(environ)
    if value.strip().lower() in OFF:
        return None
    return os.path.abspath(os.path.expanduser(value))


def enable(flag: str | None, environ=None) -> str | None:
    """Point jax at the cache directory (before anything compiles); returns it, or None
    when the cache is off or its directory cannot be created (a note says why)."""
    import jax

    environ = os.environ if environ is None else environ
    path = resolve(flag, environ)
    if path is not None:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as error:
            print(f"note: no persistent compilation cache: cannot create {path} "
                  f"({error.strerror}); choose one with --jax_compilation_cache_dir",
                  file=sys.stderr)
            path = None
    jax.config.update("jax_compilation_cache_dir", path)
    if path is not None:
        for name, value in SETTINGS.items():
            if name.upper() not in environ:
                jax.config.update(name, value)
    return path
