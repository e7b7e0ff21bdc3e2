"""Online dataset runs: the dataset's prompts answered by the policy, whose completions of a prompt go to the judge
as a group; its scores are what the trainer trains on, a judge outage leaves groups unscored (counted, never 0),
and the judge's key reaches the judge's host only (docs/RUNS.md#the-judge-online).

The judge model is a paid remote service this machine cannot reach: the loopback chat server of the dataset tests
(tests/datasets_api/chat_server.py, the real protocol over real HTTP) stands in for it and scores by a rule: the
k-th of a group's n trajectories gets (k - 1) / (n - 1), so every group's mean is known whatever the tiny random
policy writes. The run itself is real: run-api, the trainer on the tiny model and the dataset_online environment.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlctl.service.settings import Settings
from tests.datasets_api.chat_server import chat_server
from tests.runs.conftest import wait_for_status
from tests.runs.test_dataset_runs import echo_records, error_of, start, upload_records
from tests.support.live import in_process_service

JUDGE_KEY = "sk-online-judge-7741"
RUBRIC = "Prefer the later trajectories."  # the rule judge's rule, said to it
TRAJECTORY = re.compile(r'<trajectory id="(\d+)">', re.DOTALL)
OUTAGE_REQUESTS = 2  # the first judge-rubric requests fail: an outage at the start of the run


class RuleJudge:
    """Scores by position; the first OUTAGE_REQUESTS requests with the run's rubric answer 503."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.failed = 0

    def __call__(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        system, user = body["messages"][0]["content"], body["messages"][1]["content"]
        if RUBRIC in system:
            with self.lock:
                if self.failed < OUTAGE_REQUESTS:
                    self.failed += 1
                    return 503, {"error": {"message": "judge overloaded"}}
        ids = TRAJECTORY.findall(user)
        last = max(len(ids) - 1, 1)
        scores = [{"trajectory_id": n, "reason": "by position", "score": (int(n) - 1) / last} for n in ids]
        return 200, {"content": json.dumps({"scores": scores})}


def judged_settings(make: Callable[..., Settings], base_url: str, **extra: Any) -> Settings:
    return make(judge_base_url=base_url, judge_api_key=JUDGE_KEY, judge_max_retries=0, **extra)


@pytest.mark.e2e
def test_an_online_run_samples_the_prompts_and_trains_on_the_judges_group_scores(
    run_settings: Callable[..., Settings],
) -> None:
    """One real run for the online mode: the dataset's prompts, the policy's own completions judged as groups (and
    scored by a shipped scorer, weighted 0), a judge outage counted, the key kept to the judge's host."""
    judge = RuleJudge()
    with chat_server(judge) as server:
        settings = judged_settings(run_settings, server.base_url)
        with in_process_service(settings) as live, live.client() as client:
            dataset = upload_records(client, echo_records(8, 1))["id"]  # unscored: online runs score their own
            online = {"id": dataset, "mode": "online", "held_out": 0.25}
            missing = start(client, dataset=online)
            assert missing.status_code == 422 and error_of(missing)["details"]["field"] == "dataset.rewards"
            unknown = start(client, dataset={**online, "rewards": [{"name": "nonesuch"}]})
            assert unknown.status_code == 404 and error_of(unknown)["code"] == "REWARD_NOT_FOUND"

            rewards = [{"name": "judge", "weight": 2.0}, {"name": "completion"}, {"name": "echo", "weight": 0}]
            response = start(
                client,
                dataset={**online, "rewards": rewards, "judge": {"model": "rule-judge", "rubric": RUBRIC}},
                config={"group_size": 4, "batch_size": 8, "max_tokens": 8},
            )
            assert response.status_code == 201, response.text
            created = response.json()
            assert created["environment"] == "dataset_online" and created["dataset_mode"] == "online"
            assert created["dataset"]["counts"] == {"prompts": 8, "train_prompts": 6, "held_out_prompts": 2}
            merged_text = (settings.data_path / created["config_path"]).read_text()
            merged = yaml.safe_load(merged_text)
            assert [r["name"] for r in merged["env"]["rewards"]] == ["judge", "completion", "echo"]
            assert merged["env"]["rewards"][2]["file"].endswith("echo.py")
            assert merged["env"]["dataset_judge"]["base_url"] == server.base_url

            final = wait_for_status(client, created["id"], {"completed"}, timeout=300)
            series = client.get(f"/runs/{created['id']}/metrics").json()["metrics"]
            held_out = client.get(f"/runs/{created['id']}/prompts").json()
            training = client.get(f"/runs/{created['id']}/prompts", params={"split": "train"}).json()["prompts"]
            texts = [
                response.text,
                json.dumps(final),
                *(client.get(f"/runs/{created['id']}/logs/{role}").text for role in ("api", "trainer", "env")),
            ]
        requests, authorizations = list(server.requests), list(server.authorizations)

    assert final["last_step"] == 6  # the locked local total_steps of these tests
    # Each scored group: judge (weight 2) 0, 1/3, 2/3, 1 and completion 0, 1, 1, 2 on the 0/1/2 scale: mean
    # 2 × 0.5 + 1 = 2.0. Every batch the trainer took is judged groups only: the failed ones never reached it.
    assert [value for _, value in series["reward/mean"]] == pytest.approx([2.0] * 6)
    assert "train/reward_mean" in series  # the environment's own, through the env hook
    assert sum(value for _, value in series["batch/trained_tokens"]) > 0  # the scores vary within each group
    assert series["train/unscored_groups"][-1][1] == OUTAGE_REQUESTS
    assert series["judge/failed_groups"][-1][1] == OUTAGE_REQUESTS
    assert series["judge/calls"][-1][1] >= 2 * 12  # 12 trained groups (2 a step), each asked with both rubrics
    # the judge saw the policy's own completions of one prompt, as a group, with the request's model and rubric
    assert len([r for r in requests if RUBRIC in r["messages"][0]["content"]]) >= 12 + OUTAGE_REQUESTS
    assert all(r["model"] == "rule-judge" for r in requests)
    # a training group holds the run's 4 completions of a prompt; the held-out evaluation (every run evaluates:
    # steps_per_eval is at most half of total_steps) judges one completion per prompt
    sizes = [len(TRAJECTORY.findall(r["messages"][1]["content"])) for r in requests]
    assert set(sizes) <= {1, 4} and sizes.count(4) >= 12 + OUTAGE_REQUESTS, sizes
    assert all("[human] Echo: " in r["messages"][1]["content"] for r in requests)
    assert any("completed the user's task" in r["messages"][0]["content"] for r in requests)
    # the held-out prompts are kept out of training
    assert held_out["total"] == 2 and held_out["split"] == "held_out"
    assert held_out["prompts"][0]["records"] is None  # online: prompts only
    assert held_out["prompts"][0]["metadata"]["answer"].isdigit()
    assert not {p["group_key"] for p in training} & {p["group_key"] for p in held_out["prompts"]}
    # the key went to the judge's host, and nowhere else: not the run YAML, any file, a response or a log
    assert set(authorizations) == {f"Bearer {JUDGE_KEY}"}
    assert JUDGE_KEY not in merged_text
    assert all(JUDGE_KEY.encode() not in p.read_bytes() for p in settings.data_path.rglob("*") if p.is_file())
    assert all(JUDGE_KEY not in text for text in texts)


def test_an_online_judge_run_is_refused_beside_a_written_scorer_or_with_judge_options_it_cannot_use(
    run_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """(Without a judge configured, the refusal is in test_dataset_runs.py's refusals.)"""
    written = tmp_path / "written_environments"
    written.mkdir()
    (written / "scored_elsewhere.py").write_text(
        "from atroposlib.envs.base import BaseEnv\n\n\n"
        "def score_completion(completion, gold):\n    return 1.0\n\n\n"
        "class ScoredElsewhere(BaseEnv):\n    name = 'scored_elsewhere'\n"
    )
    settings = judged_settings(run_settings, "http://127.0.0.1:9/v1", environment_dirs=str(written))
    with in_process_service(settings) as live, live.client() as client:
        dataset = upload_records(client, echo_records(3, 1))["id"]
        online = {"id": dataset, "mode": "online"}
        beside = start(client, dataset={**online, "rewards": [{"name": "judge"}, {"name": "scored_elsewhere"}]})
        assert beside.status_code == 422, beside.text
        assert error_of(beside)["details"]["reason"] == "judge_beside_written_scorer"
        options = start(client, dataset={**online, "rewards": [{"name": "echo"}], "judge": {"rubric": "x"}})
        assert options.status_code == 422 and error_of(options)["details"]["field"] == "dataset.judge"
        assert client.get("/runs").json()["runs"] == []
