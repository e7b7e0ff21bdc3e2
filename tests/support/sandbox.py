"""The real sandbox (bubblewrap) for tests: found once, a failure where CI requires it, a skip elsewhere."""

from __future__ import annotations

import os

import pytest

from rlctl.sandbox.bubblewrap import Sandbox, find_sandbox
from rlctl.service.settings import Settings


def required_sandbox() -> Sandbox:
    """The sandbox the service's own settings would find; RLCTL_TEST_REQUIRE_SANDBOX=1 turns its absence into a
    failure so CI cannot pass by skipping every sandboxed test."""
    settings = Settings(_env_file=None)
    found = find_sandbox(settings.sandbox_bwrap, settings.sandbox_uid)
    if isinstance(found, str):
        if os.environ.get("RLCTL_TEST_REQUIRE_SANDBOX") == "1":
            pytest.fail(f"the sandbox is required here (RLCTL_TEST_REQUIRE_SANDBOX=1): {found}")
        pytest.skip(f"no sandbox here: {found}")
    return found
