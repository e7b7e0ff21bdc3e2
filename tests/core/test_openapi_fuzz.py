"""Property-based calls against the app's own OpenAPI document: no 5xx, every response as documented."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.conftest import build_settings
from tests.support.live import LiveService, live_service

TOKEN = "fuzz-token"
# An upload is valid by its content (JSON lines of a trajectory format), and so is an environment's source (an
# importable BaseEnv subclass), which no schema can state: random content must be refused cleanly (documented
# 4xx, never 5xx), so only the "valid data is accepted" check is left out.
CONTENT_VALIDATED = {"POST /datasets", "PUT /environments/{name}"}


@pytest.fixture(scope="module")
def fuzz_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    data_dir = tmp_path_factory.mktemp("fuzz")
    with live_service(build_settings(data_dir, f"sqlite:///{data_dir / 'rlctl.db'}", api_token=TOKEN)) as live:
        yield live


def test_api_conforms_to_its_schema(fuzz_service: LiveService) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzz_service.base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 5
    for operation in operations:
        exercise(operation)


def exercise(operation: schemathesis.APIOperation) -> None:
    excluded = [positive_data_acceptance] if operation.label in CONTENT_VALIDATED else []

    @given(case=operation.as_strategy())
    @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def call(case: schemathesis.Case) -> None:
        case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120, excluded_checks=excluded)

    call()
