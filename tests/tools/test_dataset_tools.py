"""The dataset tools: an agent uploads real trajectories, compresses, scores, exports and collects, by tools only."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from rlctl.service.settings import Settings
from rlctl.trainer.tiny_model import init_tiny_model
from tests.conftest import TEST_DATA
from tests.support.endpoints import tiny_model_endpoint
from tests.support.live import in_process_service
from tests.support.waiting import wait_until

TINY_AGENT = "tiny/agent"


@pytest.fixture(scope="module")
def agent_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model_dir = init_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen3", seed=0)
    with tiny_model_endpoint(model_dir, tmp_path_factory.mktemp("run"), [TINY_AGENT]) as url:
        yield url


def call(client: httpx.Client, tool: str, **arguments: Any) -> dict:
    response = client.post(f"/tools/{tool}", json=arguments)
    assert response.status_code == 200, response.text
    return response.json()


def finished_job(client: httpx.Client, job_id: str) -> dict:
    job = wait_until(
        lambda: (j := call(client, "rl_get_job", job_id=job_id))["status"] not in ("queued", "running") and j,
        timeout=180,
        message=f"job {job_id}",
    )
    assert job["status"] == "succeeded", job
    return job


def test_upload_compress_score_and_export_by_tools(make_settings: Callable[..., Settings]) -> None:
    content = (TEST_DATA / "trajectories" / "nemo-gym-xlam-fc-rollouts.jsonl").read_text()
    with in_process_service(make_settings()) as live, live.client() as client:
        uploaded = call(client, "rl_upload_dataset", name="xlam", content=content)
        assert uploaded["record_count"] == 5
        bad = call(client, "rl_upload_dataset", name="bad", content='{"messages": [{"role": "alien"}]}\n')
        assert bad["code"] == "INVALID_RECORDS"
        stats = call(client, "rl_dataset_stats", dataset_id=uploaded["dataset_id"])["stats"]
        assert stats["records"] == 5 and stats["tool_calls"]["count"] > 0
        assert stats["reasoning_stats"]["records_with_reasoning"] >= 1

        compressed = call(client, "rl_compress_dataset", dataset_id=uploaded["dataset_id"], target_max_tokens=300)
        compressed_id = finished_job(client, compressed["job_id"])["result"]["dataset_id"]
        scored = call(
            client,
            "rl_score_dataset",
            dataset_id=compressed_id,
            rewards=[{"name": "format", "weight": 1.0}],
        )
        scored_id = finished_job(client, scored["job_id"])["result"]["dataset_id"]
        exported = call(client, "rl_export_grpo", dataset_id=scored_id)
        assert finished_job(client, exported["job_id"])["result"]

        lineage = {d["id"]: d for d in call(client, "rl_list_datasets")["datasets"]}
        assert lineage[scored_id]["parent_id"] == compressed_id and lineage[scored_id]["operation"] == "score"
        assert lineage[compressed_id]["parent_id"] == uploaded["dataset_id"]
        records = client.get(f"/datasets/{scored_id}/records", params={"limit": 5}).json()["records"]
        assert all("reward" in r and "format" in r["reward_breakdown"] for r in records)
        assert call(client, "rl_dataset_stats", dataset_id="nope")["code"] == "DATASET_NOT_FOUND"


def test_collect_trajectories_by_tool(make_settings: Callable[..., Settings], agent_endpoint: str) -> None:
    with in_process_service(make_settings()) as live, live.client() as client:
        started = call(
            client,
            "rl_collect_trajectories",
            name="collected",
            prompts=[{"prompt": "Add 2 and 3.", "answer": "5"}, {"prompt": "Name a colour.", "answer": None}],
            base_url=agent_endpoint,
            model=TINY_AGENT,
            runs_per_prompt=2,
            max_turns=1,
            # The tiny model never reasons: by default every trajectory is discarded, and a collection that keeps
            # nothing fails. The null-means-default contract is held by the call below and tests/tools.
            discard_without_reasoning=False,
        )
        assert started["progress"]["total"] == 4
        job = finished_job(client, started["job_id"])
        dataset_id = job["result"]["dataset_id"]
        exported = client.get(f"/datasets/{dataset_id}/export").text.splitlines()
        assert len(exported) + job["result"].get("discarded", 0) + job["result"].get("failed", 0) == 4
        assert all("conversations" in json.loads(line) for line in exported)
        too_small = call(
            client,
            "rl_collect_trajectories",
            name="solo",
            prompts=[{"prompt": "x", "answer": None}],
            base_url=agent_endpoint,
            model=TINY_AGENT,
            runs_per_prompt=1,
            max_turns=None,
            discard_without_reasoning=None,
        )
        assert too_small["code"] == "VALIDATION_ERROR" and too_small["argument"] == "runs_per_prompt"
