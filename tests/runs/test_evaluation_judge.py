"""Evaluations scored by the judge (docs/EVALUATIONS.md#the-comparison): each model's samples of a prompt go to the
judge as one group; a group the judge cannot score leaves that prompt out for that model, counted, never 0; and
what POST /evaluations checks before it starts anything.

The judge model is a paid remote service this machine cannot reach: the loopback chat server of the dataset tests
(tests/datasets_api/chat_server.py, the real protocol over real HTTP) stands in for it, scoring by the rule of
tests/datasets_api/test_judge_api.py (an answer that says 5 scores 0.9, else 0.1). No model is sampled here: the
job's scoring step reads a samples file written by hand, in the sampler's format, so every figure is known.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlctl.service.evaluations.jobs import score_and_compare, upgraded_params
from rlctl.service.evaluations.schemas import EvaluationJudge, EvaluationModelResult
from rlctl.service.runs.datasets import HELD_OUT, split_path
from rlctl.service.runs.paths import RunPaths
from rlctl.service.settings import Settings
from tests.datasets_api.chat_server import chat_server
from tests.datasets_api.test_judge_api import TRAJECTORY, rule_judge
from tests.ops.seeding import SeededRun, seed_run
from tests.support.live import in_process_service

JUDGE_KEY = "sk-eval-judge-6203"
PROMPTS = [
    {"group_key": f"k{i}", "messages": [{"role": "user", "content": q}], "metadata": {"answer": "5"}}
    for i, q in enumerate(["What is 2+3?", "What is 10-5?", "What is 25/5?"])
]
# Two samples per prompt and model; the judge cannot score step_3's group of the third prompt (an "outage").
SAMPLES = {
    "base": [["7", "five"], ["4", "6"], ["9", "5"]],
    "step_3": [["5", "five"], ["It is 5.", "5"], ["outage", "5"]],
}


def evaluable_run(
    settings: Settings,
    checkpoints: list[dict[str, Any]],
    prompts: list[dict[str, Any]] = PROMPTS,
    backend: str = "local",
    config: dict[str, Any] | None = None,
    environment: str = "echo",
) -> str:
    """A finished run as its trainer and the dataset split leave it: checkpoints in trainer_state.json, the held-out
    prompts in dataset/held_out.jsonl. No training: evaluations read only these."""
    run = seed_run(settings, SeededRun(environment=environment, backend=backend, config=config or {}))
    paths = RunPaths(settings.data_path, run.id)
    paths.trainer_state.parent.mkdir(parents=True, exist_ok=True)
    state = {"status": "completed", "step": max(c["step"] for c in checkpoints), "backend": backend}
    paths.trainer_state.write_text(json.dumps({**state, "checkpoints": checkpoints}))
    held_out = split_path(paths.run_dir, HELD_OUT)
    held_out.parent.mkdir(parents=True, exist_ok=True)
    held_out.write_text("".join(json.dumps(prompt) + "\n" for prompt in prompts))
    return run.id


def samples_file(path: Path, samples: dict[str, list[list[str]]]) -> Path:
    """The sampler's output (rlctl/trainer/evaluate.py): a line per completion, a prompt's samples of a model
    together."""
    lines = [
        {"model": model, "prompt_index": index, "sample": number, "text": text}
        for model, per_prompt in samples.items()
        for index, texts in enumerate(per_prompt)
        for number, text in enumerate(texts)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def outage_judge(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    if "outage" in body["messages"][1]["content"]:
        return 500, {"error": {"message": f"overloaded; your key was {JUDGE_KEY}"}}
    return rule_judge(body)


def test_each_models_prompt_is_one_judge_group_and_a_failed_group_is_left_out(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    params = {
        "answer_field": "answer",
        "rewards": [{"name": "judge", "weight": 2.0}, {"name": "correctness", "weight": 1.0}],
        "judge": {"model": "rule-judge", "rubric": None},
        "models": [{"name": "base", "weights": None}, {"name": "step_3", "weights": "/runs/r/checkpoints/step_3"}],
        "seed": 0,
    }
    samples = samples_file(tmp_path / "samples.jsonl", SAMPLES)
    with chat_server(outage_judge) as judge:
        settings = make_settings(judge_base_url=judge.base_url, judge_api_key=JUDGE_KEY, judge_max_retries=0)
        with in_process_service(settings) as live:
            ctx = live.app.state.context
            result = score_and_compare(ctx, params, PROMPTS, samples)
            again = score_and_compare(ctx, params, PROMPTS, samples)  # from the judge cache, but the failed group

    # one request per (model, prompt) group holding its two samples, with the prompt as the task and the judge's key
    assert len(judge.requests) == 6 + 1
    assert all(len(TRAJECTORY.findall(r["messages"][1]["content"])) == 2 for r in judge.requests)
    assert set(judge.authorizations) == {f"Bearer {JUDGE_KEY}"} and {r["model"] for r in judge.requests} == {
        "rule-judge"
    }
    base, trained = (EvaluationModelResult.model_validate(m) for m in result["models"])
    # reward = 2 × judge (0.9 for a 5, else 0.1) + correctness (2.0 with the digit 5); base: (1.0 + 0.2 + 2.0) / 3
    assert base.mean_reward == pytest.approx(3.2 / 3) and (base.samples, base.unscored_prompts) == (6, 0)
    # step_3's third prompt is left out, not 0: (2.8 + 3.8) / 2, compared with the base on the first two prompts
    assert trained.mean_reward == pytest.approx(3.3) and (trained.samples, trained.unscored_prompts) == (4, 1)
    assert trained.difference == pytest.approx(((2.8 - 1.0) + (3.8 - 0.2)) / 2)
    assert (trained.wins, trained.ties, trained.losses) == (2, 0, 0)
    third = result["prompts"][2]
    assert third["unscored"] == ["step_3"] and third["rewards"] == {"base": pytest.approx(2.0)}
    assert [p["unscored"] for p in result["prompts"][:2]] == [[], []]
    counts = EvaluationJudge.model_validate(result["judge"])
    assert (counts.model, counts.groups, counts.judge_calls, counts.cache_hits, counts.failed_groups) == (
        "rule-judge",
        6,
        6,
        0,
        1,
    )
    assert counts.first_error and "500" in counts.first_error
    assert JUDGE_KEY not in json.dumps(result) + json.dumps(again)  # the key went to the judge's host only
    assert again["judge"]["cache_hits"] == 5 and again["judge"]["judge_calls"] == 1
    assert again["models"] == result["models"]


def test_evaluation_requests_are_checked(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings()  # no judge endpoint, no Tinker key
    run_id = evaluable_run(settings, [{"step": 3, "path": "/nowhere", "weights": "/nowhere"}])
    tinker_run = evaluable_run(
        settings,
        [{"step": 2, "path": "tinker://m/weights/step_2", "weights": "tinker://m/sampler_weights/step_2"}],
        backend="tinker",
    )
    with in_process_service(settings) as live, live.client() as client:

        def refused(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            response = client.post("/evaluations", json=body)
            return response.status_code, response.json()["error"]

        for reward in ("judge", "completion"):  # a completion states no outcome: the judge decides it too
            status, error = refused({"run_id": run_id, "rewards": [{"name": reward}, {"name": "correctness"}]})
            assert (status, error["code"], error["details"]["rewards"]) == (409, "JUDGE_NOT_CONFIGURED", [reward])
        status, error = refused({"run_id": run_id, "rewards": [{"name": "correctness"}], "judge": {"model": "m"}})
        assert (status, error["details"]["field"]) == (422, "judge")
        status, error = refused({"run_id": run_id, "rewards": [{"name": "judge"}], "judge": {"api_key": "sk-x"}})
        assert status == 422  # a key never travels in a request
        status, error = refused({"run_id": tinker_run, "rewards": [{"name": "correctness"}]})
        assert (status, error["code"], error["details"]["missing"]) == (409, "BACKEND_UNAVAILABLE", "TINKER_API_KEY")
        assert client.get("/jobs").json()["jobs"] == []


def test_an_evaluation_accepted_before_the_upgrade_still_runs() -> None:
    """Queued before evaluations sampled tinker runs: its models named their adapter `adapter`, with no backend."""
    older = {"run_id": "r1", "models": [{"name": "base", "adapter": None}, {"name": "step_3", "adapter": "/w/3"}]}
    upgraded = upgraded_params(older)
    assert upgraded["models"] == [{"name": "base", "weights": None}, {"name": "step_3", "weights": "/w/3"}]
    assert (upgraded["backend"], upgraded["protocol"], upgraded["judge"], upgraded["run_id"]) == (
        "local",
        None,
        None,
        "r1",
    )
    current = {
        **older,
        "backend": "tinker",
        "protocol": "current",
        "judge": None,
        "models": [{"name": "s", "weights": "t://x"}],
    }
    assert upgraded_params(current) == current
