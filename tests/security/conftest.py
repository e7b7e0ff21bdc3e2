"""Fixtures of the hostile-input tests: the real sandbox (bubblewrap), required where CI says so."""

from __future__ import annotations

import pytest

from rlctl.sandbox.bubblewrap import Sandbox
from tests.support.sandbox import required_sandbox


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    return required_sandbox()
