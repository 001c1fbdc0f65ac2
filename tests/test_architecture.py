"""The import graph of the packages (docs/architecture.md): floors import only downward, no cycles, the CLI is
imported by no one. Static (the source's import statements), so it costs no imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runlog", "interference", "probes", "reports", "agents")
#: package -> the packages its modules may import at module level
FLOORS = {"runlog": set(), "interference": set(), "probes": {"interference", "runlog"}, "reports": {"runlog"},
          "agents": {"interference", "probes", "reports", "runlog"}}
#: imports inside functions that go up a floor, each with its reason
LAZY_UPWARD = {
    ("reports.data", "probes"): "schemas of logs written before logs stored them (the probe registry)",
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = module.split(".")
        if MODULES[module].name != "__init__.py":
            base = base[:-1]
        base = base[:len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
    return subs if subs and len(subs) == len(node.names) else [target, *subs]


def _imports(module: str) -> tuple[set[str], set[str]]:
    """The toolkit modules ``module`` imports at module level, and inside functions."""
    tree = ast.parse(MODULES[module].read_text())
    top_nodes = {id(n) for n in tree.body}
    for stmt in tree.body:  # imports under a module-level if / try count as module level
        if isinstance(stmt, (ast.If, ast.Try)):
            top_nodes |= {id(n) for n in ast.walk(stmt)}
    top, inner = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found = {t for t in _targets(module, node) if t.split(".")[0] in PACKAGES}
            (top if id(node) in top_nodes else inner).update(found)
    return top, inner


IMPORTS = {m: _imports(m) for m in MODULES}


def _module_of(target: str) -> str:
    while target not in MODULES and "." in target:
        target = target.rsplit(".", 1)[0]
    return target


def test_packages_import_only_downward():
    wrong = []
    for module, (top, inner) in IMPORTS.items():
        pkg = module.split(".")[0]
        for target in top:
            if target.split(".")[0] not in FLOORS[pkg] | {pkg}:
                wrong.append(f"{module} imports {target}")
        for target in inner:
            up = target.split(".")[0]
            if up not in FLOORS[pkg] | {pkg} and (module, up) not in LAZY_UPWARD:
                wrong.append(f"{module} imports {target} (in a function)")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_cycles():
    graph = {m: {_module_of(t) for t in top} - {m} for m, (top, _) in IMPORTS.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, cycles


@pytest.mark.parametrize("module, allowed", [
    ("agents.errors", set()),
    ("agents.inputs", {"agents.errors"}),
    ("agents.runfolder", {"agents.errors"}),
    ("agents.lifecycle", {"agents.errors", "agents.runfolder", "agents.runlock", "agents.signals"}),
])
def test_the_bottom_floor_of_agents(module, allowed):
    """Errors, exit statuses, input parsing and the run-folder contract import nothing else of agents; the run
    lifecycle imports only them."""
    top, inner = IMPORTS[module]
    assert {t for t in top | inner if t.startswith("agents")} <= allowed


def test_no_module_imports_the_cli():
    users = [m for m, (top, inner) in IMPORTS.items()
             if any(_module_of(t) == "agents.train" for t in top | inner) and m != "agents.train"]
    assert not users, users


def test_the_grid_modules_import_only_those_listed_before_them():
    """``agents.grid``'s modules, in docs/architecture.md's order: each imports (at module level) only the grid
    modules before it, so the worker's code stays apart from the backends and the CLI."""
    order = ["agents.grid.spec", "agents.grid.planning", "agents.grid.worker", "agents.grid.drive", "agents.grid.local",
             "agents.grid.ray_backend", "agents.grid.run", "agents.grid.cli"]
    assert {m for m in MODULES if m.startswith("agents.grid.")} == {*order, "agents.grid.__main__"}
    wrong = [f"{m} imports {t}" for i, m in enumerate(order) for t in IMPORTS[m][0]
             if _module_of(t).startswith("agents.grid") and _module_of(t) not in order[:i]]
    assert not wrong, wrong


#: the most lines a source file of the packages (and scripts/) may have: a longer one does several jobs
MAX_LINES = 500


def test_every_source_file_is_short_enough_to_do_one_job():
    files = [p for pkg in (*PACKAGES, "scripts") for p in (ROOT / pkg).rglob("*.py")]
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in files if (n := len(p.read_text().splitlines())) >= MAX_LINES]
    assert not long, long
