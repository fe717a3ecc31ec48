"""The import layering (docs/architecture.md): every module of Paxloom imports only its own
package and packages below it, and no two modules import each other, directly or around a
longer circle. Walked from the source, so an import inside a function counts too."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Bottom to top; a package may import only packages of a lower rank (and itself).
LAYERS = [
    # `paxloom` itself and `paxloom.runner`: their __init__.py files, which import nothing
    ["paxloom", "paxloom.core"],
    ["layers", "tasks"],
    ["paxloom.runner", "paxloom.runner.cluster"],
    ["paxloom.runner.state"],
    ["paxloom.runner.training", "paxloom.runner.inference"],
    ["paxloom.runner.planning"],
    ["experiments"],
    ["paxloom.launch"],
    ["paxloom.tools", "bench", "scripts_gpu"],
    ["paxloom.main"],
    ["main"],  # the clone's main.py, which runs paxloom.main
]
RANK = {package: rank for rank, packages in enumerate(LAYERS) for package in packages}
TOP_LEVEL = ("paxloom", "layers", "tasks", "experiments", "bench", "scripts_gpu")


def package_of(module: str) -> str | None:
    """The layered package a dotted module name belongs to (None: not Paxloom's)."""
    parts = module.split(".")
    for n in (3, 2, 1):
        if ".".join(parts[:n]) in RANK:
            return ".".join(parts[:n])
    return None


def imports(path: pathlib.Path, module: str):
    """(line, imported module) for every import statement in the file. A bare name that is
    a sibling file (bench/ and scripts_gpu/ import each other that way) is that sibling."""
    siblings = {p.stem for p in path.parent.glob("*.py")}
    package = module.rpartition(".")[0]

    def resolve(name: str) -> str:
        head = name.split(".")[0]
        return f"{package}.{name}" if package and head in siblings and head not in RANK else name

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, resolve(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, resolve(node.module)
            for alias in node.names:  # `from paxloom.launch import job` imports its job
                yield node.lineno, f"{resolve(node.module)}.{alias.name}"


def sources() -> list[tuple[str, pathlib.Path]]:
    """(dotted module name, path) of every Paxloom module."""
    files = [ROOT / "main.py"]
    for top in TOP_LEVEL:
        files += sorted((ROOT / top).rglob("*.py"))
    return [(".".join(p.relative_to(ROOT).with_suffix("").parts), p) for p in files]


def upward_imports(modules) -> list[str]:
    found = []
    for module, path in modules:
        mine = package_of(module)
        for line, imported in imports(path, module):
            theirs = package_of(imported)
            if mine and theirs and theirs != mine and RANK[theirs] >= RANK[mine]:
                found.append(f"{module}:{line} ({mine}) imports {imported} ({theirs})")
    return found


def import_circles(modules) -> list[list[str]]:
    """Every set of modules that import each other, directly or around a circle (the
    strongly connected components of the module graph with more than one member)."""
    names = {m.removesuffix(".__init__"): p for m, p in modules}
    graph = {}
    for module, path in names.items():
        by_line = {}
        for line, imported in imports(path, module):
            # `from paxloom.runner.cluster import mesh` names the module ....cluster.mesh (not
            # the package, whose __init__ may import its own modules); an imported
            # function's name is not a module, so falls back to its module.
            while imported and imported not in names:
                imported = imported.rpartition(".")[0]
            if imported and imported != module:
                by_line.setdefault(line, set()).add(imported)
        graph[module] = {target for found in by_line.values() for target in found
                         if not any(other.startswith(target + ".") for other in found)}
    # Tarjan's algorithm, iterative: the repository is deep enough for Python's recursion.
    index, low, on_stack, stack, circles, counter = {}, {}, set(), [], [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_every_module_belongs_to_a_layer():
    assert [m for m, _ in sources() if package_of(m) is None] == []


def test_no_import_runs_upward():
    assert upward_imports(sources()) == []


def test_no_two_modules_import_each_other():
    assert import_circles(sources()) == []


@pytest.mark.parametrize("module, upper", [
    ("tasks.evaluations", "paxloom.runner.training.trainer"),
    ("paxloom.core.spec", "tasks.datasets"),
    ("paxloom.runner.training.trainer", "experiments"),
    ("paxloom.runner.planning.plan", "paxloom.launch.job"),
    ("paxloom.runner.inference.model", "paxloom.runner.training"),
    ("experiments.base", "bench.gpu_bench"),
    ("paxloom.core.errors", "paxloom.main")])
def test_an_upward_import_is_found(tmp_path, module, upper):
    """The check fails when the thing it guards is broken: a module given one more import,
    upward, inside a function."""
    path = (ROOT / module.replace(".", "/")).with_suffix(".py")
    copy = tmp_path / "copy.py"
    copy.write_text(path.read_text() + f"\n\ndef later():\n    import {upper}  # noqa\n")
    assert upward_imports([(module, path)]) == []
    assert [f.split(" imports ")[1] for f in upward_imports([(module, copy)])] == [
        f"{upper} ({package_of(upper)})"]


def test_a_circle_is_found(tmp_path):
    """Two modules of one package that import each other (one of them lazily) are a circle,
    and so is a longer loop; removing the planted import removes it."""
    modules = dict(sources())
    assert import_circles(modules.items()) == []
    planted = tmp_path / "throughput.py"
    original = modules["paxloom.runner.training.throughput"].read_text()
    planted.write_text(original + "\n\ndef later():\n    from paxloom.runner.training import "
                       "trainer  # noqa\n")
    circles = import_circles({**modules, "paxloom.runner.training.throughput": planted}.items())
    assert any({"paxloom.runner.training.trainer", "paxloom.runner.training.throughput"} <= set(c)
               for c in circles), circles
