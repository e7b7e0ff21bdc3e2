"""The SkyRL lane (`make test-skyrl`, not part of `make test`): rlctl against SkyRL's Tinker-compatible server.

One server for the session, started from .venv-skyrl (tests_skyrl/requirements.lock) on the CPU with rlctl's tiny
model. SkyRL is the open implementation of the Tinker API; nothing here is a stand-in.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.live import free_port
from tests_skyrl.server import SkyRLServer, skyrl_server


@pytest.fixture(scope="session")
def skyrl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SkyRLServer]:
    with skyrl_server(tmp_path_factory.mktemp("skyrl"), free_port()) as server:
        yield server


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Runs against SkyRL on a shared CPU take minutes: a longer bound than the default suite's."""
    for item in items:
        item.add_marker(pytest.mark.timeout(1800))
