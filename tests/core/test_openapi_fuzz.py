"""Property-based calls against the app's own OpenAPI document: no 5xx, every response as documented; first one
operation at a time, then as sequences that follow the document's links (create something, then use its id)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.stateful import Bundle, initialize
from schemathesis.generation.stateful.state_machine import StepInput, StepOutput
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from rlctl.service.app import create_app
from tests.conftest import build_settings
from tests.support.live import LiveService, live_service
from tests.support.waiting import scaled

TOKEN = "fuzz-token"
# An upload is valid by its content (JSON lines of a trajectory format), and so is an environment's source (an
# importable BaseEnv subclass), which no schema can state: random content must be refused cleanly (documented
# 4xx, never 5xx), so only the "valid data is accepted" check is left out.
# A run names exactly one of `environment`, `environments` and `dataset`: a rule across optional fields that its
# schema does not state, so a schema-valid body may be refused (422 VALIDATION_ERROR) there too.
# A collection's `network` destinations are checked against the server's address rule (docs/SECURITY.md#network)
# and need the `terminal` tool, neither of which its schema can state.
# Scoring and evaluations name each reward once (items that differ in their weight alone are still one reward:
# JSON Schema's uniqueItems cannot say it), and a judge only beside a reward that uses it.
CONTENT_VALIDATED = {
    "POST /datasets",
    "PUT /environments/{name}",
    "POST /runs",
    "POST /collections",
    "POST /datasets/{dataset_id}/score",
    "POST /evaluations",
}
# Each create operation and the operations its answer leads to (by the id it answers): the links the document
# must carry, so that the stateful test reaches existing resources, not only unknown ids.
EXPECTED_LINKS = {
    ("post", "/datasets", "201"): {"get_dataset", "get_records", "get_stats", "delete_dataset"},
    ("post", "/runs", "201"): {"get_run", "check_run_status", "stop_run"},
    ("post", "/collections", "202"): {"get_collection", "list_collection_items", "get_job"},
    ("post", "/inference-tests", "202"): {"get_inference_test"},
    ("put", "/environments/{name}", "201"): {
        "get_environment_source",
        "list_environment_versions",
        "get_environment",
    },
}
MULTIPART = "multipart/form-data"
SEED_RECORD = b'{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}\n'
# Bounds of the stateful run (scenarios, and calls in each): small, so that it stays within a CI step's time.
STATEFUL_SCENARIOS = 25
STATEFUL_STEPS = 5


@pytest.fixture(scope="module")
def fuzz_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    data_dir = tmp_path_factory.mktemp("fuzz")
    with live_service(build_settings(data_dir, f"sqlite:///{data_dir / 'rlctl.db'}", api_token=TOKEN)) as live:
        yield live


@pytest.mark.e2e
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


def test_create_operations_link_to_what_uses_the_id(tmp_path: Path) -> None:
    """Every link names an operation of the document and sets path parameters it has, from a field of the body."""
    document = create_app(build_settings(tmp_path, f"sqlite:///{tmp_path / 'rlctl.db'}")).openapi()
    operations = {
        op["operationId"]: op for path in document["paths"].values() for op in path.values() if "operationId" in op
    }
    for (method, path, status), targets in EXPECTED_LINKS.items():
        answer = document["paths"][path][method]["responses"][status]
        links = answer["links"]
        assert {link["operationId"] for link in links.values()} == targets
        body = answer["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
        fields = document["components"]["schemas"][body]["properties"]
        for link in links.values():
            path_params = {p["name"] for p in operations[link["operationId"]]["parameters"] if p["in"] == "path"}
            assert set(link["parameters"]) == path_params
            for expression in link["parameters"].values():
                assert expression.removeprefix("$response.body#/") in fields


@pytest.mark.e2e
def test_linked_sequences_conform_to_the_schema(fuzz_service: LiveService) -> None:
    """Scenarios of a few calls that follow the links: no 5xx, every answer as documented."""
    schema = schemathesis.openapi.from_url(f"{fuzz_service.base_url}/openapi.json")
    followed: list[tuple[str, bool]] = []

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        @initialize(target=Bundle("catch_all"))  # type: ignore[misc]
        def seed_dataset(self) -> StepOutput:
            """Random bodies rarely make a valid upload: each scenario starts with one real dataset (the answer
            goes to the bundle of POST /datasets -> 201), so the links from it are followed."""
            upload = schema["/datasets"]["POST"].Case(
                query={"name": "seed"}, body={"file": SEED_RECORD}, media_type=MULTIPART
            )
            seed = StepInput.initial(upload)
            # As the machine's own root steps do: recorded, so that the steps its links lead to find their parent.
            self.recorder.record_case(case=upload)
            self.control.record_step(seed, self.recorder)
            return self.step(seed)

        def step(self, input: StepInput) -> StepOutput:
            if input.transition is not None and input.is_applied:
                followed.append((input.transition.id, input.transition.is_inferred))
            return super().step(input)

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"headers": {"Authorization": f"Bearer {TOKEN}"}, "timeout": scaled(120)}

        def validate_response(self, response: schemathesis.Response, case: schemathesis.Case, **kwargs: Any) -> None:
            excluded = [positive_data_acceptance] if case.operation.label in CONTENT_VALIDATED else []
            # Negative cases here are unknown query parameters (ignored, as by every FastAPI route) and a missing
            # Authorization header that get_call_kwargs supplies: not wrong answers, so that check is left out.
            excluded.append(negative_data_rejection)
            case.validate_response(
                response,
                excluded_checks=excluded,
                headers=kwargs.get("headers"),
                recorder=getattr(self, "recorder", None),
            )

    Workflow.run(
        settings=settings(
            max_examples=STATEFUL_SCENARIOS,
            stateful_step_count=STATEFUL_STEPS,
            phases=[Phase.generate],
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            derandomize=True,
        )
    )
    # The document's own links were followed (not only those schemathesis infers from names).
    assert any(label.startswith("POST /datasets -> [201]") and not inferred for label, inferred in followed), followed
