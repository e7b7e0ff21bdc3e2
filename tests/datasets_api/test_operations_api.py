"""Derived datasets over HTTP on real trajectories: filter, compress (extractive and through an OpenAI-compatible
summariser), score (built-in rewards and the gsm8k environment's scorer in a child process), GRPO export, and a
job that a crashed service left `running`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from rlctl.service.db.engine import Database
from rlctl.service.db.models import Dataset, Job
from rlctl.service.db.types import utcnow
from rlctl.service.jobs.runner import JobRunner
from rlctl.service.settings import Settings
from rlctl.trajectories.records import record_from_dict
from rlctl.trajectories.stats import is_completed
from rlctl.trajectories.tokens import ApproximateTokenCounter, record_token_count
from tests.conftest import TEST_DATA
from tests.datasets_api.chat_server import chat_server
from tests.datasets_api.conftest import succeeded, upload
from tests.support.live import Service, in_process_service

LONG_FILES = (
    "nemo-gym-mini-swe-agent-2-rollouts.jsonl",
    "openhands-multi-swe-bench-output.jsonl",
    "nemo-gym-anyswe-hermes-rollouts.jsonl",
)
SUMMARY_KEY = "sk-summary-secret-0123456789"


def upload_long_trajectories(client: httpx.Client, trajectories: Path) -> dict[str, Any]:
    """5 long agent trajectories of two formats in one JSON Lines upload (detected record by record)."""
    body = b"".join((trajectories / name).read_bytes().rstrip(b"\n") + b"\n" for name in LONG_FILES)
    response = client.post("/datasets", params={"name": "long"}, content=body)
    assert response.status_code == 201, response.text
    return response.json()


def all_records(client: httpx.Client, dataset_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in client.get(f"/datasets/{dataset_id}/export").text.splitlines()]


def test_compress_with_spec_defaults_on_real_trajectories(service: Service, trajectories: Path) -> None:
    with service.client() as client:
        parent = upload_long_trajectories(client, trajectories)
        assert client.get(f"/datasets/{parent['id']}/stats").json()["stats"]["source_formats"] == {
            "openhands": 2,
            "responses": 3,
        }
        result = succeeded(client, client.post(f"/datasets/{parent['id']}/compress", json={}))
        derived = client.get(f"/datasets/{result['dataset_id']}").json()
        assert derived["parent_id"] == parent["id"] and derived["operation"] == "compress"
        assert derived["parameters"]["target_max_tokens"] == 15250
        assert derived["parameters"]["summary_target_tokens"] == 750
        assert derived["parameters"]["protect_last_n_turns"] == 4
        assert derived["parameters"]["summarizer"] == "extractive"

        metrics = client.get(f"/datasets/{derived['id']}/compression-metrics", params={"limit": 200}).json()
        assert metrics["total"] == derived["record_count"] == parent["record_count"] == 5
        per_record = metrics["metrics"]
        report = result["report"]
        assert report["original_tokens"] == sum(m["original_tokens"] for m in per_record)
        assert report["compressed_tokens"] == sum(m["compressed_tokens"] for m in per_record)
        assert report["compressed"] == sum(m["was_compressed"] for m in per_record) >= 3
        assert report["still_over_limit"] == sum(m["still_over_limit"] for m in per_record)
        assert report["summarization_errors"] == 0 and report["summarizer"] == "extractive-v1"

        counter = ApproximateTokenCounter()
        before, after = all_records(client, parent["id"]), all_records(client, derived["id"])
        for original, compressed, metric in zip(before, after, per_record, strict=True):
            tokens = record_token_count(record_from_dict(compressed), counter)
            assert tokens == metric["compressed_tokens"] <= metric["original_tokens"]
            assert compressed["metadata"] == original["metadata"]
            assert compressed["conversations"][-4:] == original["conversations"][-4:]  # the protected tail
            if metric["was_compressed"]:
                assert tokens < 15250 or metric["still_over_limit"]
                summaries = [t for t in compressed["conversations"] if t["value"].startswith("[CONTEXT SUMMARY]:")]
                assert len(summaries) == 1 and len(compressed["conversations"]) < len(original["conversations"])
            else:
                assert compressed == original

        tiny = succeeded(
            client, client.post(f"/datasets/{parent['id']}/compress", json={"tokenizer": "tiny"}), timeout=240
        )
        assert tiny["report"]["tokenizer"] == "hf:tiny-qwen3"  # a real tokenizer, built locally
        unknown = client.post(f"/datasets/{parent['id']}/compress", json={"tokenizer": "missing"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "TOKENIZER_NOT_FOUND"
        refused = client.post(f"/datasets/{parent['id']}/compress", json={"summarizer": "model"})
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "SUMMARIZER_NOT_CONFIGURED"


def test_compress_through_an_openai_compatible_summariser(
    make_settings: Callable[..., Settings], trajectories: Path
) -> None:
    # OpenRouter cannot be reached from here: a loopback server speaking its protocol stands in for it.
    def summarise(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, {"content": "The agent explored the repository, edited files and ran the tests."}

    with chat_server(summarise) as summariser:
        settings = make_settings(summary_base_url=summariser.base_url, summary_api_key=SUMMARY_KEY)
        with in_process_service(settings) as live, live.client() as client:
            parent = upload_long_trajectories(client, trajectories)
            response = client.post(f"/datasets/{parent['id']}/compress", json={})
            result = succeeded(client, response)
            job_text = json.dumps(client.get(f"/jobs/{response.json()['id']}").json())
            derived_text = json.dumps(client.get(f"/datasets/{result['dataset_id']}").json())
            records = all_records(client, result["dataset_id"])
    report = result["report"]
    assert report["summarizer"] == "openai-compatible:google/gemini-3-flash-preview"
    assert report["summarization_calls"] == len(summariser.requests) == report["compressed"] >= 3
    assert {r["model"] for r in summariser.requests} == {"google/gemini-3-flash-preview"}
    assert {r["temperature"] for r in summariser.requests} == {0.3}
    assert set(summariser.authorizations) == {f"Bearer {SUMMARY_KEY}"}
    summaries = [t["value"] for r in records for t in r["conversations"] if t["value"].startswith("[CONTEXT")]
    assert len(summaries) == report["compressed"]
    assert all("explored the repository" in s for s in summaries)
    assert SUMMARY_KEY not in job_text + derived_text
    stored = b"".join(p.read_bytes() for p in settings.data_path.rglob("*") if p.is_file())
    assert SUMMARY_KEY.encode() not in stored  # not in the database, the records or any other file


def test_a_failing_summariser_keeps_every_record_and_counts_the_failures(
    make_settings: Callable[..., Settings], trajectories: Path
) -> None:
    with chat_server(lambda body: (500, {"error": {"message": "upstream overloaded"}})) as summariser:
        settings = make_settings(summary_base_url=summariser.base_url, summary_max_retries=0)
        with in_process_service(settings) as live, live.client() as client:
            parent = upload_long_trajectories(client, trajectories)
            result = succeeded(client, client.post(f"/datasets/{parent['id']}/compress", json={"summarizer": "model"}))
            assert all_records(client, result["dataset_id"]) == all_records(client, parent["id"])
    report = result["report"]
    assert result["record_count"] == 5 and report["compressed"] == 0
    assert report["summarization_errors"] == report["skipped"]["summarization_failed"] == len(summariser.requests)
    assert report["summarization_errors"] >= 3


def gsm8k_records(count: int) -> list[dict[str, Any]]:
    """Two answers per GSM8K test problem (one right, one wrong) plus one problem answered once."""
    problems = [json.loads(line) for line in (TEST_DATA / "gsm8k" / "test.jsonl").open()][:count]
    lines = []
    for index, problem in enumerate(problems):
        gold = problem["answer"].split("####")[-1].strip().replace(",", "")
        answers = [gold, str(int(gold) + 1)] if index < count - 1 else [gold]
        for answer in answers:
            lines.append(
                {
                    "messages": [
                        {"role": "user", "content": problem["question"]},
                        {"role": "assistant", "content": f"<think>Work it out.</think>So \\boxed{{{answer}}}"},
                    ],
                    "answer": gold,
                    "problem": index,
                }
            )
    return lines


def test_score_with_builtin_rewards_and_the_gsm8k_scorer_then_export_grpo(service: Service) -> None:
    lines = gsm8k_records(5)
    body = "\n".join(json.dumps(line) for line in lines).encode()
    rewards = [
        {"name": "correctness", "weight": 1.0},
        {"name": "format", "weight": 1.0},
        {"name": "gsm8k", "weight": 0.5},
    ]
    with service.client() as client:
        parent = client.post("/datasets", params={"name": "gsm8k-answers"}, content=body).json()
        unknown = client.post(f"/datasets/{parent['id']}/score", json={"rewards": [{"name": "nonesuch"}]})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "REWARD_NOT_FOUND"
        twice = client.post(f"/datasets/{parent['id']}/score", json={"rewards": [{"name": "format"}] * 2})
        assert twice.status_code == 422

        response = client.post(f"/datasets/{parent['id']}/score", json={"rewards": rewards, "answer_field": "answer"})
        result = succeeded(client, response, timeout=180)
        records = all_records(client, result["dataset_id"])
        assert len(records) == 9
        for line, record in zip(lines, records, strict=True):
            right = line["messages"][1]["content"].endswith(f"{{{line['answer']}}}")
            expected = {"correctness": 2.0 if right else 0.0, "format": 0.25, "gsm8k": 1.0 if right else 0.0}
            assert record["reward_breakdown"] == expected
            assert record["reward"] == pytest.approx(expected["correctness"] + 0.25 + 0.5 * expected["gsm8k"])
        assert result["report"]["rewards"]["max"] == pytest.approx(2.75)
        assert result["report"]["weights"] == {"correctness": 1.0, "format": 1.0, "gsm8k": 0.5}

        export = succeeded(client, client.post(f"/datasets/{result['dataset_id']}/export-grpo", json={}))
        assert export["groups"] == 4 and export["records"] == 8
        assert export["issues"] == {"too_small": 1} and export["records_not_exported"] == 1
        assert export["issue_examples"][0]["reason"] == "too_small" and export["issue_examples"][0]["size"] == 1
        groups = [json.loads(line) for line in client.get(export["download"]).text.splitlines()]
        assert len(groups) == 4
        for group in groups:
            assert sorted(group["rewards"]) == pytest.approx([0.25, 2.75])
            assert sorted(group["advantages"]) == pytest.approx([-1.25, 1.25])
            assert len({t["metadata"]["problem"] for t in group["trajectories"]}) == 1
        by_problem = succeeded(
            client, client.post(f"/datasets/{result['dataset_id']}/export-grpo", json={"group_by": "problem"})
        )
        assert by_problem["groups"] == 4
        busy_free = client.delete(f"/datasets/{result['dataset_id']}")
        assert busy_free.status_code == 204


def test_source_reward_and_filters_on_real_data(service: Service, trajectories: Path) -> None:
    with service.client() as client:
        tau = upload(client, trajectories / "tau-bench-gpt-4o-airline.json").json()
        response = client.post(f"/datasets/{tau['id']}/score", json={"rewards": [{"name": "source_reward"}]})
        scored = all_records(client, succeeded(client, response)["dataset_id"])
        assert [r["reward"] for r in scored] == [float(r["metadata"]["reward"]) for r in scored]

        reasoned = upload(client, trajectories / "llamafactory-reason-tool-use-demo-50.jsonl").json()
        criteria = {"drop_incomplete": True, "drop_hallucinated_tools": True, "allowed_tools": ["get_weather"]}
        result = succeeded(client, client.post(f"/datasets/{reasoned['id']}/filter", json=criteria))
        report = result["report"]
        assert report["kept"] + report["dropped"] == 8 and report["reasons"]["incomplete"] == 1
        kept = all_records(client, result["dataset_id"])
        assert len(kept) == report["kept"]
        assert all(is_completed(record_from_dict(r)) for r in kept)
        called = {c["name"] for r in kept for t in r["conversations"] for c in t.get("tool_calls", [])}
        assert called <= {"get_weather"}

        glaive = upload(client, trajectories / "llamafactory-glaive-toolcall-en-demo.json").json()
        bounded = {"drop_without_reasoning": True, "max_tokens": 100}
        none_left = succeeded(client, client.post(f"/datasets/{glaive['id']}/filter", json=bounded))
        assert none_left["record_count"] == 0 and none_left["report"]["reasons"]["no_reasoning"] == 12
        lengths = succeeded(
            client, client.post(f"/datasets/{glaive['id']}/filter", json={"min_tokens": 200, "max_tokens": 1000})
        )
        counter = ApproximateTokenCounter()
        sizes = [record_token_count(record_from_dict(r), counter) for r in all_records(client, lengths["dataset_id"])]
        assert sizes and all(200 <= size <= 1000 for size in sizes)
        derived = client.get("/datasets", params={"parent_id": glaive["id"]}).json()
        assert derived["count"] == 2 and {d["operation"] for d in derived["datasets"]} == {"filter"}


def test_a_job_left_running_by_a_crashed_service_resumes(
    make_settings: Callable[..., Settings], trajectories: Path
) -> None:
    settings = make_settings()
    with in_process_service(settings) as live, live.client() as client:
        parent = upload(client, trajectories / "nemo-gym-mini-swe-agent-2-rollouts.jsonl").json()
        replica = live.app.state.context.replica_id
    # What a `kill -9` in the middle of a compress job leaves: the job `running`, a half-written staging directory.
    staging = settings.data_path / "datasets" / ".staging" / "crashedjob000001"
    staging.mkdir(parents=True)
    (staging / "records.jsonl").write_text('{"conversations": [', encoding="utf-8")
    params = {
        "dataset_id": parent["id"],
        "output_id": "dsresumed0000001",
        "name": "resumed",
        "target_max_tokens": 15250,
        "summary_target_tokens": 750,
        "protect_first_system": True,
        "protect_first_human": True,
        "protect_first_gpt": True,
        "protect_first_tool": True,
        "protect_last_n_turns": 4,
        "summarizer": "extractive",
        "tokenizer": "approx",
    }
    database = Database(settings.sqlalchemy_url)
    with database.session() as session:
        session.add(
            Job(
                id="crashedjob000001",
                kind="dataset_compress",
                status="running",
                params=params,
                progress_done=1,
                progress_total=2,
                owner_id=replica,
                heartbeat_at=utcnow(),
                started_at=utcnow(),
            )
        )
    database.dispose()
    with in_process_service(settings) as live, live.client() as client:
        job = JobRunner.of(live.app.state.context).wait("crashedjob000001", 60)
        assert job == "succeeded"
        result = client.get("/jobs/crashedjob000001").json()["result"]
        assert result["dataset_id"] == "dsresumed0000001" and result["record_count"] == 2
        assert client.get("/datasets/dsresumed0000001").json()["parent_id"] == parent["id"]
    assert not staging.exists()
    database = Database(settings.sqlalchemy_url)
    with database.session() as session:
        assert session.scalars(select(Dataset.id).where(Dataset.id == "dsresumed0000001")).all() == ["dsresumed0000001"]
    database.dispose()
