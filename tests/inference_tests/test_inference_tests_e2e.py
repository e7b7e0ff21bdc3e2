"""Inference tests end to end: the real service, a real database, one child process per model running the
environment's own atroposlib `process` mode, against the trainer's inference server on the tiny model."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from rlctl.service.db.models import Job
from rlctl.service.settings import Settings
from tests.conftest import REPO_ROOT, TEST_DATA
from tests.inference_tests.conftest import PLANTED_KEY, SERVED_MODELS
from tests.support.live import in_process_service
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

UNKNOWN_MODEL = "nobody/no-such-model"
ENDED = {"succeeded", "failed", "cancelled"}


def load_environment(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"inference_test_env_{name}", REPO_ROOT / "environments" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def wait_ended(client: httpx.Client, test_id: str, timeout: float = 240) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        test = client.get(f"/inference-tests/{test_id}").json()
        return test if test["status"] in ENDED else None

    return wait_until(ended, timeout=timeout, interval=0.25, message=f"inference test {test_id} ending")


def gsm8k_expected_score(gsm8k: ModuleType, gold_by_question: dict[str, str], conversation: list[dict]) -> float:
    question = next(m["content"] for m in conversation if m["role"] == "user")
    assert question in gold_by_question, "the prompt is not a real GSM8K question"
    return gsm8k.score_completion(conversation[-1]["content"], gold_by_question[question])


def echo_expected_score(echo: ModuleType, conversation: list[dict]) -> float:
    target = re.fullmatch(r"Echo: (\d+)", conversation[0]["content"]).group(1)  # type: ignore[union-attr]
    config = echo.EchoConfig()
    return echo.score_reply(conversation[-1]["content"], target, config.reply_tokens, config.digit_weight)


@pytest.mark.parametrize("environment", ["gsm8k", "echo"])
def test_two_models_complete_and_an_unknown_one_fails_alone(
    environment: str, inference_settings: Callable[..., Settings], endpoint: str
) -> None:
    models = [*SERVED_MODELS, UNKNOWN_MODEL]
    config = {"max_new_tokens": 8} if environment == "gsm8k" else {}
    settings = inference_settings()
    with in_process_service(settings) as live, live.client() as client:
        body = {
            "environment": environment,
            "num_steps": 2,
            "group_size": 4,
            "models": models,
            "base_url": endpoint,
            "config": config,
        }
        created = client.post("/inference-tests", json=body)
        assert created.status_code == 202, created.text
        assert created.json()["status"] in ("queued", "running") and created.json()["progress"]["total"] == 6
        test = wait_ended(client, created.json()["id"])
        listed = client.get("/inference-tests").json()
        job = client.get(f"/jobs/{test['id']}").json()
        responses = created.text + json.dumps(test) + json.dumps(listed) + json.dumps(job)

    assert test["status"] == "succeeded", test["error"]
    assert test["progress"] == {"done": 6, "total": 6}
    assert [t["id"] for t in listed["inference_tests"]] == [test["id"]] and job["kind"] == "inference_test"
    result = test["result"]
    by_model = {r["model"]: r for r in result["models_tested"]}
    assert list(by_model) == models

    for model in SERVED_MODELS:
        outcome = by_model[model]
        assert outcome["status"] == "succeeded" and outcome["error"] is None
        assert [s["step"] for s in outcome["steps"]] == [1, 2]
        assert all(s["completions"] == 4 == len(s["scores"]) for s in outcome["steps"])
        assert outcome["steps_tested"] == 2 and outcome["total_completions"] == 8
        correct = sum(1 for s in outcome["steps"] for score in s["scores"] if score > 0)
        assert outcome["correct_completions"] == correct and outcome["accuracy"] == round(correct / 8, 4)
        assert outcome["steps_with_correct"] == sum(1 for s in outcome["steps"] if s["correct"] > 0)
        latency = outcome["latency"]
        assert latency["completions_timed"] == 8 and 0 < latency["p50_s"] <= latency["p95_s"]

    missing = by_model[UNKNOWN_MODEL]
    assert missing["status"] == "failed" and missing["steps_tested"] == 0 and missing["total_completions"] == 0
    assert "404" in missing["error"] and "does not exist" in missing["error"]

    summary = result["summary"]
    output_dir = settings.data_path / "logs" / "rl_training" / "inference_tests"
    accuracies = [by_model[m]["accuracy"] for m in SERVED_MODELS]
    assert summary["steps_requested"] == 2 and summary["models_tested"] == 3 and summary["models_succeeded"] == 2
    assert summary["best_model"] == SERVED_MODELS[accuracies.index(max(accuracies))]
    assert summary["avg_accuracy"] == pytest.approx(sum(accuracies) / 2, abs=1e-4)
    assert summary["environment_working"] is True and summary["output_directory"] == "logs/rl_training/inference_tests"

    module = load_environment(environment)
    gold = {}
    if environment == "gsm8k":
        rows = [json.loads(line) for line in (TEST_DATA / "gsm8k" / "train.jsonl").open()]
        gold = {row["question"]: module.gold_answer(row["answer"]) for row in rows}
    for model in models:
        stem = f"test_{environment}_{model.replace('/', '_')}"
        assert by_model[model]["files"] == {
            "jsonl": f"logs/rl_training/inference_tests/{stem}.jsonl",  # relative to the data directory
            "log": f"logs/rl_training/inference_tests/{stem}.log",
        }
        lines = [json.loads(line) for line in (output_dir / f"{stem}.jsonl").read_text().splitlines()]
        assert [line["scores"] for line in lines] == [s["scores"] for s in by_model[model]["steps"]]
        for line in lines:
            assert line["model"] == model and len(line["completions"]) == len(line["messages"]) == 4
            for conversation, completion, score in zip(
                line["messages"], line["completions"], line["scores"], strict=True
            ):
                assert conversation[-1] == {"role": "assistant", "content": completion}
                expected = (
                    gsm8k_expected_score(module, gold, conversation)
                    if environment == "gsm8k"
                    else echo_expected_score(module, conversation)
                )
                assert score == pytest.approx(expected), "the score is not the environment's own"
        log = (output_dir / f"{stem}.log").read_text()
        assert f"model {model}" in log and PLANTED_KEY not in log
    assert not (output_dir / ".work").exists(), "the work directory was left behind"
    assert PLANTED_KEY not in responses
    assert PLANTED_KEY not in stored_jobs(settings)


def stored_jobs(settings: Settings) -> str:
    from rlctl.service.db.engine import Database

    db = Database(settings.sqlalchemy_url)
    try:
        with db.session() as session:
            return json.dumps([[j.params, j.result, j.error] for j in session.scalars(select(Job))], default=str)
    finally:
        db.dispose()
