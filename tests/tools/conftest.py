"""Tool tests reuse the fixtures of the runs tests (real processes, cleaned up afterwards)."""

from collections.abc import Callable, Iterator

import pytest

from rlctl.service.settings import Settings
from tests.runs.conftest import process_database_url, run_settings  # noqa: F401
from tests.support.live import Service, in_process_service


@pytest.fixture
def service(make_settings: Callable[..., Settings]) -> Iterator[Service]:
    with in_process_service(make_settings()) as live:
        yield live
