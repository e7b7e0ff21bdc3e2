"""The environment hook (rlctl/supervisor/envhooks/sitecustomize.py) against the real Atropos API: an environment
started beside its trainer registers once the trainer has, and atroposlib is never told to wait (it would sleep a second
before it asked again) (docs/RUNS.md#process-order)."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from atroposlib.envs.base import BaseEnv

from rlctl.supervisor.envhooks import sitecustomize as hook
from rlctl.trainer.atropos import AtroposClient, Registration
from tests.support.live import free_port
from tests.support.waiting import REQUEST_TIMEOUT, wait_until
from tests.trainer.pipeline import child_environment, processes, wait_http


class Environment:
    """What atroposlib's own `register_env` and `_register_env` read and write of an environment."""

    register_env = BaseEnv.register_env
    _register_env = BaseEnv._register_env

    def __init__(self, api_url: str) -> None:
        self.config = SimpleNamespace(
            rollout_server_url=api_url,
            max_token_length=512,
            wandb_name="hooked",
            inference_weight=1.0,
            min_batch_allocation=None,
            group_size=4,
            total_steps=10,
        )
        self.attempts: list[str] = []

    async def _counted_register_env(self) -> Any:
        answer = await BaseEnv._register_env(self)
        self.attempts.append(answer["status"])
        return answer

    def load_checkpoint(self) -> None:  # atroposlib calls it when resuming past step 0
        raise AssertionError("nothing to resume")


def test_the_environment_registers_at_its_first_attempt_once_the_trainer_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLCTL_ENV_API_WAIT_S", "120")
    monkeypatch.setattr(Environment, "_register_env", Environment._counted_register_env)
    looks: list[bool] = []
    trainer_registered = hook.trainer_registered

    def looked(url: str) -> bool:
        looks.append(registered := trainer_registered(url))
        return registered

    monkeypatch.setattr(hook, "trainer_registered", looked)
    hook._wait_for_the_api(Environment)  # as the hook wraps BaseEnv in an environment process
    answered: list[str] = []  # what atroposlib's own loop is answered, after the hook's retries
    hooked_attempt = Environment._register_env

    async def answered_attempt(self: Environment) -> Any:
        answer = await hooked_attempt(self)
        answered.append(answer["status"])
        return answer

    monkeypatch.setattr(Environment, "_register_env", answered_attempt)

    port = free_port()
    api_url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "atroposlib.cli.run_api", "--host", "127.0.0.1", "--port", str(port)]
    with processes() as start:
        api = start("api", argv, tmp_path / "api.log", child_environment(tmp_path))
        # Up first: the hook's look reads an API not yet listening as "no trainer" too, and the looks counted below
        # are to be answers of the API.
        wait_http(f"{api_url}/info", api, timeout_s=120)
        environment = Environment(api_url)
        # A daemon: in a failed test, a registration still asking ends with its connection error once the API stops.
        registering = threading.Thread(target=lambda: asyncio.run(environment.register_env()), daemon=True)
        registering.start()
        wait_until(lambda: looks.count(False) >= 3, timeout=120, message="the hook asks whether a trainer came")
        with httpx.Client(base_url=api_url, timeout=REQUEST_TIMEOUT) as client:
            assert client.get("/info").json()["batch_size"] == -1, "the API answers, and no trainer is there"
        assert environment.attempts == [], "no registration is tried before the trainer's"

        trainer = AtroposClient(api_url)
        trainer.register(Registration("group", "project", 8, 512, str(tmp_path), 10, 0, 10))
        # The moment between the trainer's registration and its first batch request, held open: the environment,
        # seeing the trainer, is told to wait, and the hook asks again.
        wait_until(lambda: len(environment.attempts) >= 2, timeout=60, message="attempts told to wait")
        assert trainer.get_batch() is None  # the trainer's first poll, which lets environments in
        trainer.close()
        wait_until(lambda: not registering.is_alive(), timeout=60, message="the environment registers")
    assert set(environment.attempts[:-1]) == {"wait for trainer to start"} and environment.attempts[-1] == "success"
    assert answered == ["success"], "atroposlib was never told to wait, so it never slept"
    assert environment.env_id == 0 and looks[-1] is True
