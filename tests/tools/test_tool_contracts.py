"""Every tool's contract: a strict-mode input schema generated from its arguments model, where null means "the
default" for each optional argument, and an output schema its results conform to."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient

from rlctl.service.app import create_app
from rlctl.service.tools.catalog import ALL_TOOLS
from rlctl.service.tools.json_schemas import admits_null
from rlctl.service.tools.registry import Tool
from rlctl.service.tools.sessions import SESSION_ARGUMENT
from tests.conftest import build_settings

# The required arguments of each tool, valid in form: what a call needs besides its optional arguments.
REQUIRED: dict[str, dict[str, Any]] = {
    "rl_list_environments": {},
    "rl_select_environment": {"name": "echo"},
    "rl_get_current_config": {},
    "rl_edit_config": {"field": "group_size", "value": None},
    "rl_start_training": {},
    "rl_check_status": {"run_id": "nosuchrun"},
    "rl_stop_training": {"run_id": "nosuchrun"},
    "rl_resume_training": {"run_id": "nosuchrun"},
    "rl_get_results": {"run_id": "nosuchrun"},
    "rl_list_runs": {},
    "rl_evaluate": {"run_id": "nosuchrun"},
    "rl_get_evaluation": {"evaluation_id": "nosuchevaluation"},
    "rl_test_inference": {},
    "rl_get_inference_test": {"test_id": "nosuchtest"},
    "rl_upload_dataset": {"name": "contracts", "content": json.dumps({"messages": [{"role": "user", "content": "1"}]})},
    "rl_list_datasets": {},
    "rl_dataset_stats": {"dataset_id": "nosuchdataset"},
    "rl_compress_dataset": {"dataset_id": "nosuchdataset"},
    "rl_score_dataset": {"dataset_id": "nosuchdataset", "rewards": [{"name": "format", "weight": None}]},
    "rl_export_grpo": {"dataset_id": "nosuchdataset"},
    "rl_collect_trajectories": {
        "name": "contracts",
        "prompts": [{"prompt": "Say hi.", "answer": None}],
        # A run's checkpoint, with which base_url is left out (null): no such run, so the call is refused at once.
        # (With a model id, base_url is needed: its null is no default; tests/datasets_api covers that form.)
        "model": {"run": "nosuchrun", "step": None},
    },
    "rl_get_job": {"job_id": "nosuchjob"},
    "rl_read_environment": {"name": "echo"},
    "rl_write_environment": {"name": "contracts", "source": "def broken(:\n"},  # fails its syntax check: fast
}


def optional_arguments(tool: Tool[Any]) -> list[str]:
    """The model's optional arguments, and a stateful tool's `tool_session` (null: the session of the call)."""
    optional = [name for name, field in tool.arguments.model_fields.items() if not field.is_required()]
    return [*optional, SESSION_ARGUMENT] if tool.stateful else optional


def object_schemas(schema: Any) -> Iterator[dict[str, Any]]:
    if isinstance(schema, dict):
        if schema.get("type") == "object" or "properties" in schema:
            yield schema
        for value in schema.values():
            yield from object_schemas(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from object_schemas(item)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    data_dir = tmp_path_factory.mktemp("contracts")
    settings = build_settings(data_dir / "var", f"sqlite:///{data_dir / 'rlctl.db'}")
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_every_tool_has_its_required_arguments_listed_here() -> None:
    assert set(REQUIRED) == {tool.name for tool in ALL_TOOLS}


@pytest.mark.parametrize("tool", ALL_TOOLS, ids=lambda tool: tool.name)
def test_input_schemas_are_strict_mode_compatible(tool: Tool[Any]) -> None:
    schema = tool.input_schema
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["type"] == "object" and "$defs" not in json.dumps(schema) and "$ref" not in json.dumps(schema)
    for node in object_schemas(schema):
        assert node["additionalProperties"] is False, node
        assert sorted(node["required"]) == sorted(node["properties"]), node
    for name in optional_arguments(tool):
        assert admits_null(schema["properties"][name]), f"{tool.name}.{name} is optional but refuses null"
    jsonschema.validate({**REQUIRED[tool.name], **dict.fromkeys(optional_arguments(tool))}, schema)


@pytest.mark.parametrize("tool", ALL_TOOLS, ids=lambda tool: tool.name)
def test_a_null_optional_argument_means_its_default(tool: Tool[Any]) -> None:
    defaults = tool.parse(REQUIRED[tool.name])
    for name in optional_arguments(tool):
        assert tool.parse({**REQUIRED[tool.name], name: None}) == defaults, name


@pytest.mark.parametrize("tool", ALL_TOOLS, ids=lambda tool: tool.name)
def test_calls_with_every_optional_argument_null_are_accepted(client: TestClient, tool: Tool[Any]) -> None:
    arguments = {**REQUIRED[tool.name], **dict.fromkeys(optional_arguments(tool))}
    response = client.post(f"/tools/{tool.name}", json=arguments, headers={"X-Tool-Session": f"null-{tool.name}"})
    assert response.status_code == 200, response.text
    result = response.json()
    assert "argument" not in result, result  # an argument error names the argument it refused
    if "error" not in result:
        jsonschema.validate(result, tool.output_schema)


def test_null_for_a_defaulted_argument_is_refused_where_it_is_not_optional(client: TestClient) -> None:
    result = client.post("/tools/rl_check_status", json={"run_id": None}).json()
    assert result["code"] == "VALIDATION_ERROR" and result["argument"] == "run_id"


def test_descriptions_state_the_configured_status_interval(tmp_path: Path) -> None:
    settings = build_settings(tmp_path / "var", f"sqlite:///{tmp_path / 'rlctl.db'}", status_check_interval_s=600)
    status = next(tool for tool in ALL_TOOLS if tool.name == "rl_check_status")
    assert "every 10 minutes" in status.describe(settings)
    assert "every 30 minutes" in status.describe(settings.model_copy(update={"status_check_interval_s": 1800}))
