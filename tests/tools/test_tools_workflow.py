"""An agent drives rlctl end to end through POST /tools/* only, with real processes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from rlctl.service.db.engine import Database
from rlctl.service.db.models import Run
from rlctl.service.settings import Settings
from tests.support.live import Service, in_process_service
from tests.support.waiting import wait_until


def call(client: httpx.Client, tool: str, session: str | None = None, **arguments: Any) -> dict:
    headers = {"X-Tool-Session": session} if session else {}
    response = client.post(f"/tools/{tool}", json=arguments, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.e2e
def test_the_whole_agent_workflow(run_settings: Callable[..., Settings]) -> None:
    with in_process_service(run_settings(local_total_steps=10_000)) as live, live.client() as client:
        first = client.post("/tools/rl_list_environments", json={})
        listed = first.json()
        assert first.headers["X-Tool-Session"] == "default"  # no session named: the token's default one
        session = "workflow"
        assert {"echo", "gsm8k"} <= {e["name"] for e in listed["environments"]}
        assert listed["count"] == len(listed["environments"]) and listed["tips"]

        selected = call(client, "rl_select_environment", session, name="echo")
        assert selected["environment"] == "echo" and selected["file_path"].endswith("echo.py")

        config = call(client, "rl_get_current_config", session)
        fields = {f["name"]: f for f in config["configurable_fields"]}
        assert fields["group_size"]["current_value"] == fields["group_size"]["default"]
        locked = {f["name"]: f for f in config["locked_fields"]}
        assert "locked_value" in locked["total_steps"]

        edited = call(client, "rl_edit_config", session, field="group_size", value=4)
        assert edited["field"] == "group_size" and edited["config"] == {"group_size": 4}
        assert call(client, "rl_edit_config", session, field="batch_size", value=16)["config"] == {
            "group_size": 4,
            "batch_size": 16,
        }
        assert {
            f["name"]: f["current_value"] for f in call(client, "rl_get_current_config", session)["configurable_fields"]
        }["group_size"] == 4

        refused = call(client, "rl_edit_config", session, field="total_steps", value=3)
        assert refused["code"] == "FIELD_LOCKED" and refused["locked_value"] == 10_000

        started = call(client, "rl_start_training", session, backend="local")
        run_id = started["run_id"]
        assert started["backend"] == "local" and started["environment"] == "echo"
        assert set(started["logs"]) == {"api", "trainer", "env"} and "30 minutes" in started["message"]
        wait_until(lambda: client.get(f"/runs/{run_id}").json()["status"] == "running", timeout=240, message="run")

        status = call(client, "rl_check_status", session, run_id=run_id)
        assert status["status"] == "running" and "running_time_minutes" in status
        assert {p["role"] for p in status["processes"]} == {"api", "trainer", "env"}
        limited = call(client, "rl_check_status", session, run_id=run_id)
        assert limited["rate_limited"] is True and limited["run_id"] == run_id
        assert 0 < limited["next_check_in_seconds"] <= 1800

        runs = call(client, "rl_list_runs", session)
        assert runs["count"] == 1 and runs["runs"][0]["run_id"] == run_id

        stopped = call(client, "rl_stop_training", session, run_id=run_id)
        assert stopped["status"] == "stopped"
        results = call(client, "rl_get_results", session, run_id=run_id)
        assert results["run_id"] == run_id and results["status"] == "stopped"
        assert "final_metrics" in results and "weights" in results


@pytest.mark.e2e
def test_two_sessions_do_not_disturb_each_other_and_survive_a_restart(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    with in_process_service(settings) as live, live.client() as client:
        call(client, "rl_select_environment", session="agent-a", name="echo")
        call(client, "rl_select_environment", session="agent-b", name="gsm8k")
        call(client, "rl_edit_config", session="agent-a", field="group_size", value=4)
        call(client, "rl_edit_config", session="agent-b", field="max_new_tokens", value=64)
    with in_process_service(settings) as live, live.client() as client:
        a = call(client, "rl_get_current_config", session="agent-a")
        b = call(client, "rl_get_current_config", session="agent-b")
        assert a["environment"] == "echo" and b["environment"] == "gsm8k"
        assert {f["name"]: f["current_value"] for f in a["configurable_fields"]}["group_size"] == 4
        assert {f["name"]: f["current_value"] for f in b["configurable_fields"]}["max_new_tokens"] == 64
        default = call(client, "rl_get_current_config")
        assert "no environment selected" in default["error"] and "echo" in default["available"]


def test_calls_without_a_session_share_the_tokens_default_one(service: Service) -> None:
    """Clients that name no session (the newest MCP protocol, plain REST) keep their selection between calls."""
    with service.client() as client:
        selected = client.post("/tools/rl_select_environment", json={"name": "echo"})
        assert selected.status_code == 200 and selected.headers["X-Tool-Session"] == "default"
        assert "tool_session" not in selected.json()
        assert call(client, "rl_get_current_config")["environment"] == "echo"
        assert call(client, "rl_get_current_config", "default")["environment"] == "echo"
        # a named session is apart from it
        assert "no environment selected" in call(client, "rl_get_current_config", "mine")["error"]
        # the name Hermes users know finds the environment
        assert call(client, "rl_select_environment", "alias", name="gsm8k_tinker")["environment"] == "gsm8k"


def test_rl_list_runs_pages_with_a_cursor(service: Service, database_url: str) -> None:
    db = Database(database_url)
    with db.session() as session:
        for index in range(5):
            session.add(Run(id=f"paged{index}", environment="echo", backend="local", status="stopped"))
    db.dispose()
    with service.client() as client:
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            page = call(client, "rl_list_runs", "lister", limit=2, cursor=cursor)
            pages += 1
            seen += [run["run_id"] for run in page["runs"]]
            assert page["count"] == len(page["runs"]) <= 2
            assert page["has_more"] is (page["next_cursor"] is not None)
            if not page["has_more"]:
                break
            cursor = page["next_cursor"]
        assert pages == 3 and sorted(seen) == [f"paged{index}" for index in range(5)] and len(set(seen)) == 5
        everything = call(client, "rl_list_runs", "lister")
        assert everything["count"] == 5 and everything["has_more"] is False and everything["next_cursor"] is None
        bad = call(client, "rl_list_runs", "lister", cursor="not a cursor")
        assert bad["code"] == "VALIDATION_ERROR" and bad["argument"] == "cursor"


@pytest.mark.parametrize(
    ("tool", "arguments", "argument"),
    [
        ("rl_select_environment", {"name": 42}, "name"),
        ("rl_check_status", {"run_id": ["x"]}, "run_id"),
        ("rl_check_status", {}, "run_id"),
        ("rl_start_training", {"backend": "gpu"}, "backend"),
        ("rl_list_runs", {"status": 3}, "status"),
        ("rl_list_environments", {"surprise": True}, "surprise"),
    ],
)
def test_wrong_arguments_give_an_error_result_naming_the_argument(
    service: Service, tool: str, arguments: dict, argument: str
) -> None:
    with service.client() as client:
        result = call(client, tool, **arguments)
        assert result["code"] == "VALIDATION_ERROR" and result["argument"] == argument
        assert argument in result["error"]


def test_tool_errors_are_results_and_unknown_tools_are_404(service: Service) -> None:
    with service.client() as client:
        assert call(client, "rl_select_environment", name="nope")["available"]
        missing = call(client, "rl_check_status", run_id="abc123")
        assert missing["code"] == "RUN_NOT_FOUND" and "error" in missing
        assert call(client, "rl_edit_config", field="group_size", value=4)["code"] == "VALIDATION_ERROR"
        mixed = call(client, "rl_start_training", environments=[{"name": "echo", "weight": 2}, {"name": "nope"}])
        assert mixed["code"] == "ENVIRONMENT_NOT_FOUND" and "nope" in mixed["error"], mixed
        unweighted = call(client, "rl_start_training", environments=[{"name": "echo", "weight": 0}])
        assert unweighted["code"] == "VALIDATION_ERROR" and unweighted["argument"].startswith("environments")
        assert client.post("/tools/rl_nope", json={}).status_code == 404
        assert client.post("/tools/rl_list_runs", json=[1, 2]).status_code == 422
        assert client.post("/tools/rl_list_runs", json={}, headers={"X-Tool-Session": "../x"}).status_code == 422


def test_tool_schemas_are_strict_function_calling_schemas(service: Service) -> None:
    with service.client() as client:
        tools = client.get("/tools").json()["tools"]
    names = [t["function"]["name"] for t in tools]
    assert names[:11] == [
        "rl_list_environments",
        "rl_select_environment",
        "rl_get_current_config",
        "rl_edit_config",
        "rl_start_training",
        "rl_check_status",
        "rl_stop_training",
        "rl_resume_training",
        "rl_get_results",
        "rl_list_runs",
        "rl_test_inference",
    ]
    for tool in tools:
        function = tool["function"]
        assert tool["type"] == "function" and function["strict"] is True and function["description"]
        parameters = function["parameters"]
        assert parameters["additionalProperties"] is False
        assert sorted(parameters["required"]) == sorted(parameters["properties"])
    status = next(t for t in tools if t["function"]["name"] == "rl_check_status")
    assert "30 minutes" in status["function"]["description"]
