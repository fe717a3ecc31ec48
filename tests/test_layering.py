"""The import layering (README, "Architecture"; runner/__init__.py): every module of
Paxloom imports only its own package and packages below it. Walked from the source, so
an import inside a function counts too."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Bottom to top; a package may import only packages of a lower rank (and itself).
LAYERS = [
    ["runner.core", "runner"],  # `runner` itself: runner/__init__.py, which imports nothing
    ["layers", "tasks"],
    ["runner.cluster"],
    ["runner.state"],
    ["runner.training", "runner.inference"],
    ["runner.planning"],
    ["experiments"],
    ["runner.launch", "tools"],
    ["main"],
]
RANK = {package: rank for rank, packages in enumerate(LAYERS) for package in packages}


def package_of(module: str) -> str | None:
    """The layered package a dotted module name belongs to (None: not Paxloom's)."""
    parts = module.split(".")
    for n in (2, 1):
        if ".".join(parts[:n]) in RANK:
            return ".".join(parts[:n])
    return None


def imports(path: pathlib.Path):
    """(line, imported module) for every import statement in the file."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:  # `from runner import job` imports runner.job
                yield node.lineno, f"{node.module}.{alias.name}"


def sources() -> list[tuple[str, pathlib.Path]]:
    """(dotted module name, path) of every Paxloom module."""
    files = [ROOT / "main.py"]
    for top in ("runner", "layers", "tasks", "experiments", "tools"):
        files += sorted((ROOT / top).rglob("*.py"))
    return [(".".join(p.relative_to(ROOT).with_suffix("").parts), p) for p in files]


def upward_imports(modules) -> list[str]:
    found = []
    for module, path in modules:
        mine = package_of(module)
        for line, imported in imports(path):
            theirs = package_of(imported)
            if mine and theirs and theirs != mine and RANK[theirs] >= RANK[mine]:
                found.append(f"{module}:{line} ({mine}) imports {imported} ({theirs})")
    return found


def test_every_module_belongs_to_a_layer():
    assert [m for m, _ in sources() if package_of(m) is None] == []


def test_no_import_runs_upward():
    assert upward_imports(sources()) == []


@pytest.mark.parametrize("module, upper", [("tasks.evaluations", "runner.training.trainer"),
                                           ("runner.core.spec", "tasks.datasets"),
                                           ("runner.training.trainer", "experiments"),
                                           ("runner.inference.model", "runner.training")])
def test_an_upward_import_is_found(tmp_path, module, upper):
    """The check fails when the thing it guards is broken: a module given one more import,
    upward, inside a function."""
    copy = tmp_path / "copy.py"
    original = (ROOT / module.replace(".", "/")).with_suffix(".py").read_text()
    copy.write_text(original + f"\n\ndef later():\n    import {upper}  # noqa\n")
    assert upward_imports([(module, (ROOT / module.replace(".", "/")).with_suffix(".py"))]) == []
    assert [f.split(" imports ")[1] for f in upward_imports([(module, copy)])] == [
        f"{upper} ({package_of(upper)})"]
