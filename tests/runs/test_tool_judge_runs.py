"""A tool environment's run scored by the service's judge (docs/TOOL_ENVIRONMENTS.md#judge): a run that sets the
environment's `judge_rubric` gets the service's judge in its config (never the key, which reaches the environment
process in its environment only), each task's group of episodes is judged whole and the judge's score is added to
the environment's own rewards; an evaluation of such a run judges each model's episodes of a task as one group in
the service. Refused without a judge, and for an environment not shipped with rlctl.

The judge model is a paid remote service this machine cannot reach: the loopback chat server of the dataset tests
(the real protocol over real HTTP) stands in for it, scoring the k-th of a group's n trajectories (k - 1) / (n - 1).
Everything else is real: the service in process, run-api, the trainer on the primed tiny model, `tool_lookup`'s
environment process, the evaluation's sampler child.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlctl.judging.client import JUDGE_KEY_ENV
from rlctl.service.evaluations.schemas import EvaluationModelResult
from rlctl.service.runs.launch import environment_environment
from rlctl.service.runs.paths import RunPaths
from rlctl.service.runs.wandb import WandbMode
from rlctl.service.settings import Settings
from tests.datasets_api.chat_server import chat_server
from tests.runs.conftest import wait_for_status
from tests.runs.test_dataset_judge_runs import JUDGE_KEY, judged_settings
from tests.runs.test_dataset_runs import error_of, start
from tests.runs.test_evaluation_judge import evaluable_run
from tests.runs.test_tool_evaluations import evaluated, primed_model
from tests.support.live import in_process_service

RUBRIC = "Prefer the agent whose lookup found the code."
TRAJECTORY = re.compile(r'<trajectory id="(\d+)">')
OUTAGE_REQUESTS = 1  # the first request with the run's rubric fails: a group left out, counted
GROUP_SIZE, BATCH_SIZE = 4, 8


class PositionJudge:
    """Scores by position; the first OUTAGE_REQUESTS requests answer 503."""

    def __init__(self, outage: int = 0) -> None:
        self.outage = outage

    def __call__(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.outage > 0:
            self.outage -= 1
            return 503, {"error": {"message": "judge overloaded"}}
        ids = TRAJECTORY.findall(body["messages"][1]["content"])
        last = max(len(ids) - 1, 1)
        scores = [{"trajectory_id": n, "reason": "by position", "score": (int(n) - 1) / last} for n in ids]
        return 200, {"content": json.dumps({"scores": scores})}


def test_a_judged_tool_run_is_refused_without_a_judge_or_for_a_written_environment(
    run_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    written = tmp_path / "written_environments"
    written.mkdir()
    (written / "written_tools.py").write_text(
        "from rlctl.environment_kit.tool_env import ToolEnv\n\n\n"
        "class WrittenTools(ToolEnv):\n    name = 'written_tools'\n"
    )
    judged = {"judge_rubric": RUBRIC}
    with in_process_service(run_settings(environment_dirs=str(written))) as live, live.client() as client:
        missing = start(client, environment="tool_lookup", config=judged)
        assert missing.status_code == 409 and error_of(missing)["code"] == "JUDGE_NOT_CONFIGURED", missing.text
        assert error_of(missing)["details"]["field"] == "judge_rubric"
        assert client.get("/runs").json()["runs"] == []

    settings = judged_settings(run_settings, "http://127.0.0.1:9/v1", environment_dirs=str(written))
    with in_process_service(settings) as live, live.client() as client:
        beside = start(client, environment="written_tools", config=judged)
        assert beside.status_code == 422, beside.text
        assert error_of(beside)["details"]["reason"] == "judge_beside_written_environment"
        locked = start(client, environment="tool_lookup", config={"judge": {"base_url": "http://elsewhere/v1"}})
        assert locked.status_code == 422 and error_of(locked)["details"]["field"] == "judge", locked.text
        assert client.get("/runs").json()["runs"] == []


@pytest.mark.e2e
def test_a_tool_run_trains_on_the_judges_scores_of_whole_episodes_and_its_evaluation_is_judged_too(
    run_settings: Callable[..., Settings],
) -> None:
    model = primed_model()
    judge = PositionJudge(outage=OUTAGE_REQUESTS)
    with chat_server(judge) as server:
        settings = judged_settings(
            run_settings,
            server.base_url,
            local_base_model=str(model),
            local_max_token_length=1024,
            local_max_token_trainer_length=1536,
        )
        config = {
            "group_size": GROUP_SIZE,
            "batch_size": BATCH_SIZE,
            "max_turns": 3,
            "eval_items": 2,
            "judge_rubric": RUBRIC,
            "judge_weight": 0.5,
        }
        with in_process_service(settings) as live, live.client() as client:
            response = start(client, environment="tool_lookup", config=config)
            assert response.status_code == 201, response.text
            created = response.json()
            merged_text = (settings.data_path / created["config_path"]).read_text()
            merged = yaml.safe_load(merged_text)
            assert merged["env"]["judge"]["base_url"] == server.base_url
            assert merged["env"]["judge_rubric"] == RUBRIC
            # the key reaches the environment process, in its environment only
            paths = RunPaths(settings.data_path, created["id"])
            assert environment_environment(settings, paths, WandbMode.DISABLED)[JUDGE_KEY_ENV] == JUDGE_KEY

            final = wait_for_status(client, created["id"], {"completed"}, timeout=300)
            series = client.get(f"/runs/{created['id']}/metrics").json()["metrics"]
            run_requests = list(server.requests)
            body = {"run_id": created["id"], "max_prompts": 2, "samples_per_prompt": 2, "temperature": 1.0}
            judge.outage = 1  # the evaluation's first judged group fails
            done = evaluated(client, body)
            evaluation_requests = server.requests[len(run_requests) :]
            texts = [
                response.text,
                json.dumps(final),
                json.dumps(done),
                *(client.get(f"/runs/{created['id']}/logs/{role}").text for role in ("api", "trainer", "env")),
            ]
        authorizations = list(server.authorizations)

    assert final["last_step"] == 6
    # every trained group was judged whole: the policy's calls and the tool's results are what the judge read
    groups = [r for r in run_requests if len(TRAJECTORY.findall(r["messages"][1]["content"])) == GROUP_SIZE]
    assert len(groups) >= 6 * BATCH_SIZE // GROUP_SIZE + OUTAGE_REQUESTS
    assert all(RUBRIC in r["messages"][0]["content"] for r in run_requests)
    shown = "\n".join(r["messages"][1]["content"] for r in groups)
    assert "[tool] " in shown and '"name": "lookup"' in shown
    # the judge's share of each trained group's mean: 0.5 × the mean position score 0.5; its own rewards lie in
    # [0, 1], so the trained mean lies in [0.25, 1.25], and each group's scores differ (the judge ranks them)
    rewards = [value for _, value in series["reward/mean"]]
    assert rewards and all(0.25 - 1e-6 <= value <= 1.25 + 1e-6 for value in rewards), rewards
    assert series["train/unscored_groups"][-1][1] == OUTAGE_REQUESTS
    assert series["judge/failed_groups"][-1][1] == OUTAGE_REQUESTS
    # running totals as last logged (the environment goes on judging until the run ends): no more than were asked
    assert OUTAGE_REQUESTS < series["judge/calls"][-1][1] <= len(run_requests)

    # the evaluation judged each model's episodes of a task as one group, in the service
    assert done["status"] == "succeeded", done["error"]
    assert done["judge"]["model"] == settings.judge_model
    assert (done["judge"]["groups"], done["judge"]["failed_groups"]) == (2 * 2, 1)
    assert all(len(TRAJECTORY.findall(r["messages"][1]["content"])) == 2 for r in evaluation_requests)
    results = [EvaluationModelResult.model_validate(entry) for entry in done["models"]]
    # the group the judge could not score (judged concurrently: either model's) is left out and listed, never 0
    assert sum(result.unscored_prompts for result in results) == 1
    assert sorted(name for prompt in done["prompts"] for name in prompt["unscored"]) == [
        result.name for result in results if result.unscored_prompts
    ]
    for result in results:
        assert result.samples == 2 * (2 - result.unscored_prompts)  # the scored tasks' episodes
        assert result.tool_calls_per_episode is not None
        assert result.mean_reward is not None and 0.25 - 1e-6 <= result.mean_reward <= 1.25 + 1e-6
    # the key went to the judge's host, and nowhere else
    assert set(authorizations) == {f"Bearer {JUDGE_KEY}"}
    assert JUDGE_KEY not in merged_text
    assert all(JUDGE_KEY.encode() not in p.read_bytes() for p in settings.data_path.rglob("*") if p.is_file())
    assert all(JUDGE_KEY not in text for text in texts)


def test_an_evaluation_of_a_judged_tool_run_needs_the_judge(run_settings: Callable[..., Settings]) -> None:
    settings = run_settings()
    config = {"env": {"judge_rubric": RUBRIC}}
    run_id = evaluable_run(
        settings, [{"step": 3, "weights": "unused"}], prompts=[], config=config, environment="tool_lookup"
    )
    with in_process_service(settings) as live, live.client() as client:
        refused = client.post("/evaluations", json={"run_id": run_id})
    assert refused.status_code == 409 and error_of(refused)["code"] == "JUDGE_NOT_CONFIGURED", refused.text
