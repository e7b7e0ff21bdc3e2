"""The import rules of docs/ARCHITECTURE.md, checked on the source (`tests/architecture/layers.py` holds them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.architecture import layers


@pytest.mark.parametrize("wing", sorted(layers.WINGS))
def test_a_wing_imports_only_what_its_row_allows(wing: str) -> None:
    assert layers.wing_violations(wing) == []


def test_service_imports_go_down_its_layers() -> None:
    assert layers.layer_violations() == []


def test_service_has_no_import_cycle() -> None:
    assert layers.unit_cycles() == []


def test_every_part_of_service_has_a_layer() -> None:
    service = layers.wing_directory("service")
    units = {path.stem for path in service.glob("*.py")} | {
        path.name for path in service.iterdir() if (path / "__init__.py").exists()
    }
    assert sorted(unit for unit in units if layers.layer_of(unit) is None) == []


def test_the_rules_see_a_violation(tmp_path: Path) -> None:
    module = tmp_path / "bad.py"
    module.write_text("from rlctl.service.errors import NotFound\nimport fastapi\nfrom . import sibling\n")
    assert [name for _, name in layers.imported_modules(module)] == ["rlctl.service.errors", "fastapi", "sibling"]


def test_the_layers_see_an_upward_import_and_a_cycle() -> None:
    assert layers.layer_of("settings") == layers.KERNEL_LAYER
    order = [layers.layer_of(unit) for unit in ("environments", "datasets", "runs", "tools", "app", "cli")]
    assert order == sorted(order) and len(set(order)) == len(order)
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert layers._strongly_connected(graph) == [["a", "b", "c"], ["d"]]
