"""Fixtures of the hostile-input tests: the real sandbox (bubblewrap), required where CI says so."""

from __future__ import annotations

import os

import pytest

from rlctl.sandbox.bubblewrap import Sandbox, find_sandbox
from rlctl.service.settings import Settings


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    settings = Settings(_env_file=None)
    found = find_sandbox(settings.sandbox_bwrap, settings.sandbox_uid)
    if isinstance(found, str):
        if os.environ.get("RLCTL_TEST_REQUIRE_SANDBOX") == "1":
            pytest.fail(f"the sandbox is required here (RLCTL_TEST_REQUIRE_SANDBOX=1): {found}")
        pytest.skip(f"no sandbox here: {found}")
    return found
