"""The import rules of docs/ARCHITECTURE.md as data, and the import graph they are checked on.

Two levels of rules:
- **Wings** (top-level packages): each imports only the wings its row allows (`WINGS`).
- **Layers inside `rlctl/service/`**: the kernel (`SERVICE_KERNEL`) imports no domain; a domain imports the kernel, the
  layers below its own, and no other domain of its own layer (`SERVICE_LAYERS`, lowest first).

Imports are read from the source (`ast`), every `import` statement wherever it stands (inside a function, under
`TYPE_CHECKING`): a deferred import is still a dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# wing -> first-party wings it may import (itself always allowed)
WINGS: dict[str, set[str]] = {
    "trajectories": set(),
    "supervisor": set(),
    "sandbox": set(),
    "trainer": {"trajectories"},
    "judging": {"trajectories"},
    "environment_kit": {"trajectories", "trainer", "sandbox", "judging"},
    "environments": {"trajectories", "judging", "environment_kit"},
    "service": {"supervisor", "sandbox", "trainer", "trajectories", "judging"},
    "migrations": {"service"},
}
FIRST_PARTY = set(WINGS)
# the wings installed as the `rlctl` namespace (rlctl/<wing>/); environments and migrations stay beside it
NAMESPACED = frozenset({"service", "supervisor", "sandbox", "trainer", "trajectories", "judging", "environment_kit"})

# third-party modules a wing must never import, with the reason
FORBIDDEN_THIRD_PARTY: dict[str, dict[str, str]] = {
    "supervisor": {"fastapi": "supervision knows nothing of HTTP", "starlette": "supervision knows nothing of HTTP"},
    "sandbox": {
        "fastapi": "isolation knows nothing of HTTP",
        "starlette": "isolation knows nothing of HTTP",
        "sqlalchemy": "isolation keeps no records",
    },
    "judging": {"sqlalchemy": "no database: the caller gives the cache its store", "fastapi": "no web framework"},
    "trajectories": {
        "fastapi": "pure logic",
        "sqlalchemy": "pure logic: no database",
        "openai": "pure logic: no network clients",
        "httpx": "pure logic: no network clients",
    },
}

# The kernel of rlctl/service/: modules (service/NAME.py) and packages (service/NAME/) that every domain may use and
# that import no domain.
SERVICE_KERNEL = frozenset(
    {
        "__init__",
        "settings",
        "errors",
        "states",
        "names",
        "schemas",
        "pagination",
        "children",
        "pysource",
        "observability",
        "context",
        "deps",
        "http",
        "heap",
        "db",
        "auth",
    }
)
# The domains of rlctl/service/, lowest first: a domain imports only the kernel and the layers below its own.
SERVICE_LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"environments", "jobs", "health", "monitoring", "ui"}),
    frozenset({"rewards"}),
    frozenset({"datasets"}),
    frozenset({"runs", "inference_tests"}),
    frozenset({"evaluations", "collections"}),  # both use runs' checkpoints
    frozenset({"tools"}),
    frozenset({"startup"}),  # the composition root's first half: the context's components, the start-up work
    frozenset({"app", "client"}),  # the composition root; the HTTP client of the command line
    frozenset({"cli"}),  # `rlctl`: serves the app, or calls a running service through the client
)
KERNEL_LAYER = -1


def wing_directory(wing: str) -> Path:
    return REPO_ROOT / "rlctl" / wing if wing in NAMESPACED else REPO_ROOT / wing


def python_files(wing: str) -> list[Path]:
    return sorted(wing_directory(wing).rglob("*.py"))


def wing_of(module: str) -> str:
    """The wing a module belongs to: `rlctl.trainer.loop` is the trainer's."""
    parts = module.split(".")
    return parts[1] if parts[0] == "rlctl" and len(parts) > 1 else parts[0]


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file; a relative import is made absolute."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _package_of(path)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            if node.module is None or base in {"rlctl", "rlctl.service"}:  # `from rlctl import x`: x is a module
                found.extend((node.lineno, f"{base}.{alias.name}".lstrip(".")) for alias in node.names)
            else:
                found.append((node.lineno, base))
    return found


def _package_of(path: Path) -> list[str]:
    try:
        parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    except ValueError:  # a file outside the repository (the rules' own test)
        return []
    return parts if parts[-1] == "__init__" else parts[:-1]


def service_unit(module: str) -> str | None:
    """The kernel part or domain a `rlctl.service.*` module belongs to; None outside rlctl/service/."""
    parts = module.split(".")
    if parts[:2] != ["rlctl", "service"]:
        return None
    return parts[2] if len(parts) > 2 else "__init__"


def layer_of(unit: str) -> int | None:
    if unit in SERVICE_KERNEL:
        return KERNEL_LAYER
    return next((index for index, layer in enumerate(SERVICE_LAYERS) if unit in layer), None)


def service_edges() -> Iterator[tuple[str, str, str]]:
    """(importing unit, imported unit, where) for every import between two units of rlctl/service/."""
    for path in python_files("service"):
        relative = path.relative_to(REPO_ROOT)
        importer = service_unit(".".join(relative.with_suffix("").parts))
        for line, module in imported_modules(path):
            imported = service_unit(module)
            if importer is not None and imported is not None and imported != importer:
                yield importer, imported, f"{relative}:{line} imports {module}"


def wing_violations(wing: str) -> list[str]:
    problems = []
    allowed = WINGS[wing] | {wing}
    forbidden = FORBIDDEN_THIRD_PARTY.get(wing, {})
    for path in python_files(wing):
        for line, module in imported_modules(path):
            top = wing_of(module)
            where = f"{path.relative_to(REPO_ROOT)}:{line} imports {module}"
            if top in FIRST_PARTY and top not in allowed:
                problems.append(where)
            elif top in forbidden:
                problems.append(f"{where} ({forbidden[top]})")
    return problems


def layer_violations() -> list[str]:
    """Every import inside rlctl/service/ that goes up a layer, sideways between two domains of one layer, or from the
    kernel to a domain; and every unit that no layer names."""
    problems = []
    for importer, imported, where in service_edges():
        importer_layer, imported_layer = layer_of(importer), layer_of(imported)
        if importer_layer is None or imported_layer is None:
            problems.append(f"{where} (a part of rlctl/service/ that no layer names)")
        elif imported_layer > importer_layer or (imported_layer == importer_layer != KERNEL_LAYER):
            problems.append(where)
    return problems


def unit_cycles() -> list[list[str]]:
    """Import cycles between the units of rlctl/service/ (kernel parts and domains), each as the units on it."""
    graph: dict[str, set[str]] = {}
    for importer, imported, _ in service_edges():
        graph.setdefault(importer, set()).add(imported)
        graph.setdefault(imported, set())
    return [component for component in _strongly_connected(graph) if len(component) > 1]


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative over the nodes (the graph is a few dozen units)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components
