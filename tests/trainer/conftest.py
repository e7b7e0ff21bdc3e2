"""Fixtures of the trainer tests: one tiny model per session, built locally with no download."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.tiny_model import init_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen3", seed=0)
