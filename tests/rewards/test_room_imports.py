"""The rewards room sits below the domains that score: it imports none of them, and they reach rewards through it,
never through the datasets' job module."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
ABOVE_REWARDS = ("datasets", "runs", "collections", "inference_tests", "evaluations", "tools")


def imported_names(folder: str, root: Path = REPO_ROOT) -> list[tuple[str, str]]:
    """(file:line, dotted name) of every absolute import under `folder`; `from a import b` gives `a` and `a.b`, so
    a module imported by its package's name is seen too."""
    found: list[tuple[str, str]] = []
    for path in sorted((root / folder).rglob("*.py")):
        where = path.relative_to(root)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found.extend((f"{where}:{node.lineno}", alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((f"{where}:{node.lineno}", node.module))
                found.extend((f"{where}:{node.lineno}", f"{node.module}.{alias.name}") for alias in node.names)
    return found


def test_rewards_import_no_domain_above_them() -> None:
    above = tuple(f"service.{domain}" for domain in ABOVE_REWARDS)
    found = [f"{where} imports {name}" for where, name in imported_names("service/rewards") if name.startswith(above)]
    assert found == []


def test_runs_and_evaluations_do_not_import_the_datasets_job_module() -> None:
    found = [
        f"{where} imports {name}"
        for folder in ("service/runs", "service/evaluations")
        for where, name in imported_names(folder)
        if name == "service.datasets.jobs"
    ]
    assert found == []


def test_an_import_by_the_packages_name_is_seen(tmp_path: Path) -> None:
    (tmp_path / "room").mkdir()
    (tmp_path / "room" / "bad.py").write_text("from service.datasets import jobs\n")
    assert [name for _, name in imported_names("room", tmp_path)] == ["service.datasets", "service.datasets.jobs"]
