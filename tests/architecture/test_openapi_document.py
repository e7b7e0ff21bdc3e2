"""The OpenAPI document is a contract: a change to it is deliberate, never a side effect of moving code.

The document the app serves is compared with `tests/data/openapi.json`. After an intended change to the API, write
the new one with `RLCTL_WRITE_OPENAPI=1 .venv/bin/python -m pytest tests/architecture/test_openapi_document.py` and
review its diff with the change.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rlctl.service.app import create_app
from tests.conftest import TEST_DATA, build_settings

SNAPSHOT = TEST_DATA / "openapi.json"


def served_document(tmp_path: Path) -> str:
    settings = build_settings(tmp_path / "var", f"sqlite:///{tmp_path}/rlctl.db", tiny_model=False)
    app = create_app(settings, migrate_on_start=False)
    return json.dumps(app.openapi(), indent=1, sort_keys=True) + "\n"


def test_the_served_document_is_the_recorded_one(tmp_path: Path) -> None:
    document = served_document(tmp_path)
    if os.environ.get("RLCTL_WRITE_OPENAPI") == "1":
        SNAPSHOT.write_text(document)
    assert json.loads(document) == json.loads(SNAPSHOT.read_text())


def test_no_schema_is_named_after_its_module(tmp_path: Path) -> None:
    """Two models of one class name get keys made of their module paths (`rlctl__service__...`), which change
    whenever code moves: each model of the API has a name of its own."""
    schemas = json.loads(served_document(tmp_path))["components"]["schemas"]
    assert [name for name in schemas if "__" in name] == []


def test_every_success_body_has_a_schema(tmp_path: Path) -> None:
    """A generated client reads only what is described: the JSON Lines exports too (as text)."""
    paths = json.loads(served_document(tmp_path))["paths"]
    undescribed = [
        f"{method.upper()} {path} {media}"
        for path, operations in paths.items()
        for method, operation in operations.items()
        for status, answer in operation.get("responses", {}).items()
        if status.startswith("2")
        for media, content in answer.get("content", {}).items()
        if "schema" not in content
    ]
    assert undescribed == []
