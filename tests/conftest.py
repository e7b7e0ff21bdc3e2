"""Shared fixtures: every database-backed test runs on SQLite and, when configured, PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from service.settings import Settings
from tests.support.databases import database_kinds, fresh_database
from tests.support.live import LiveService, live_service

REPO_ROOT = Path(__file__).resolve().parent.parent


# Small licensed excerpts of public data (tests/data/SOURCES.md); nothing outside the clone is read.
TEST_DATA = REPO_ROOT / "tests" / "data"

# Secrets of the developer's shell must not leak into tests (nor tests depend on them).
for _name in ("TINKER_API_KEY", "WANDB_API_KEY", "OPENROUTER_API_KEY", "RLCTL_API_TOKEN"):
    os.environ.pop(_name, None)


@pytest.fixture(params=database_kinds())
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with fresh_database(request.param, tmp_path) as url:
        yield url


def build_settings(data_dir: Path, database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "database_url": database_url,
        "gsm8k_path": TEST_DATA / "gsm8k",
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)


@pytest.fixture
def make_settings(tmp_path: Path, database_url: str) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        return build_settings(tmp_path / "var", database_url, **overrides)

    return make


@pytest.fixture
def service(make_settings: Callable[..., Settings]) -> Iterator[LiveService]:
    with live_service(make_settings()) as live:
        yield live
