"""Fixtures of inference tests: the tiny model behind a real OpenAI-compatible server on loopback, a service on
a real database, and the check that no child process outlives its test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from rlctl.service.settings import Settings
from rlctl.trainer.tiny_model import init_tiny_model
from tests.conftest import build_settings
from tests.support.databases import MigratedDatabases, database_kinds, fresh_database
from tests.support.endpoints import fault_endpoint, tiny_model_endpoint

SERVED_MODELS = ("tiny/model-a", "tiny/model-b")
PLANTED_KEY = "sk-planted-inference-key-5f1e9c7d"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen3", seed=0)


@pytest.fixture(scope="session")
def endpoint(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`/v1` URL of the trainer's inference server on the tiny model, serving SERVED_MODELS (404 for others)."""
    with tiny_model_endpoint(tiny_model, tmp_path_factory.mktemp("endpoint"), SERVED_MODELS) as url:
        yield url


@pytest.fixture(scope="session")
def faulty_endpoint(endpoint: str) -> Iterator[str]:
    with fault_endpoint(endpoint) as url:
        yield url


@pytest.fixture
def process_database_url(tmp_path: Path, session_databases: MigratedDatabases) -> Iterator[str]:
    """Tests with real child processes are slow: PostgreSQL when configured (CI), else SQLite."""
    with fresh_database(database_kinds()[-1], tmp_path, session_databases) as url:
        yield url


@pytest.fixture
def inference_settings(
    tmp_path: Path, process_database_url: str, tiny_model: Path, endpoint: str
) -> Callable[..., Settings]:
    """The locked tokenizer is the tiny model; the loopback endpoint is the configured one with a key."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "tokenizer_name": str(tiny_model),
            "inference_base_url": endpoint,
            "inference_api_key": PLANTED_KEY,
            **overrides,
        }
        return build_settings(tmp_path / "var", process_database_url, **values)

    return make


@pytest.fixture(autouse=True)
def no_child_left(tmp_path: Path) -> Iterator[None]:
    """Every inference-test child of this test has ended when the test does; stragglers are killed and fail it."""
    yield
    stragglers = [p for p in psutil.process_iter(["cmdline"]) if _is_child_of_test(p, str(tmp_path))]
    for process in stragglers:
        process.kill()
    assert not stragglers, f"inference-test processes outlived the test: {[p.pid for p in stragglers]}"


def _is_child_of_test(process: psutil.Process, marker: str) -> bool:
    command = " ".join(process.info.get("cmdline") or [])
    return "rlctl.service.inference_tests.child" in command and marker in command
