"""Shared fixtures: every database-backed test runs on SQLite and, when configured, PostgreSQL."""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rlctl.service.pysource import PARSE_LOCK
from rlctl.service.settings import Settings
from tests.support.databases import MigratedDatabases, database_kinds, fresh_database, migrated_databases
from tests.support.environment_schemas import shared_schemas
from tests.support.live import InProcessService, in_process_service
from tests.support.tiny_model import keep_session_models_in, seed_tiny_model

REPO_ROOT = Path(__file__).resolve().parent.parent


# Small licensed excerpts of public data (tests/data/SOURCES.md); nothing outside the clone is read.
TEST_DATA = REPO_ROOT / "tests" / "data"

# Secrets of the developer's shell must not leak into tests (nor tests depend on them).
for _name in ("TINKER_API_KEY", "WANDB_API_KEY", "OPENROUTER_API_KEY", "RLCTL_API_TOKEN"):
    os.environ.pop(_name, None)


_unlocked_parse = ast.parse


def _parse_under_the_service_lock(*args: Any, **kwargs: Any) -> ast.AST:
    with PARSE_LOCK:
        return _unlocked_parse(*args, **kwargs)


# pytest parses a failed test's source to show it, on the main thread, while an in-process service may be
# parsing environment files in its request threads; unserialised, the two can crash the whole session
# (rlctl/service/pysource.py says why).
ast.parse = _parse_under_the_service_lock  # type: ignore[assignment]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long end-to-end tests first: on several workers (`make test`), the short ones then fill the gaps
    instead of one long test starting last and running alone (a stable sort keeps each group's order)."""
    items.sort(key=lambda item: item.get_closest_marker("e2e") is None)


@pytest.fixture(autouse=True)
def environment_schemas_once(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each environment is imported once per session (tests marked `real_introspection` import it every time)."""
    if request.node.get_closest_marker("real_introspection"):
        yield
        return
    with shared_schemas():
        yield


@pytest.fixture(scope="session", autouse=True)
def session_models(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The tiny model is built once per session, at first use (tests/support/tiny_model.py)."""
    keep_session_models_in(tmp_path_factory.mktemp("session-models"))


@pytest.fixture(scope="session")
def session_databases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MigratedDatabases]:
    """The schema, migrated once per session; each test gets a database of its own in that state."""
    with migrated_databases(tmp_path_factory.mktemp("databases")) as databases:
        yield databases


@pytest.fixture(params=database_kinds())
def database_url(request: pytest.FixtureRequest, tmp_path: Path, session_databases: MigratedDatabases) -> Iterator[str]:
    """A migrated database of this test alone, on each configured kind."""
    with fresh_database(request.param, tmp_path, session_databases) as url:
        yield url


def build_settings(data_dir: Path, database_url: str, tiny_model: bool = True, **overrides: Any) -> Settings:
    """Settings of a test's service; its data directory holds the session's tiny model unless `tiny_model` is
    False (tests of the model's build)."""
    if tiny_model:
        seed_tiny_model(data_dir)
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "database_url": database_url,
        "gsm8k_path": TEST_DATA / "gsm8k",
        # Hundreds of apps start in a session: each would read every schema and build a tiny model at start-up
        # (docs/RUNS.md#start-up-work). Tests of that work turn it on; `rlctl serve` processes keep the default.
        "warm_up": False,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)


@pytest.fixture
def make_settings(tmp_path: Path, database_url: str) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        return build_settings(tmp_path / "var", database_url, **overrides)

    return make


@pytest.fixture
def service(make_settings: Callable[..., Settings]) -> Iterator[InProcessService]:
    """The app with its lifespan, called in process; tests that need a socket use `live_service`."""
    with in_process_service(make_settings()) as app:
        yield app
