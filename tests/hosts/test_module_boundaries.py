"""Production code never imports the development tooling, and the hosts room has no import
circle (a circle hides behind function-level imports, so those count too)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ("marketplace", "scheduler", "billing", "hosts")
# Dev-only entry points, loaded only by `make run`: they import the tooling inside a function.
DEV_ENTRY_POINTS = {"hosts/management/commands/simhosts.py", "hosts/demo.py"}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module, at module level) for every import in the file."""
    tree = ast.parse(path.read_text())
    top = set(map(id, tree.body))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, id(node) in top))
            found += [(f"{node.module}.{a.name}", id(node) in top) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, id(node) in top) for a in node.names]
    return found


def _modules(room: str) -> dict[str, Path]:
    modules = {}
    for path in (ROOT / room).rglob("*.py"):
        if "migrations" in path.parts:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    return modules


def test_production_code_never_imports_devtools() -> None:
    offenders = []
    for room in PRODUCTION:
        for name, path in _modules(room).items():
            if name.startswith("hosts.devtools"):
                continue
            relative = str(path.relative_to(ROOT))
            for module, top_level in _imports(path):
                if module.startswith("hosts.devtools") and (
                    top_level or relative not in DEV_ENTRY_POINTS
                ):
                    offenders.append(f"{relative} imports {module}")
    assert offenders == []


def test_hosts_modules_have_no_import_circle() -> None:
    modules = _modules("hosts")
    graph = {
        name: {m for m, _ in _imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }
    # A package's modules import their package's __init__ implicitly: not a circle of ours.
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    circles = sorted(f"{a} ↔ {b}" for a in graph for b in graph[a] if a in reachable(b))
    assert circles == []
