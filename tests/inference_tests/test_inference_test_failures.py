"""What goes wrong, and how it is reported: refused before anything runs (no key, no tokenizer, bad input), one
model failing alone (time-out, malformed answers), cancel, a service restart, and secrets printed by a child."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import textwrap
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from rlctl.service.inference_tests import jobs
from rlctl.service.settings import Settings
from tests.inference_tests.conftest import PLANTED_KEY, SERVED_MODELS
from tests.inference_tests.test_inference_tests_e2e import stored_jobs, wait_ended
from tests.support.endpoints import GARBLED_MODEL, STALLED_MODEL
from tests.support.live import in_process_service
from tests.support.waiting import scaled, wait_until


def test_default_endpoint_without_openrouter_key_is_refused_before_anything_runs(
    inference_settings: Callable[..., Settings],
) -> None:
    with in_process_service(inference_settings()) as live, live.client() as client:
        refused = client.post("/inference-tests", json={"environment": "echo"})
        assert refused.status_code == 409
        error = refused.json()["error"]
        assert error["code"] == "INFERENCE_KEY_MISSING" and error["details"]["missing"] == "OPENROUTER_API_KEY"
        assert "OPENROUTER_API_KEY" in error["message"]
        assert client.get("/inference-tests").json()["count"] == 0


def test_unloadable_tokenizer_is_refused_before_anything_runs(
    inference_settings: Callable[..., Settings], endpoint: str, tmp_path: Path
) -> None:
    missing = tmp_path / "no-model-here"
    with in_process_service(inference_settings(tokenizer_name=str(missing))) as live, live.client() as client:
        refused = client.post("/inference-tests", json={"environment": "echo", "base_url": endpoint})
        assert refused.status_code == 409
        error = refused.json()["error"]
        assert error["code"] == "TOKENIZER_UNAVAILABLE" and error["details"]["tokenizer_name"] == str(missing)
        assert "does not exist" in error["message"] and "RLCTL_TOKENIZER_NAME" in error["message"]
        assert client.get("/inference-tests").json()["count"] == 0


def test_invalid_requests_are_refused_with_their_own_codes(
    inference_settings: Callable[..., Settings], endpoint: str
) -> None:
    cases = [
        ({"environment": "no-such-env"}, 404, "ENVIRONMENT_NOT_FOUND"),
        ({"environment": "echo", "config": {"group_size": 4}}, 422, "FIELD_LOCKED"),
        ({"environment": "echo", "config": {"tokenizer_name": "other"}}, 422, "FIELD_LOCKED"),
        ({"environment": "echo", "config": {"no_such_field": 1}}, 422, "UNKNOWN_FIELD"),
        ({"environment": "echo", "config": {"reply_tokens": "many"}}, 422, "VALIDATION_ERROR"),
        ({"environment": "echo", "models": ["a/b", "a/b"]}, 422, "VALIDATION_ERROR"),
        ({"environment": "echo", "models": []}, 422, "VALIDATION_ERROR"),
        ({"environment": "echo", "base_url": "ftp://example.com/v1"}, 422, "VALIDATION_ERROR"),
        ({"environment": "echo", "api_key": "sk-from-the-body"}, 422, "VALIDATION_ERROR"),
    ]
    with in_process_service(inference_settings()) as live, live.client() as client:
        for body, status, code in cases:
            answer = client.post("/inference-tests", json={"base_url": endpoint, **body})
            assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), body
        missing = client.get("/inference-tests/0123456789abcdef")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "INFERENCE_TEST_NOT_FOUND"
        assert client.get("/inference-tests").json()["count"] == 0


@pytest.mark.e2e
def test_a_hanging_model_times_out_and_a_malformed_one_fails_while_the_other_completes(
    inference_settings: Callable[..., Settings], faulty_endpoint: str
) -> None:
    models = [SERVED_MODELS[0], STALLED_MODEL, GARBLED_MODEL]
    # One time-out for all three: long enough for the healthy model's whole run (a child forked from the fork
    # server, then six completions of the tiny model) on a loaded 2-core machine, which the stalled one waits out.
    timeout_s = round(scaled(20))
    with in_process_service(inference_settings()) as live, live.client() as client:
        body = {
            "environment": "echo",
            "num_steps": 2,
            "group_size": 3,
            "models": models,
            "base_url": faulty_endpoint,
            "timeout_s": timeout_s,
        }
        created = client.post("/inference-tests", json=body)
        assert created.status_code == 202, created.text
        test = wait_ended(client, created.json()["id"])
    assert test["status"] == "succeeded", test["error"]
    by_model = {r["model"]: r for r in test["result"]["models_tested"]}
    assert by_model[SERVED_MODELS[0]]["status"] == "succeeded" and by_model[SERVED_MODELS[0]]["steps_tested"] == 2
    assert by_model[STALLED_MODEL]["status"] == "failed"
    assert by_model[STALLED_MODEL]["error"] == f"timed out after {timeout_s} s (0 of 2 steps done)"
    assert by_model[GARBLED_MODEL]["status"] == "failed"
    assert "not a chat completion" in by_model[GARBLED_MODEL]["error"]
    summary = test["result"]["summary"]
    assert summary["models_succeeded"] == 1 and summary["best_model"] == SERVED_MODELS[0]
    assert test["progress"] == {"done": 6, "total": 6}


@pytest.mark.e2e
def test_cancel_and_restart_stop_the_children(
    inference_settings: Callable[..., Settings], faulty_endpoint: str
) -> None:
    settings = inference_settings()
    body = {
        "environment": "echo",
        "num_steps": 1,
        "group_size": 2,
        "models": [STALLED_MODEL],
        "base_url": faulty_endpoint,
    }
    with in_process_service(settings) as live, live.client() as client:
        cancelled = client.post("/inference-tests", json=body).json()["id"]
        wait_until(lambda: child_processes(settings), timeout=60, message="the model's child process")
        assert client.post(f"/jobs/{cancelled}/cancel").status_code == 200
        assert wait_ended(client, cancelled)["status"] == "cancelled"
        assert not child_processes(settings)

        interrupted = client.post("/inference-tests", json=body).json()["id"]
        wait_until(lambda: child_processes(settings), timeout=60, message="the model's child process")
    assert not child_processes(settings), "the service stopped but left its child running"
    with in_process_service(settings) as live, live.client() as client:
        test = client.get(f"/inference-tests/{interrupted}").json()
    assert test["status"] == "failed" and "restarted" in test["error"]


@pytest.mark.e2e
def test_secrets_printed_or_raised_by_the_environment_are_scrubbed(
    inference_settings: Callable[..., Settings], endpoint: str, tmp_path: Path
) -> None:
    extra = tmp_path / "extra-environments"
    extra.mkdir()
    (extra / "leaky.py").write_text(LEAKY_ENVIRONMENT)
    settings = inference_settings(environment_dirs=str(extra))
    with in_process_service(settings) as live, live.client() as client:
        body = {
            "environment": "leaky",
            "num_steps": 1,
            "group_size": 2,
            "models": [SERVED_MODELS[0]],
            "base_url": endpoint,
        }
        created = client.post("/inference-tests", json=body)
        assert created.status_code == 202, created.text
        test = wait_ended(client, created.json()["id"])
    outcome = test["result"]["models_tested"][0]
    assert outcome["status"] == "failed" and "refusing to run with key ***" in outcome["error"]
    log = (settings.data_path / outcome["files"]["log"]).read_text()
    assert "the key is ***" in log and PLANTED_KEY not in log
    assert PLANTED_KEY not in json.dumps(test) and PLANTED_KEY not in stored_jobs(settings)


@pytest.mark.e2e
def test_a_process_that_keeps_the_output_open_does_not_hold_up_the_test(
    inference_settings: Callable[..., Settings], endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The child's output is a pipe: a process outside the child's group that keeps its writing end (here one in a
    # session of its own) keeps it open after the group is gone. Waiting for its end would wait for that process.
    monkeypatch.setattr(jobs, "OUTPUT_END_WAIT_S", 1.0)
    extra = tmp_path / "extra-environments"
    extra.mkdir()
    holder_pid = tmp_path / "holder.pid"
    (extra / "holds_output.py").write_text(holds_output_environment(holder_pid))
    settings = inference_settings(environment_dirs=str(extra))
    try:
        with in_process_service(settings) as live, live.client() as client:
            body = {"environment": "holds_output", "num_steps": 1, "group_size": 2, "models": [SERVED_MODELS[0]]}
            created = client.post("/inference-tests", json={**body, "base_url": endpoint})
            assert created.status_code == 202, created.text
            test = wait_ended(client, created.json()["id"])
            assert holder_pid.exists(), json.dumps(test)[:3000]
            holder = int(holder_pid.read_text())
            assert psutil.pid_exists(holder), "the job ended while the process holding its output still ran"
        outcome = test["result"]["models_tested"][0]
        assert outcome["status"] == "failed" and "leaving a process behind" in outcome["error"]
    finally:
        if holder_pid.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(holder_pid.read_text()), signal.SIGKILL)


def child_processes(settings: Settings) -> list[int]:
    marker = str(settings.data_path)
    pids = []
    for process in psutil.process_iter(["cmdline", "status"]):
        command = " ".join(process.info.get("cmdline") or [])
        if (
            "rlctl.service.inference_tests.child" in command
            and marker in command
            and process.info["status"] != "zombie"
        ):
            pids.append(process.pid)
    return pids


def environment_failing_in_setup(name: str, imports: str, setup: str) -> str:
    """The source of an environment `name` whose `setup` runs `setup` (lines of code) and fails: what it does before
    the failure is what a test is about."""
    body = textwrap.indent(textwrap.dedent(setup).strip(), " " * 8)
    return textwrap.dedent(
        f'''
        """An environment that fails in its setup."""

        {imports}

        from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig


        class FailingEnv(BaseEnv):
            name = "{name}"

            @classmethod
            def config_init(cls):
                config = BaseEnvConfig(tokenizer_name="unused", group_size=2, use_wandb=False, wandb_name="{name}")
                server = APIServerConfig(model_name="x", base_url="http://127.0.0.1:1/v1", server_type="openai")
                return config, [server]

            async def setup(self):
        SETUP

            async def get_next_item(self):
                return None

            async def collect_trajectories(self, item):
                return None, []

            async def evaluate(self, *args, **kwargs):
                return None


        if __name__ == "__main__":
            FailingEnv.cli()
        '''
    ).replace("\nSETUP\n", f"\n{body}\n")  # the line at the margin of the dedented text


# Prints the endpoint's key, then fails with it in the message.
LEAKY_ENVIRONMENT = environment_failing_in_setup(
    "leaky",
    "import os",
    """
    key = os.environ["OPENAI_API_KEY"]
    print("the key is", key, flush=True)
    raise RuntimeError(f"refusing to run with key {key}")
    """,
)


def holds_output_environment(pid_file: Path) -> str:
    """Starts a process in a session of its own that keeps stdout open (its pid in `pid_file`), then fails."""
    return environment_failing_in_setup(
        "holds_output",
        "import subprocess, sys",
        f"""
        holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        open({str(pid_file)!r}, "w").write(str(holder.pid))
        raise RuntimeError("leaving a process behind")
        """,
    )
