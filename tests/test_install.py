"""Paxloom installs as a package from a clone, into a fresh virtual environment, with the
[text] extra and praxis without its stale pins, and the installed `paxloom` command trains a
tiny model on a .txt corpus with a tokenizer.json, away from the clone. The distribution
installs four top-level names, the three that Pax users import (experiments, layers, tasks)
and paxloom; no `main` module of its own."""

import os
import re
import subprocess
import sys

import pytest

from tests.support import data as fx
from tests.support.paths import REPO_ROOT
from tests.support.processes import xla_flags

pytestmark = pytest.mark.slow


def run(*command, **options) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in command], capture_output=True, text=True,
                         timeout=1200, **options)
    assert out.returncode == 0, (command, out.stdout[-2000:], out.stderr[-4000:])
    return out


@pytest.mark.process
def test_installed_package_trains_on_a_text_corpus(tmp_path):
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    pip = venv / "bin" / "pip"
    lock = ("--constraint", REPO_ROOT / "constraints.txt")  # the versions the suite runs on
    run(pip, "install", "--quiet", *lock, f"{REPO_ROOT}[text]")
    run(pip, "install", "--quiet", *lock, "--no-deps", "-r", REPO_ROOT / "requirements-nodeps.txt")

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    docs = fx.make_docs(200, seed=7)
    for i in range(4):
        (corpus / f"part{i}.txt").write_text("\n\n".join(docs[i::4]))
    tokenizer = fx.train_hf_tokenizer(tmp_path, docs, vocab_size=300)
    away = tmp_path / "elsewhere"  # not the clone: imports come from the installed package
    away.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": xla_flags(8), "JAX_COMPILATION_CACHE_DIR": ""}
    python = venv / "bin" / "python"
    where = run(python, "-c", "import paxloom, tasks; print(paxloom.__file__, tasks.__file__)",
                cwd=away, env=env).stdout
    assert str(REPO_ROOT) not in where and str(venv) in where, where
    top_level = run(python, "-c", "import importlib.metadata as m; "
                    "print(m.distribution('paxloom').read_text('top_level.txt'))").stdout
    assert sorted(top_level.split()) == ["experiments", "layers", "paxloom", "tasks"], top_level
    no_main = subprocess.run([str(python), "-c", "import main"], cwd=away, env=env,
                             capture_output=True, text=True)
    assert "No module named 'main'" in no_main.stderr, no_main.stderr
    out = run(venv / "bin" / "paxloom", "--fdl_config=experiments.Tiny",
              '--fdl.DATASET="text"', f"--data_dir={corpus}", f"--vocab_path={tokenizer}",
              "--fdl.MAX_STEPS=4", "--fdl.SUMMARY_INTERVAL_STEPS=2", "--fdl.LAMBADA_EVAL=False",
              "--fdl.EVAL_INTERVAL_STEPS=0", f"--job_log_dir={away / 'run'}", cwd=away, env=env)
    assert re.search(r"step +4 \| loss", out.stdout), out.stdout[-2000:]
    assert (away / "run" / "checkpoints").is_dir()
