"""The judge and completion rewards through POST /datasets/{id}/score, against a loopback judge.

A judge model is a paid remote service this machine cannot reach: a real HTTP server on loopback, speaking the
OpenAI chat-completions protocol, stands in for it. It reads the trajectories out of the prompt rlctl sends and
scores them by a rule (an answer of 5, in digits or in words, is good), so what rlctl does with its answers (the
scores, the reasons, the cache, the failures, the calibration) is checked against known values.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from rlctl.service.settings import Settings
from tests.datasets_api.chat_server import chat_server
from tests.datasets_api.conftest import succeeded, wait_job
from tests.support.live import in_process_service

JUDGE_KEY = "sk-judge-secret-5150"
TRAJECTORY = re.compile(r'<trajectory id="(\d+)">\n(.*?)\n</trajectory>', re.DOTALL)
QUESTIONS = {"What is 2+3?": ["5", "7", "five"], "What is 10-5?": ["It is 5.", "4"], "What is 25/5?": ["6", "5", "9"]}


def rule_judge(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Scores 0.9 an answer that says 5 (digits or words: a smarter judge than the substring rule), else 0.1."""
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    completion = "completed the user's task" in system
    scores = []
    for number, text in TRAJECTORY.findall(user):
        if completion:
            score = 1.0 if "done" in text else 0.5 if "partly" in text else 0.0
        else:
            score = 0.9 if re.search(r"\b(5|five)\b", text) else 0.1
        scores.append({"trajectory_id": number, "reason": f"rule says {score}", "score": score})
    return 200, {"content": "```json\n" + json.dumps({"scores": scores}) + "\n```"}


def upload_lines(client: httpx.Client, lines: list[dict[str, Any]], name: str = "judged") -> dict[str, Any]:
    body = "\n".join(json.dumps(line) for line in lines).encode()
    response = client.post("/datasets", params={"name": name}, content=body)
    assert response.status_code == 201, response.text
    return response.json()


def answer_lines() -> list[dict[str, Any]]:
    return [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}], "answer": "5"}
        for q, answers in QUESTIONS.items()
        for a in answers
    ]


def records(client: httpx.Client, dataset_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in client.get(f"/datasets/{dataset_id}/export").text.splitlines()]


def test_the_judge_scores_groups_keeps_reasons_caches_and_is_calibrated(
    make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    rubric = "Prefer the answer 5."
    score = {"rewards": [{"name": "judge", "weight": 2.0}, {"name": "correctness"}], "judge": {"rubric": rubric}}
    with chat_server(rule_judge) as judge:
        settings = make_settings(judge_base_url=judge.base_url, judge_api_key=JUDGE_KEY, judge_model="rule-judge")
        with in_process_service(settings) as live, live.client() as client:
            parent = upload_lines(client, answer_lines())
            response = client.post(f"/datasets/{parent['id']}/score", json=score)
            first = succeeded(client, response)
            scored = records(client, first["dataset_id"])
            texts = [json.dumps(client.get(f"/jobs/{response.json()['id']}").json()), json.dumps(first)]
            requests_after_first = len(judge.requests)
            again = succeeded(client, client.post(f"/datasets/{parent['id']}/score", json=score))
            texts += [json.dumps(again), json.dumps(client.get(f"/datasets/{again['dataset_id']}").json())]
            rescored = records(client, again["dataset_id"])

    # one request per prompt group, each holding the whole group, with the rubric and the judge's own key
    assert requests_after_first == 3 == len(judge.requests)  # the second scoring was answered from the cache
    assert sorted(len(TRAJECTORY.findall(r["messages"][1]["content"])) for r in judge.requests) == [2, 3, 3]
    assert all(rubric in r["messages"][0]["content"] and r["model"] == "rule-judge" for r in judge.requests)
    assert set(judge.authorizations) == {f"Bearer {JUDGE_KEY}"}
    by_answer = {r["conversations"][1]["value"]: r for r in scored}
    assert by_answer["five"]["reward_breakdown"] == {"judge": 0.9, "correctness": 0.0}
    assert by_answer["five"]["reward"] == pytest.approx(1.8)
    assert by_answer["7"]["reward_breakdown"] == {"judge": 0.1, "correctness": 0.0}
    assert by_answer["It is 5."]["reward"] == pytest.approx(2 * 0.9 + 2.0)
    assert all(r["reward_reasons"] == {"judge": f"rule says {r['reward_breakdown']['judge']}"} for r in scored)
    report = first["report"]
    assert report["judge"] == {
        "model": "rule-judge",
        "groups": 3,
        "judge_calls": 3,
        "cache_hits": 0,
        "failed_groups": 0,
        "first_error": None,
    }
    assert report["unscored"] == 0
    # Calibration against correctness: 5 pairs of one group with different correctness; the judge orders 4 the
    # same way and ties one ("five" scores like "5", correctness says 0): (4 + 0.5) / 5. Spearman: 0.5, 1, 1.
    calibration = report["calibration"]
    assert calibration["reference"] == "correctness" and calibration["pairs"] == 5
    assert calibration["pairwise_agreement"] == pytest.approx(4.5 / 5)
    assert calibration["groups"] == 3 and calibration["spearman_groups"] == 3
    assert calibration["spearman_mean"] == pytest.approx(2.5 / 3)
    assert again["report"]["judge"]["cache_hits"] == 3 and again["report"]["judge"]["judge_calls"] == 0
    assert [r["reward"] for r in rescored] == [r["reward"] for r in scored]
    assert [r["reward_reasons"] for r in rescored] == [r["reward_reasons"] for r in scored]
    # the key reached the judge's host only: not in a response, the database, a file or a log line
    assert all(JUDGE_KEY not in text for text in texts)
    assert all(JUDGE_KEY.encode() not in p.read_bytes() for p in settings.data_path.rglob("*") if p.is_file())
    assert JUDGE_KEY not in caplog.text


def test_a_failing_judge_leaves_records_unscored_and_counted(make_settings: Callable[..., Settings]) -> None:
    def flaky(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        user = body["messages"][1]["content"]
        if "10-5" in user:
            return 500, {"error": {"message": f"overloaded; your key was {JUDGE_KEY}"}}
        if "25/5" in user:
            return 200, {"content": "I think they are all fine."}  # no scores: unreadable
        return rule_judge(body)

    with chat_server(flaky) as judge:
        settings = make_settings(judge_base_url=judge.base_url, judge_api_key=JUDGE_KEY, judge_max_retries=1)
        with in_process_service(settings) as live, live.client() as client:
            parent = upload_lines(client, answer_lines())
            response = client.post(f"/datasets/{parent['id']}/score", json={"rewards": [{"name": "judge"}]})
            result = succeeded(client, response)
            scored = records(client, result["dataset_id"])
            dataset = client.get(f"/datasets/{result['dataset_id']}").json()
            stats = client.get(f"/datasets/{result['dataset_id']}/stats").json()["stats"]
            # a later scoring asks again: failures are not cached
            again = client.post(f"/datasets/{parent['id']}/score", json={"rewards": [{"name": "judge"}]})
            retried = succeeded(client, again)
    report = result["report"]
    assert report["unscored"] == 5 and report["unscored_by_reason"] == {"judge:judge_failed": 5}
    assert report["judge"]["failed_groups"] == 2 and report["judge"]["judge_calls"] == 3
    assert "HTTP 500" in report["judge"]["first_error"] or "unreadable" in report["judge"]["first_error"]
    assert JUDGE_KEY not in json.dumps(dataset) + json.dumps(result)
    assert [r.get("reward") for r in scored] == [0.9, 0.1, 0.9, None, None, None, None, None]
    assert all("reward_breakdown" not in r for r in scored if r.get("reward") is None)
    assert stats["rewards"]["count"] == 3  # never a silent 0
    # first scoring: 1 + 2 tries for each failing group; the second: the good group from the cache, 2 + 2 tries
    assert len(judge.requests) == (1 + 2 + 2) + (2 + 2)
    assert retried["report"]["judge"]["cache_hits"] == 1


def test_completion_by_rule_where_the_source_says_else_by_the_judge(make_settings: Callable[..., Settings]) -> None:
    def runner_record(answer: str, completed: bool, tool_output: str | None = None) -> dict[str, Any]:
        turns: list[dict[str, Any]] = [{"from": "human", "value": "Write the file."}]
        if tool_output is not None:
            call = {"name": "write_file", "arguments": {"path": "a"}}
            turns.append({"from": "gpt", "value": f"<tool_call>\n{json.dumps(call)}\n</tool_call>"})
            content = {"tool_call_id": "0", "name": "write_file", "content": tool_output}
            turns.append({"from": "tool", "value": f"<tool_response>\n{json.dumps(content)}\n</tool_response>"})
        turns.append({"from": "gpt", "value": answer})
        return {"trajectory": turns, "completed": completed, "api_calls": 2, "toolsets_used": ["file"]}

    lines = [
        runner_record("done", True, "ok"),  # complete: 2
        runner_record("done", True, "Error: disk full"),  # a tool call failed: partial, 1
        runner_record("gave up", False),  # the source says not completed: 0
        {"messages": [{"role": "user", "content": "Write the file."}, {"role": "assistant", "content": "done"}]},
        {"messages": [{"role": "user", "content": "Write the file."}, {"role": "assistant", "content": "partly"}]},
    ]
    with chat_server(rule_judge) as judge:
        settings = make_settings(judge_base_url=judge.base_url)
        with in_process_service(settings) as live, live.client() as client:
            parent = upload_lines(client, lines, name="runner")
            score = {"rewards": [{"name": "completion"}, {"name": "format", "weight": 4.0}]}
            result = succeeded(client, client.post(f"/datasets/{parent['id']}/score", json=score))
            scored = records(client, result["dataset_id"])
        assert set(judge.authorizations) == {"Bearer no-key"}  # no judge key configured: none sent
    assert [r["reward_breakdown"]["completion"] for r in scored] == [2.0, 1.0, 0.0, 2.0, 1.0]
    assert [r["reward"] for r in scored] == [3.0, 2.0, 0.0, 2.0, 1.0]  # format: a tool call is worth 0.25 × 4
    assert [r.get("reward_reasons") for r in scored] == [None] * 3 + [{"completion": "rule says 1.0"}] + [
        {"completion": "rule says 0.5"}
    ]
    assert result["report"]["completion_by"] == {"rule": 3, "judge": 2}
    # only the two records without a stated outcome went to the judge, in one group
    assert len(judge.requests) == 1 and len(TRAJECTORY.findall(judge.requests[0]["messages"][1]["content"])) == 2


def test_judge_requests_are_checked(make_settings: Callable[..., Settings]) -> None:
    with in_process_service(make_settings()) as live, live.client() as client:
        parent = upload_lines(client, answer_lines())
        unconfigured = client.post(f"/datasets/{parent['id']}/score", json={"rewards": [{"name": "judge"}]})
        assert unconfigured.status_code == 409 and unconfigured.json()["error"]["code"] == "JUDGE_NOT_CONFIGURED"
        bad = [
            {"rewards": [{"name": "completion"}], "judge": {"rubric": ""}},
            {"rewards": [{"name": "completion"}], "judge": {"calibrate_with": "correctness"}},
            {"rewards": [{"name": "completion"}], "judge": {"api_key": "sk-in-the-request"}},
        ]
        for body in bad:
            response = client.post(f"/datasets/{parent['id']}/score", json=body)
            assert response.status_code == 422, response.text
        # completion without a judge: the stated outcomes score, the others stay unscored and counted
        job = client.post(f"/datasets/{parent['id']}/score", json={"rewards": [{"name": "completion"}]})
        done = wait_job(client, job.json())
        assert done["status"] == "succeeded", done
        assert done["result"]["report"]["unscored_by_reason"] == {"completion:no_judge": 8}
        assert "judge" not in done["result"]["report"]
