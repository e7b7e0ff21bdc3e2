"""The environment hook (rlctl/supervisor/envhooks/sitecustomize.py) against the real Atropos API: an environment
started beside its trainer registers once the trainer has, and atroposlib is never told to wait (it would sleep a second
before it asked again) (docs/RUNS.md#process-order). And a stopped environment logs the groups it sent since its last
log, once, to the run's file only."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
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


# An environment process, in miniature: `Base` stands for atroposlib's BaseEnv (what the hook wraps), `Env` for an
# environment that adds its metrics in `wandb_log`. It sends 2 groups and logs them, then sends `after` more and says
# "ready"; then its loop ends ("end"), or it runs until it is stopped ("stop"), or it holds its event loop until it
# is stopped ("blocked": a coroutine in a long call). "W&B" is printed whenever the base's own `wandb_log` (W&B's) runs.
ENVIRONMENT = """
import asyncio, sys, time
from rlctl.supervisor.envhooks import sitecustomize as hook

class Base:
    curr_step = 0
    async def wandb_log(self, metrics=None):
        print("W&B", flush=True)
    async def handle_send_to_api(self, group):
        self.sent = getattr(self, "sent", 0) + 1
    async def env_manager(self):
        for _ in range(2):
            await self.handle_send_to_api({})
        await self.wandb_log()
        self.curr_step = 1
        for _ in range(int(sys.argv[2])):
            await self.handle_send_to_api({})
        print("ready", flush=True)
        if sys.argv[3] == "stop":
            await asyncio.Event().wait()
        if sys.argv[3] == "blocked":
            time.sleep(3600)

class Env(Base):
    async def wandb_log(self, metrics=None):
        await super().wandb_log({**(metrics or {}), "groups/sent": float(self.sent)})

hook._copy_metrics(Base, sys.argv[1])
hook._log_once_more_at_stop(Base)
asyncio.run(Env().env_manager())
"""


@pytest.mark.parametrize(("after", "ending"), [(2, "stop"), (0, "stop"), (2, "end"), (2, "blocked")])
def test_an_environment_logs_the_groups_sent_since_its_last_log_as_it_ends(
    tmp_path: Path, after: int, ending: str
) -> None:
    metrics = tmp_path / "env_metrics.jsonl"
    argv = [sys.executable, "-c", ENVIRONMENT, str(metrics), str(after), ending]
    environment = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert environment.stdout is not None
        assert [environment.stdout.readline() for _ in range(2)] == ["W&B\n", "ready\n"]
        if ending != "end":
            environment.send_signal(signal.SIGTERM)
        rest = environment.communicate(timeout=REQUEST_TIMEOUT)[0]
    finally:
        environment.kill()
        environment.wait()
    # stopped, it dies of the SIGTERM, as without the hook (a held loop too: FLUSH_TIMEOUT_S later, without its log)
    assert environment.returncode == (0 if ending == "end" else -signal.SIGTERM)
    assert rest == ""  # the last log does not call W&B
    logged = [json.loads(line) for line in metrics.read_text().splitlines()]
    # nothing sent since the last log, or no turn of the loop to log it: nothing to add
    expected = [(0, 2.0), (1, 4.0)] if after and ending != "blocked" else [(0, 2.0)]
    assert [(record["step"], record["metrics"]["groups/sent"]) for record in logged] == expected
