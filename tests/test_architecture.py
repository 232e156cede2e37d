"""The package's shape, read from its imports: layers point one way, no cycles, small pieces.

docs/architecture.md states the rules; this file checks each of them as written there:

    layer     folder                                may import (besides its own layer)
    top       cli, commands/, api, launch, ...      everything
    run       run/                                  plugins, planning, record, base
    show      show/                                 plugins, record, base
    deploy    deploy/                               plugins, planning, record, base
    planning  planning/                             plugins, record, base
    plugins   adapters/, samplers/                  record, base
    record    record/                               base
    base      errors, imports, gpu/                 nothing of ours

An import is any `import`, `from ... import`, and `importlib.import_module("...")`,
`__import__("...")` or `LazyImport("...")` given a module's name as a literal. TYPE_CHECKING imports are annotations,
not dependencies, and are left out. Every module of `orchestrator/`, `adapters/` and `samplers/`
is held to the same size limits and opens with a docstring.

Each rule is tested twice: on the repository, and on a small synthetic tree with one planted
break, which the checker must catch.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "adapters", "samplers")
MAY_IMPORT: dict[str, set[str]] = {
    "top": {"run", "show", "deploy", "planning", "plugin", "record", "base"},
    "run": {"planning", "plugin", "record", "base"},
    "show": {"plugin", "record", "base"},
    "deploy": {"planning", "plugin", "record", "base"},
    "planning": {"plugin", "record", "base"},
    "plugin": {"record", "base"},
    "record": {"base"},
    "base": set(),
}
# One limit for every package: an adapter is read top to bottom as much as the pool is.
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

# Breaks of the rules that are known and wait for their file's fix. Each key is what the checker
# reports; the value says where and why. Remove an entry with the fix: the last test fails on
# an entry that no longer matches a break, so the list cannot outlive what it excuses.
NOT_YET_FIXED: dict[str, str] = {
    # An edge that closes a cycle is excused as `module -> target`.
}


def layer_of(module: str) -> str | None:
    """The layer of a dotted module name inside `orchestrator`, `adapters` or `samplers`."""
    parts = module.split(".")
    if parts[0] in ("adapters", "samplers"):
        return "plugin"
    if parts[0] != "orchestrator":
        return None
    if len(parts) == 1:
        return "top"
    if parts[1] in ("errors", "imports", "gpu"):
        return "base"
    if parts[1] in ("record", "planning", "run", "show", "deploy"):
        return parts[1]
    return "top"


def sources(root: Path) -> list[Path]:
    return sorted(
        p for top in PACKAGES if (root / top).is_dir() for p in (root / top).rglob("*.py")
    )


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_by_call(call: ast.Call) -> str | None:
    """The module a call such as `importlib.import_module("a.b")`, `__import__("a.b")` or
    `LazyImport("a.b")` (imported on first use, still an arrow) names."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__", "LazyImport") or not call.args:
        return None
    first = call.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None  # a name computed at run time (an adapter the user names) is not an arrow


def imports_of(path: Path, root: Path, ours: set[str]) -> set[str]:
    """Every module of ours that `path` imports at run time (lazy and importlib ones included)."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    name = ".".join(base + ([child.module] if child.module else []))
                else:
                    name = child.module or ""
                # `from orchestrator.run import pool` imports the module pool; `from orchestrator
                # import optimize` a name of the package's __init__, which is then the arrow.
                named = {f"{name}.{alias.name}" for alias in child.names}
                found.update(named & ours)
                if named - ours:
                    found.add(name)
            elif isinstance(child, ast.Call) and (named := _imported_by_call(child)):
                found.add(named)
            visit(child)

    visit(ast.parse(path.read_text()))
    return {name for name in found if name in ours and name != module}


def import_graph(root: Path) -> dict[str, set[str]]:
    paths = sources(root)
    ours = {module_name(p, root) for p in paths}
    return {module_name(p, root): imports_of(p, root, ours) for p in paths}


def layer_breaks(graph: dict[str, set[str]]) -> set[str]:
    """Each import that points up or across, as `module (layer) -> target (layer)`."""
    wrong = set()
    for module, targets in graph.items():
        source = layer_of(module)
        for target in targets:
            to = layer_of(target)
            if source is None or to is None or to == source:
                continue
            if to not in MAY_IMPORT[source]:
                wrong.add(f"{module} ({source}) -> {target} ({to})")
    return wrong


def cycles_of(graph: dict[str, set[str]], excused: set[str] = frozenset()) -> list[list[str]]:
    """The cycles of `graph`, leaving out the edges `excused` names as `module -> target`."""
    # A package's __init__ importing its own modules is how Python packages work, not a cycle.
    edges = {
        m: {t for t in ts if not m.startswith(t + ".") and f"{m} -> {t}" not in excused}
        for m, ts in graph.items()
    }
    seen: dict[str, int] = {}
    cycles: list[list[str]] = []

    def walk(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if seen.get(nxt) == 1:
                cycles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in seen:
                walk(nxt, [*path, nxt])
        seen[node] = 2

    for start in sorted(edges):
        if start not in seen:
            walk(start, [start])
    return cycles


def size_breaks(path: Path, root: Path) -> set[str]:
    """`file: over N lines` for a long module, `file: function over N lines` for a long function."""
    where = path.relative_to(root).as_posix()
    text = path.read_text()
    wrong = set()
    if text.count("\n") > MAX_MODULE_LINES:
        wrong.add(f"{where}: over {MAX_MODULE_LINES} lines")
    functions = [
        node
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    for function in functions:
        if function.end_lineno - function.lineno + 1 > MAX_FUNCTION_LINES:
            wrong.add(f"{where}: {function.name} over {MAX_FUNCTION_LINES} lines")
    return wrong


def undocumented(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in sources(root)
        if p.name != "__main__.py" and not ast.get_docstring(ast.parse(p.read_text()))
    }


def _unexcused(found: set[str]) -> list[str]:
    return sorted(found - set(NOT_YET_FIXED))


# --- the repository --------------------------------------------------------------------------


def test_every_arrow_points_down_or_within_a_layer() -> None:
    wrong = _unexcused(layer_breaks(import_graph(ROOT)))
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_the_import_graph_has_no_cycle() -> None:
    cycles = cycles_of(import_graph(ROOT), set(NOT_YET_FIXED))
    assert not cycles, "cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("path", sources(ROOT), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_modules_and_functions_stay_small(path: Path) -> None:
    wrong = _unexcused(size_breaks(path, ROOT))
    assert not wrong, "\n".join(wrong)


def test_every_module_opens_with_its_job() -> None:
    assert not undocumented(ROOT)


def test_every_excuse_still_excuses_a_break() -> None:
    graph = import_graph(ROOT)
    edges = {f"{module} -> {target}" for module, targets in graph.items() for target in targets}
    found = (
        edges
        | layer_breaks(graph)
        | {wrong for path in sources(ROOT) for wrong in size_breaks(path, ROOT)}
    )
    fixed = sorted(set(NOT_YET_FIXED) - found)
    assert not fixed, "fixed: remove from NOT_YET_FIXED:\n" + "\n".join(fixed)


def test_the_layer_rule_reads_names_as_meant() -> None:
    assert layer_of("orchestrator.gpu.nvml") == "base"
    assert layer_of("orchestrator.record.store.storage") == "record"
    assert layer_of("orchestrator.commands.run") == "top"
    assert layer_of("orchestrator.cli") == "top"
    assert layer_of("samplers._pso") == "plugin"
    assert layer_of("adapters.dqn") == "plugin"
    assert layer_of("optuna") is None


# --- the checker, on a synthetic tree with one planted break ---------------------------------

_TREE = {
    "orchestrator/__init__.py": '"""Top."""\n',
    "orchestrator/cli.py": '"""Entry."""\nimport orchestrator.run.pool.loop\nimport orchestrator.show.views\n',
    "orchestrator/errors.py": '"""Base."""\n',
    "orchestrator/gpu/__init__.py": '"""Base."""\nfrom orchestrator import errors\n',
    "orchestrator/record/__init__.py": '"""Record."""\n',
    "orchestrator/record/store.py": '"""Record."""\nfrom orchestrator.errors import *\n',
    "orchestrator/planning/__init__.py": '"""Planning."""\n',
    "orchestrator/planning/plan.py": '"""Planning."""\nimport adapters.base\n',
    "orchestrator/run/__init__.py": '"""Run."""\n',
    "orchestrator/run/pool/loop.py": '"""Run."""\nfrom orchestrator.planning import plan\n',
    "orchestrator/show/__init__.py": '"""Show."""\n',
    "orchestrator/show/views.py": '"""Show."""\nfrom ..record import store\n',
    "orchestrator/deploy/__init__.py": '"""Deploy."""\n',
    "orchestrator/deploy/kube.py": '"""Deploy."""\nimport orchestrator.planning.plan\n',
    "adapters/__init__.py": '"""Plugin."""\n',
    "adapters/base.py": '"""Plugin."""\nimport orchestrator.record.store\nimport samplers\n',
    "samplers/__init__.py": '"""Plugin."""\nfrom orchestrator.errors import *\n',
}


def _tree(tmp_path: Path, planted: dict[str, str] | None = None) -> Path:
    """The synthetic tree, every module in its right place, with `planted` files added."""
    for where, text in {**_TREE, **(planted or {})}.items():
        path = tmp_path / where
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_checker_passes_the_tree_as_it_should_be(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    graph = import_graph(root)
    assert graph["orchestrator.show.views"] == {"orchestrator.record.store"}
    assert graph["orchestrator.gpu"] == {"orchestrator.errors"}
    assert not layer_breaks(graph)
    assert not cycles_of(graph)
    assert not undocumented(root)
    assert not {wrong for path in sources(root) for wrong in size_breaks(path, root)}


PLANTED = {
    "show -> planning": ("orchestrator/show/chart.py", "import orchestrator.planning.plan"),
    "show -> run": ("orchestrator/show/chart.py", "from orchestrator.run import pool"),
    "run -> show": ("orchestrator/run/loop.py", "from orchestrator.show.views import x"),
    "run -> deploy": ("orchestrator/run/loop.py", "import orchestrator.deploy.kube"),
    "deploy -> run": ("orchestrator/deploy/helm.py", "from ..run import pool"),
    "run -> top": ("orchestrator/run/loop.py", "from orchestrator import cli"),
    "planning -> run": ("orchestrator/planning/fit.py", "import orchestrator.run.pool.loop"),
    "planning -> deploy": ("orchestrator/planning/fit.py", "import orchestrator.deploy"),
    "record -> planning": ("orchestrator/record/spec.py", "from orchestrator.planning import plan"),
    "record -> adapters": ("orchestrator/record/spec.py", "import adapters.base"),
    "record -> samplers": ("orchestrator/record/spec.py", "from samplers import x"),
    "base -> record": ("orchestrator/gpu/sim.py", "from orchestrator.record import store"),
    "base -> adapters": ("orchestrator/gpu/sim.py", "import adapters"),
    "adapters -> planning": ("adapters/dqn.py", "from orchestrator.planning import plan"),
    "samplers -> run": ("samplers/_pso.py", "import orchestrator.run.pool.loop"),
    "a lazy import": (
        "orchestrator/show/chart.py",
        "def f():\n    import orchestrator.run.pool.loop",
    ),
    "importlib.import_module": (
        "orchestrator/show/chart.py",
        "import importlib\nimportlib.import_module('orchestrator.planning.plan')",
    ),
    "from importlib import import_module": (
        "orchestrator/record/spec.py",
        "from importlib import import_module\nimport_module('adapters.base')",
    ),
    "__import__": ("orchestrator/record/spec.py", "__import__('orchestrator.run.pool.loop')"),
    "LazyImport": ("adapters/tft.py", "layers = LazyImport('orchestrator.planning.plan')"),
}


@pytest.mark.parametrize("arrow", sorted(PLANTED))
def test_a_planted_import_against_the_layers_fails(tmp_path: Path, arrow: str) -> None:
    where, code = PLANTED[arrow]
    root = _tree(tmp_path, {where: f'"""Planted."""\n{code}\n'})
    planted = module_name(root / where, root)
    breaks = layer_breaks(import_graph(root))
    assert [b for b in breaks if b.startswith(planted + " ")], breaks


def test_an_import_for_annotations_only_is_not_an_arrow(tmp_path: Path) -> None:
    code = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import orchestrator.run.pool.loop\n"
    root = _tree(tmp_path, {"orchestrator/show/chart.py": f'"""Planted."""\n{code}'})
    assert not layer_breaks(import_graph(root))


def test_a_planted_cycle_fails(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "orchestrator/record/a.py": '"""A."""\nimport orchestrator.record.b\n',
            "orchestrator/record/b.py": '"""B."""\n__import__("orchestrator.record.a")\n',
        },
    )
    assert ["orchestrator.record.a", "orchestrator.record.b", "orchestrator.record.a"] in cycles_of(
        import_graph(root)
    )


@pytest.mark.parametrize("package", PACKAGES)
def test_a_planted_long_module_fails_in_every_package(tmp_path: Path, package: str) -> None:
    body = '"""Long."""\n' + "x = 1\n" * MAX_MODULE_LINES
    root = _tree(tmp_path, {f"{package}/long.py": body})
    assert size_breaks(root / package / "long.py", root) == {
        f"{package}/long.py: over {MAX_MODULE_LINES} lines"
    }


@pytest.mark.parametrize("package", PACKAGES)
def test_a_planted_long_function_fails_in_every_package(tmp_path: Path, package: str) -> None:
    body = '"""Long."""\ndef f():\n' + "    x = 1\n" * MAX_FUNCTION_LINES
    root = _tree(tmp_path, {f"{package}/long.py": body})
    assert size_breaks(root / package / "long.py", root) == {
        f"{package}/long.py: f over {MAX_FUNCTION_LINES} lines"
    }


def test_a_module_at_the_limits_passes(tmp_path: Path) -> None:
    body = '"""At the limit."""\ndef f():\n' + "    x = 1\n" * (MAX_FUNCTION_LINES - 1)
    body += "y = 1\n" * (MAX_MODULE_LINES - body.count("\n"))
    root = _tree(tmp_path, {"adapters/edge.py": body})
    assert not size_breaks(root / "adapters" / "edge.py", root)


@pytest.mark.parametrize("package", PACKAGES)
def test_a_planted_module_without_its_job_fails(tmp_path: Path, package: str) -> None:
    root = _tree(tmp_path, {f"{package}/bare.py": "x = 1\n"})
    assert undocumented(root) == {f"{package}/bare.py"}


def test_the_readme_command_table_names_the_modules_of_the_tree() -> None:
    """Every command's row names its module, and every module that adds a command has a row."""
    table = [
        line.split("|")
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith("| `python -m orchestrator")
    ]
    named = {cells[3].strip().strip("`") for cells in table}
    assert all((ROOT / where).is_file() for where in named), named
    registering = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "orchestrator" / "commands").glob("*.py")
        if "\ndef register(" in p.read_text()
    }
    assert registering <= named, sorted(registering - named)
