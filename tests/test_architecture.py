"""The package's shape, read from its imports: layers point one way, no cycles, small pieces.

The layers, lowest first (docs/architecture.md draws them):

    base      errors, own_packages, gpu/
    record    record/     where a study lives and what is stored with it
    planning  planning/   what fits on which GPU
    run       run/        the pool and its trial processes      } siblings: none of them
    show      show/       read-only views and the report        } imports another
    deploy    deploy/     manifests and compose's GPU claim     }
    top       cli, api, launch, host_options, result, config_file, enqueue, commands/

A module may import its own layer and any below it. `adapters` and `samplers` are the packages
the trial process loads; they may use the base and record layers only.
TYPE_CHECKING imports are annotations, not dependencies, and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RANK = {"base": 0, "record": 1, "planning": 2, "run": 3, "show": 3, "deploy": 3, "top": 4}
SIBLINGS = {"run", "show", "deploy"}
PLUGIN_ALLOWED = {"base", "record"}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def layer_of(module: str) -> str | None:
    """The layer of a dotted module name inside `orchestrator`, `adapters` or `samplers`."""
    parts = module.split(".")
    if parts[0] in ("adapters", "samplers"):
        return "plugin"
    if parts[0] != "orchestrator":
        return None
    if len(parts) == 1:
        return "top"
    if parts[1] in ("errors", "own_packages", "gpu"):
        return "base"
    if parts[1] in ("record", "planning", "run", "show", "deploy"):
        return parts[1]
    return "top"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path) -> set[str]:
    """Every module of ours that `path` imports at run time (lazy imports included)."""
    module = _module_name(path)
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
                found.add(name)
                for alias in child.names:  # `from orchestrator.run import pool` imports a module
                    found.add(f"{name}.{alias.name}")
            visit(child)

    visit(ast.parse(path.read_text()))
    ours = {_module_name(p) for p in _sources()}
    return {name for name in found if name in ours and name != module}


def _sources() -> list[Path]:
    return sorted(
        p for top in ("orchestrator", "adapters", "samplers") for p in (ROOT / top).rglob("*.py")
    )


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): imports_of(p) for p in _sources()}


def test_every_arrow_points_down_or_within_a_layer() -> None:
    wrong = []
    for module, targets in _graph().items():
        source = layer_of(module)
        for target in targets:
            to = layer_of(target)
            if to is None or target == "orchestrator":
                continue
            if source == "plugin":
                if to not in PLUGIN_ALLOWED | {"plugin"}:
                    wrong.append(f"{module} -> {target}")
            elif to == "plugin":
                continue  # any layer may drive an adapter or a sampler
            elif RANK[to] > RANK[source] or (to != source and {to, source} <= SIBLINGS):
                wrong.append(f"{module} ({source}) -> {target} ({to})")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(wrong))


def test_the_import_graph_has_no_cycle() -> None:
    graph = _graph()
    # A package's __init__ importing its own modules is how Python packages work, not a cycle.
    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
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
    assert not cycles, "cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("path", sorted((ROOT / "orchestrator").rglob("*.py")), ids=str)
def test_modules_and_functions_stay_small(path: Path) -> None:
    lines = path.read_text().count("\n")
    assert lines <= MAX_MODULE_LINES, f"{path.name} has {lines} lines"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path.name}: " + ", ".join(long)


def test_every_module_opens_with_its_job() -> None:
    missing = [
        str(p)
        for p in _sources()
        if p.name != "__main__.py" and not ast.get_docstring(ast.parse(p.read_text()))
    ]
    assert not missing, missing


def test_the_layer_rule_reads_names_as_meant() -> None:
    assert layer_of("orchestrator.gpu.nvml") == "base"
    assert layer_of("orchestrator.record.storage") == "record"
    assert layer_of("orchestrator.commands.run") == "top"
    assert layer_of("samplers._pso") == "plugin"
    assert layer_of("optuna") is None
