"""Production code never imports the development tooling; no module of any app is in an import
circle (a circle hides behind function-level imports, so those count too); and ``core``, the
machinery below every app, imports no app."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ("marketplace", "scheduler", "billing", "hosts", "core")
# Dev-only entry points, loaded only by `make run`: they import the tooling inside a function.
DEV_ENTRY_POINTS = {"hosts/management/commands/simhosts.py", "hosts/demo.py"}


def _imports(path: Path, root: Path = ROOT) -> list[tuple[str, bool]]:
    """(module, at module level) for every import in the file, wherever it is (in a function,
    under ``if TYPE_CHECKING``); a relative import by its absolute name. ``from a import b``
    gives ``a`` and ``a.b`` (``b`` may be a module)."""
    tree = ast.parse(path.read_text())
    top = set(map(id, tree.body))
    package = ".".join(path.relative_to(root).parent.parts)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, module] if module else base)
            found.append((module, id(node) in top))
            found += [(f"{module}.{a.name}", id(node) in top) for a in node.names]
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


def _graph(rooms: tuple[str, ...]) -> dict[str, set[str]]:
    """Each module of ``rooms`` and the modules of ``rooms`` it imports, at any level."""
    modules = {name: path for room in rooms for name, path in _modules(room).items()}
    graph = {
        name: {m for m, _ in _imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }
    # A package's modules import their package's __init__ implicitly: not a circle of ours.
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm): each
    module in one can reach every other through imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


def test_no_module_of_any_app_is_in_an_import_circle() -> None:
    graph = _graph(PRODUCTION)
    circles = [
        [f"{a} → {b}" for a in group for b in sorted(graph[a]) if b in group]
        for group in _circles(graph)
    ]
    assert circles == []


def test_a_circle_is_found_through_an_import_inside_a_function(tmp_path: Path) -> None:
    """The check itself: two modules that import each other, one of them in a function."""
    graph = {"app.a": {"app.b"}, "app.b": {"app.a"}, "app.c": {"app.a"}}
    assert _circles(graph) == [["app.a", "app.b"]]
    (tmp_path / "app").mkdir()
    module = tmp_path / "app" / "b.py"
    module.write_text("def later():\n    from . import a\n")
    assert ("app.a", False) in _imports(module, tmp_path)


def test_core_imports_no_app() -> None:
    apps = tuple(room for room in PRODUCTION if room != "core")
    offenders = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in _modules("core").values()
        for module, _ in _imports(path)
        if module.split(".")[0] in apps
    ]
    assert offenders == []
