"""The shell examples of README.md and docs/: finding them, checking their flags, running them.

The convention (tests/test_docs.py checks it): every fenced ```bash, ```sh or ```shell block is
an example. A block whose fence is preceded by one of these HTML comment lines is not run:

    <!-- docs-example: gpu -->                 needs a GPU
    <!-- docs-example: cluster -->             needs several machines or a scheduler
    <!-- docs-example: skip (the reason) -->   anything else; the reason is required

Every block, marked or not, has its commands' flags checked against the code: `python main.py`
flags against the absl flags main.py defines, `--fdl.UPPER_CASE=` against the hyperparameters
of the experiment the command names, and `python paxloom/tools/X.py` / `python -m paxloom.tools.X` (bench/,
tasks/, scripts_gpu/, ...) flags against the flags the script's `--help` prints. Unmarked
blocks are run on CPU, in order per page, from a copy of the repository (`run_page`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

from tests.support import paths

REPO_ROOT = str(paths.REPO_ROOT)
SHELL_LANGUAGES = ("bash", "sh", "shell")
MARKS = ("gpu", "cluster", "skip")
_MARKER = re.compile(r"^\s*<!--\s*docs-example:\s*(?P<mark>[a-z]+)\s*(?P<reason>.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(?P<word>\w+)\1")
# Words that may come before a command: shell keywords and wrappers.
_PREFIXES = ("do", "then", "else", "elif", "if", "while", "until", "!", "env", "exec", "time",
             "nohup")
_SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "{", "}", ";;", "|&"}
# Scripts whose flags are checked: a path under these folders, or `-m` of a module in them.
_SCRIPT_PACKAGES = ("paxloom", "bench", "tasks", "scripts_gpu")
# absl's own flags that app.run defines when main.py starts (not at import).
_ABSL_APP_FLAGS = ("help", "helpfull", "helpshort", "helpxml", "flagfile", "undefok")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced shell block: where it is, its text and its mark (None: it is run)."""

    path: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    text: str
    mark: str | None = None
    reason: str = ""

    def __str__(self):
        return f"{self.path}:{self.line}"


def doc_files(root: str = REPO_ROOT) -> list[str]:
    """README.md and every docs/**/*.md, relative to `root`, in a stable order."""
    paths = ["README.md"] if os.path.exists(os.path.join(root, "README.md")) else []
    for folder, dirs, files in os.walk(os.path.join(root, "docs")):
        dirs.sort()
        paths += sorted(os.path.relpath(os.path.join(folder, f), root)
                        for f in files if f.endswith(".md"))
    return paths


def parse_blocks(text: str, path: str = "<text>") -> tuple[list[Block], list[str]]:
    """The shell blocks of a Markdown text, and the problems with its markers."""
    blocks, problems = [], []
    lines = text.split("\n")
    previous = ""  # the last non-blank line outside a fence
    previous_line = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if not fence:
            if line.lstrip().startswith("<!--") and "docs-example" in line and \
                    not _MARKER.match(line):
                problems.append(f"{path}:{i + 1}: malformed marker {line.strip()!r}; expected "
                                f"<!-- docs-example: gpu|cluster|skip (reason) -->")
            if line.strip():
                previous, previous_line = line, i + 1
            i += 1
            continue
        # A fenced block: find its end (the same fence characters, at least as many).
        marker, lang, start = fence["fence"], fence["lang"].lower(), i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(marker):
            body.append(lines[i][len(fence["indent"]):] if lines[i].startswith(fence["indent"])
                        else lines[i])
            i += 1
        i += 1  # the closing fence
        # The marker is the line right before the fence.
        mark = _MARKER.match(previous) if previous_line == start else None
        if lang in SHELL_LANGUAGES:
            block_mark, reason = None, ""
            if mark:
                block_mark, reason = mark["mark"], mark["reason"].strip()
                if block_mark not in MARKS:
                    problems.append(f"{path}:{start + 1}: unknown mark {block_mark!r} (one of "
                                    f"{', '.join(MARKS)})")
                elif block_mark == "skip" and not reason.strip("() "):
                    problems.append(f"{path}:{start + 1}: `docs-example: skip` needs a reason, "
                                    f"e.g. <!-- docs-example: skip (downloads The Pile) -->")
            blocks.append(Block(path, start + 1, "\n".join(body), block_mark, reason))
        elif mark:
            problems.append(f"{path}:{start + 1}: a docs-example marker before a ```{lang} block "
                            f"(only bash, sh and shell blocks are examples)")
        previous, previous_line = "", 0
    return blocks, problems


def all_blocks(root: str = REPO_ROOT) -> tuple[list[Block], list[str]]:
    blocks, problems = [], []
    for path in doc_files(root):
        with open(os.path.join(root, path), encoding="utf-8") as f:
            found, bad = parse_blocks(f.read(), path)
        blocks += found
        problems += bad
    return blocks, problems


# ---------------------------------------------------------------------------------------------
# Commands of a block


def logical_lines(text: str) -> list[str]:
    """The block's shell lines: continuations joined, comments and heredoc bodies dropped, and
    each `$(...)` command substitution as a line of its own."""
    out, pending, heredoc = [], "", None
    for raw in text.split("\n"):
        if heredoc is not None:
            if raw.strip() == heredoc:
                heredoc = None
            continue
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        found = _HEREDOC.search(line)
        if found:
            heredoc = found["word"]
        out.append(line)
    if pending:
        out.append(pending)
    lines = []
    for line in out:
        for inner in re.findall(r"\$\(([^()]*)\)", line):
            lines.append(inner)
        lines.append(re.sub(r"\$\(([^()]*)\)", "SUBST", line))
    return lines


def commands(text: str) -> list[list[str]]:
    """Each simple command of a block, as its words (leading VAR=value assignments kept)."""
    result = []
    for line in logical_lines(text):
        if line.lstrip().startswith("#"):
            continue
        try:
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|(){}")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            words = list(lexer)
        except ValueError:  # unbalanced quotes: not a command line (prose or output)
            continue
        current: list[str] = []
        for word in words:
            if word in _SEPARATORS:
                if current:
                    result.append(current)
                current = []
            else:
                current.append(word)
        if current:
            result.append(current)
    return result


def _is_python(word: str) -> bool:
    return re.fullmatch(r"python(3(\.\d+)?)?", os.path.basename(word)) is not None


@dataclasses.dataclass(frozen=True)
class Invocation:
    """A Python command of a block: `main.py`, a script path or a `-m` module, and its flags."""

    program: str  # "main.py", "paxloom/tools/export_hf.py" or "-m paxloom.tools.export_hf"
    flags: tuple[str, ...]  # the words starting with --, as written
    experiment: str | None  # --fdl_config / --exp, for main.py


def invocations(text: str) -> list[Invocation]:
    found = []
    for words in commands(text):
        while words and (re.match(r"^[A-Za-z_]\w*=", words[0]) or words[0] in _PREFIXES):
            words = words[1:]
        if not words or not _is_python(words[0]):
            continue
        rest = words[1:]
        while rest and rest[0].startswith("-") and rest[0] not in ("-m",):
            rest = rest[1:]  # interpreter options: -u, -X ..., -W ...
        if not rest:
            continue
        if rest[0] == "-m" and len(rest) > 1:
            program, args = f"-m {rest[1]}", rest[2:]
            if rest[1].split(".")[0] not in _SCRIPT_PACKAGES:
                continue
        elif rest[0].endswith(".py"):
            script = os.path.normpath(rest[0])
            if os.path.basename(script) == "main.py" and os.path.dirname(script) in ("", "."):
                program = "main.py"
            elif script.split(os.sep)[0] in _SCRIPT_PACKAGES:
                program = script
            else:
                continue
            args = rest[1:]
        else:
            continue
        flags = tuple(a for a in args if a.startswith("--"))
        experiment = None
        for a in args:
            if a.startswith(("--fdl_config=", "--exp=")):
                experiment = a.split("=", 1)[1]
        found.append(Invocation(program, flags, experiment))
    return found


# ---------------------------------------------------------------------------------------------
# What the code defines

_DESCRIBE_MAIN = """
import json, sys
sys.argv = ["main.py"]
from absl import app, flags
from paxloom.launch import flags as launch_flags  # main.py's flags
import experiments
from experiments.base import BaseExperiment
app.define_help_flags()
out = {"flags": {}, "experiments": {}, "groups": launch_flags.GROUPS,
       "aliases": launch_flags.ALIASES, "ungrouped": launch_flags.ungrouped()}
for name, flag in flags.FLAGS._flags().items():
    out["flags"][name] = isinstance(flag, flags.BooleanFlag) or flag.boolean
for name, cls in experiments.registered().items():
    out["experiments"][name] = sorted(cls.hyperparameter_types())
out["experiments"]["BaseExperiment"] = sorted(BaseExperiment.hyperparameter_types())
print("DOCS-JSON " + json.dumps(out))
"""


def _python() -> str:
    venv = os.path.join(REPO_ROOT, ".venv", "bin", "python")
    return venv if os.path.exists(venv) else sys.executable


@functools.cache
def code_definitions(root: str = REPO_ROOT) -> dict:
    """main.py's flags ({name: is boolean}), each registered experiment's hyperparameters,
    and paxloom/launch/flags.py's groups of flags (GROUPS, ALIASES, and the flags in no group), read
    in a fresh process (importing main defines its flags in absl's global registry)."""
    env = dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu")
    proc = subprocess.run([_python(), "-c", _DESCRIBE_MAIN], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    for line in proc.stdout.splitlines():
        if line.startswith("DOCS-JSON "):
            return json.loads(line[len("DOCS-JSON "):])
    raise RuntimeError(f"could not read main.py's flags (exit {proc.returncode}):\n"
                       f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


@functools.cache
def script_flags(program: str, root: str = REPO_ROOT) -> frozenset[str]:
    """The flags a script accepts, read from its `--help` (argparse or absl)."""
    argv = program.split() if program.startswith("-m ") else [program]
    env = dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu")
    proc = subprocess.run([_python(), *argv, "--help"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    names = set(re.findall(r"--([A-Za-z0-9][\w.-]*)", text))
    for name in re.findall(r"--\[no\]([\w.-]+)", text):  # absl booleans
        names |= {name, "no" + name}
    # A script whose own FlagValues has no --help (paxloom/tools/export_hf.py): its DEFINE_* calls.
    if program.startswith("-m "):
        module = program.split()[1].replace(".", os.sep)
        source = os.path.join(root, module + ".py")
        if not os.path.exists(source):
            source = os.path.join(root, module, "__main__.py")
    else:
        source = os.path.join(root, program)
    if os.path.exists(source):
        with open(source, encoding="utf-8") as f:
            code = f.read()
        for kind, name in re.findall(r"DEFINE_(\w+)\(\s*[\"'](\w+)[\"']", code):
            names.add(name)
            if kind in ("bool", "boolean"):
                names.add("no" + name)
    return frozenset(names)


def _experiment_hyperparameters(definitions: dict, experiment: str | None) -> set[str] | None:
    """The declared hyperparameters of `experiment`; None when the name cannot be resolved here
    (a user's module or a variable): then the names any registered experiment declares."""
    registered = definitions["experiments"]
    if experiment:
        name = experiment.rpartition(".")[2]
        module = experiment.rpartition(".")[0]
        if module in ("experiments", "paxml.contrib.gpu.scripts_gpu.configs") and \
                name in registered:
            return set(registered[name])
    return None


# Scripts that take main.py's flags (experiment, overrides, launcher flags) beside their own.
TAKES_MAIN_FLAGS = ("bench/step_account.py",)


def check_invocation(inv: Invocation, where: str, root: str = REPO_ROOT) -> list[str]:
    """Problems with one command's flags, each naming the flag and where it is."""
    problems = []
    if inv.program == "main.py" or inv.program in TAKES_MAIN_FLAGS:
        own = script_flags(inv.program, root) if inv.program in TAKES_MAIN_FLAGS else ()
        definitions = code_definitions(root)
        defined = definitions["flags"]
        declared = _experiment_hyperparameters(definitions, inv.experiment)
        anywhere = set().union(*definitions["experiments"].values())
        for flag in inv.flags:
            name = flag[2:].split("=", 1)[0]
            if name.startswith("fdl."):
                field = name[4:]
                if not re.fullmatch(r"[A-Z][A-Z0-9_]*", field):
                    continue  # a dotted field of the graph: checked when the example runs
                if declared is not None and field not in declared:
                    problems.append(f"{where}: --fdl.{field}: {inv.experiment} has no "
                                    f"hyperparameter {field}")
                elif declared is None and field not in anywhere:
                    problems.append(f"{where}: --fdl.{field}: no experiment declares {field}")
                continue
            ok = name in defined or name in own or name in _ABSL_APP_FLAGS or (
                name.startswith("no") and defined.get(name[2:]) is True)
            if not ok:
                problems.append(f"{where}: --{name} is not a flag of {inv.program}")
    else:
        accepted = script_flags(inv.program, root)
        for flag in inv.flags:
            name = flag[2:].split("=", 1)[0]
            if name not in accepted and name not in ("help",):
                problems.append(f"{where}: --{name} is not a flag of {inv.program} "
                                f"(its --help does not list it)")
    return problems


def check_block(block: Block, root: str = REPO_ROOT) -> list[str]:
    problems = []
    for inv in invocations(block.text):
        problems += check_invocation(inv, f"{block} ({inv.program})", root)
    return problems


# ---------------------------------------------------------------------------------------------
# Running a page's examples


def tracked_files(root: str = REPO_ROOT) -> list[str]:
    """The repository's files: tracked, and new ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=root, capture_output=True, text=True, check=True).stdout
    return [p for p in out.split("\0") if p and os.path.isfile(os.path.join(root, p))]


def copy_repository(destination: str, root: str = REPO_ROOT) -> str:
    """A copy of the repository's files at `destination`, with `.venv` linked in."""
    for path in tracked_files(root):
        target = os.path.join(destination, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(os.path.join(root, path), target)
    venv = os.path.join(root, ".venv")
    if os.path.isdir(venv):
        os.symlink(venv, os.path.join(destination, ".venv"))
    return destination


def example_environment(copy: str) -> dict:
    env = dict(os.environ)
    env["PATH"] = os.path.join(copy, ".venv", "bin") + os.pathsep + env.get("PATH", "")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    return env


def run_block(block: Block, copy: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=copy,
                          env=example_environment(copy), capture_output=True, text=True,
                          timeout=timeout)
