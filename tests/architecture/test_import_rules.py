"""The import rules of docs/ARCHITECTURE.md, checked on the source: a package imports only what its row allows."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = {
    "service",
    "supervisor",
    "trainer",
    "trajectories",
    "judging",
    "environment_kit",
    "environments",
    "migrations",
}

# package -> first-party packages it may import (itself always allowed)
ALLOWED: dict[str, set[str]] = {
    "trajectories": set(),
    "supervisor": set(),
    "trainer": {"trajectories"},
    "judging": {"trajectories"},
    "environment_kit": {"trajectories"},
    "environments": {"trajectories", "judging", "environment_kit"},
    "service": {"supervisor", "trainer", "trajectories", "judging"},
}
# third-party modules a package must never import, with the reason
FORBIDDEN_THIRD_PARTY: dict[str, dict[str, str]] = {
    "supervisor": {"fastapi": "supervision knows nothing of HTTP", "starlette": "supervision knows nothing of HTTP"},
    "judging": {"sqlalchemy": "no database: the caller gives the cache its store", "fastapi": "no web framework"},
    "trajectories": {
        "fastapi": "pure logic",
        "sqlalchemy": "pure logic: no database",
        "openai": "pure logic: no network clients",
        "httpx": "pure logic: no network clients",
    },
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def violations(package: str) -> list[str]:
    problems = []
    allowed = ALLOWED[package] | {package}
    forbidden = FORBIDDEN_THIRD_PARTY.get(package, {})
    for path in sorted((REPO_ROOT / package).rglob("*.py")):
        for line, module in imported_modules(path):
            top = module.split(".")[0]
            where = f"{path.relative_to(REPO_ROOT)}:{line} imports {module}"
            if top in FIRST_PARTY and top not in allowed:
                problems.append(where)
            elif top in forbidden:
                problems.append(f"{where} ({forbidden[top]})")
    return problems


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_follow_the_rules(package: str) -> None:
    assert violations(package) == []


def test_the_rules_see_a_violation(tmp_path: Path) -> None:
    module = tmp_path / "bad.py"
    module.write_text("from service.errors import NotFound\nimport fastapi\n")
    assert [name for _, name in imported_modules(module)] == ["service.errors", "fastapi"]
