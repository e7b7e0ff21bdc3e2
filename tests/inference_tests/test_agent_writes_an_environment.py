"""The seed workflow through rlctl alone: a scripted tool-calling agent reads `echo`, writes a variant with
another reward, tests it against the tiny model's inference server, and trains it offline until its reward
rises. All real: the service, the validation child, the inference-test child, and the run's three processes."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import httpx

from rlctl.service.auth.scopes import Scope
from rlctl.service.auth.tokens import TokenStore
from rlctl.service.settings import Settings
from tests.inference_tests.conftest import SERVED_MODELS
from tests.support.live import live_service
from tests.support.waiting import wait_until

TOTAL_STEPS = 32
OLD_SCORE = "return score_reply(reply, target, self.config.reply_tokens, self.config.digit_weight)"
# The variant's reward: the share of digits in the reply alone (echo mixes in the digits echoed in place).
NEW_SCORE = "return score_reply(reply, target, self.config.reply_tokens, 1.0)"


class Agent:
    """What an LLM agent does with tool calls, scripted: POST /tools/{name} in its own tool session."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def __call__(self, tool: str, **arguments: Any) -> dict[str, Any]:
        response = self.client.post(f"/tools/{tool}", json=arguments, headers={"X-Tool-Session": "author"})
        assert response.status_code == 200, response.text
        return response.json()


def test_an_agent_writes_tests_and_trains_a_variant_of_echo(
    inference_settings: Callable[..., Settings], endpoint: str
) -> None:
    settings = inference_settings(local_total_steps=TOTAL_STEPS, local_save_checkpoint_interval=TOTAL_STEPS)
    token = TokenStore(settings.tokens_path).create("author-agent", (Scope.ADMIN,))
    with live_service(settings) as live, live.client(token=token) as client:
        agent = Agent(client)
        tools = {t["function"]["name"] for t in client.get("/tools").json()["tools"]}
        assert {"rl_read_environment", "rl_write_environment"} <= tools

        echo = agent("rl_read_environment", name="echo")
        assert OLD_SCORE in echo["source"]
        source = echo["source"].replace('name = "echo"', 'name = "digits"').replace(OLD_SCORE, NEW_SCORE)
        written = agent("rl_write_environment", name="digits", source=source)
        assert written["validation"]["ok"] and written["version"] == 1, written

        assert agent("rl_select_environment", name="digits")["environment"] == "digits"
        started = agent("rl_test_inference", num_steps=1, group_size=2, models=[SERVED_MODELS[0]], base_url=endpoint)
        tested = wait_until(
            lambda: (r := agent("rl_get_inference_test", test_id=started["test_id"]))["status"] == "succeeded" and r,
            timeout=300,
            message="inference test of the variant",
        )
        assert tested["environment"] == "digits" and tested["summary"]["environment_working"] is True

        run = agent("rl_start_training", backend="local")
        assert run["environment"] == "digits", run
        run_id = run["run_id"]

        def ended() -> dict[str, Any] | None:
            record = client.get(f"/runs/{run_id}").json()
            return record if record["status"] in ("completed", "failed", "stopped") else None

        record = wait_until(ended, timeout=900, interval=1.0, message="the variant's training run")
        assert record["status"] == "completed", record.get("failure")
        assert record["created_by"] == "author-agent"
        assert record["environment_hash"] == hashlib.sha256(source.encode()).hexdigest()
        points = client.get(f"/runs/{run_id}/metrics", params={"name": "reward/mean"}).json()["metrics"]
        rewards = [value for _step, value in points["reward/mean"]]
        assert len(rewards) == TOTAL_STEPS
        quarter = TOTAL_STEPS // 4
        first, last = sum(rewards[:quarter]) / quarter, sum(rewards[-quarter:]) / quarter
        print(f"digits variant: first-quarter mean reward {first:.3f}, last-quarter {last:.3f}")
        assert last >= first + 0.05, rewards
