"""A tool environment scored by the judge (docs/TOOL_ENVIRONMENTS.md#judge): with `judge_rubric`, a task's group of
episodes goes to the service's judge as one group, whole conversations (the policy's tool calls and the tools'
results included), and its score times `judge_weight` is added to the environment's own rewards; a group the judge
cannot score is left out, never 0.

The judge model is a paid remote service this machine cannot reach: the loopback chat server of the dataset tests
(the real protocol over real HTTP, the real `openai` client) stands in for it and scores by position (the k-th of n
trajectories gets (k - 1) / (n - 1)). The environment is the shipped `tool_lookup`, built from its file as the
evaluation child builds it, with the tiny model's tokenizer; its episodes are played by a scripted policy.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
from collections.abc import Iterator
from typing import Any

import pytest

from environments.tool_lookup import lookup_task
from rlctl.environment_kit.evaluation import load_tool_env
from rlctl.judging.client import JUDGE_KEY_ENV
from rlctl.service.settings import BUILTIN_ENVIRONMENTS_DIR
from tests.datasets_api.chat_server import ChatServer, chat_server
from tests.environments.test_tool_episodes import CALL, scripted
from tests.support.tiny_model import session_tiny_model

RUBRIC = "Prefer the agent that looked the code up."
KEY = "sk-tool-judge-5521"
TRAJECTORY = re.compile(r'<trajectory id="(\d+)">')


def by_position(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    ids = TRAJECTORY.findall(body["messages"][1]["content"])
    last = max(len(ids) - 1, 1)
    scores = [{"trajectory_id": n, "reason": "by position", "score": (int(n) - 1) / last} for n in ids]
    return 200, {"content": json.dumps({"scores": scores})}


def down(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return 503, {"error": {"message": "judge overloaded"}}


@pytest.fixture
def judge() -> Iterator[ChatServer]:
    with chat_server(by_position) as server:
        yield server


def judged_env(judge_url: str | None, monkeypatch: pytest.MonkeyPatch, weight: float = 2.0) -> Any:
    monkeypatch.setenv(JUDGE_KEY_ENV, KEY)
    options = {"base_url": judge_url, "model": "rule-judge", "max_retries": 0, "timeout_s": 30}
    config = {
        "tokenizer_name": str(session_tiny_model()),
        "max_token_length": 2048,
        "judge_rubric": RUBRIC,
        "judge_weight": weight,
        "judge": options if judge_url else None,
    }
    file = BUILTIN_ENVIRONMENTS_DIR / "tool_lookup.py"
    return load_tool_env({"tool_env": {"file": str(file), "class_name": "ToolLookupEnv", "config": config}})


def episodes_of(env: Any, task: Any, scripts: list[list[str]]) -> list[Any]:
    async def play() -> list[Any]:
        played = []
        for replies in scripts:
            sample, _ = scripted(env.template, replies)
            played.append(await env.episode(task, 1.0, sample=sample))
        return played

    return asyncio.run(play())


def test_a_groups_episodes_are_judged_whole_and_the_judges_score_is_added_to_the_rewards(
    judge: ChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = judged_env(judge.base_url, monkeypatch)
    asyncio.run(env.setup())
    assert JUDGE_KEY_ENV not in os.environ  # taken out before anything else can read it there
    task = lookup_task(random.Random(0), "code", 3)
    value = task.data["value"]
    # the first looks the code up and answers it (own rewards 1.0), the second guesses a wrong answer (0.0)
    episodes = episodes_of(env, task, [[CALL, value], ["000" if value != "000" else "111"]])
    own = [env.score(task, episode) for episode in episodes]
    scores = asyncio.run(env.score_group(task, episodes))

    assert own[0] > own[1]
    # by position: the first 0, the second 1, times judge_weight 2
    assert scores == pytest.approx([own[0] + 0.0, own[1] + 2.0])
    (request,) = judge.requests
    assert RUBRIC in request["messages"][0]["content"] and request["model"] == "rule-judge"
    shown = request["messages"][1]["content"]
    assert len(TRAJECTORY.findall(shown)) == 2
    assert "[gpt]" in shown and '"name": "lookup"' in shown  # the policy's call, as it wrote it
    assert f"[tool] {value}" in shown  # the tool's result
    assert judge.authorizations == [f"Bearer {KEY}"]
    # counted as the environment's running totals
    metrics = env._judge.counters.run_metrics()
    assert metrics["judge/calls"] == 1 and metrics["judge/failed_groups"] == 0

    # the same group again is answered from the cache: no second request
    assert asyncio.run(env.score_group(task, episodes)) == pytest.approx(scores)
    assert len(judge.requests) == 1


def test_a_group_the_judge_cannot_score_is_left_out_and_a_run_without_the_judge_fails_at_its_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with chat_server(down) as failing:
        env = judged_env(failing.base_url, monkeypatch)
        task = lookup_task(random.Random(1), "code", 3)
        episodes = episodes_of(env, task, [[CALL, task.data["value"]], ["0"]])
        assert asyncio.run(env.score_group(task, episodes)) is None  # unscored, never 0
        assert env.judge.counters.run_metrics()["judge/failed_groups"] == 1

    without = judged_env(None, monkeypatch)
    with pytest.raises(ValueError, match="needs the service's judge"):
        asyncio.run(without.setup())
    # without a rubric the environment's own rewards alone score, and no judge is asked
    plain = judged_env(None, monkeypatch)
    plain.config.judge_rubric = None
    asyncio.run(plain.setup())
    task = lookup_task(random.Random(2), "code", 3)
    episodes = episodes_of(plain, task, [[CALL, task.data["value"]]])
    assert asyncio.run(plain.score_group(task, episodes)) == [plain.score(task, episodes[0])]
