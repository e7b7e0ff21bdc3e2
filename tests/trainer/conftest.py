"""Fixtures of the trainer tests: one tiny model per session, built locally with no download."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tiny_model import session_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    return session_tiny_model()
