"""rl_test_inference and rl_get_inference_test: the agent's way to the same inference tests."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from rlctl.service.settings import Settings
from tests.inference_tests.conftest import SERVED_MODELS
from tests.ops.cli import rlctl
from tests.support.live import in_process_service, live_service
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


def test_an_agent_tests_the_selected_environment(inference_settings: Callable[..., Settings], endpoint: str) -> None:
    with in_process_service(inference_settings()) as live, live.client() as client:

        def call(tool: str, **arguments: object) -> dict:
            response = client.post(f"/tools/{tool}", json=arguments, headers={"X-Tool-Session": "tester"})
            assert response.status_code == 200, response.text
            return response.json()

        assert "no environment selected" in call("rl_test_inference", num_steps=1)["error"]
        call("rl_select_environment", name="echo")
        call("rl_edit_config", field="group_size", value=4)  # training's; the test sets its own group size
        started = call("rl_test_inference", num_steps=1, group_size=2, models=list(SERVED_MODELS), base_url=endpoint)
        assert started["environment"] == "echo" and started["models"] == list(SERVED_MODELS)
        assert started["group_size"] == 2 and "rl_get_inference_test" in started["message"]
        done = wait_until(
            lambda: (r := call("rl_get_inference_test", test_id=started["test_id"]))["status"] == "succeeded" and r,
            timeout=240,
            message="inference test finished",
        )
        assert done["summary"]["models_tested"] == 2 and done["summary"]["environment_working"] is True
        assert {m["model"] for m in done["models_tested"]} == set(SERVED_MODELS)
        assert call("rl_get_inference_test", test_id="nope")["code"] == "INFERENCE_TEST_NOT_FOUND"


def test_the_cli_runs_an_inference_test_and_follows_it(
    inference_settings: Callable[..., Settings], endpoint: str
) -> None:
    with live_service(inference_settings()) as live:  # the CLI is another process: it needs a port
        result = rlctl(
            live.base_url,
            "inference-test",
            "echo",
            "--steps", "1",
            "--group-size", "2",
            "--model", SERVED_MODELS[0],
            "--model", "tiny/not-served",
            "--base-url", endpoint,
            "--json",
            timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        job = json.loads(result.stdout)
        assert job["status"] == "succeeded"
        summary = job["result"]["summary"]
        assert summary["models_tested"] == 2 and summary["models_succeeded"] == 1
        assert summary["best_model"] == SERVED_MODELS[0]
