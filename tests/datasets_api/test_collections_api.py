"""Collections end to end over HTTP against a real OpenAI-compatible server on loopback: the trainer's inference
server with the tiny local model. Interrupted (cancelled, or the service stopped) and resumed, every
(prompt, run) pair runs exactly once: the server's request count and the unchanged early trajectories show it."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from rlctl.sandbox.memcap import find_cgroup_root
from rlctl.service.db.engine import Database
from rlctl.service.db.models import CollectionItem, Job
from rlctl.service.settings import Settings
from rlctl.trainer.tiny_model import init_tiny_model
from rlctl.trajectories.stats import RECORD_STATS_KEYS
from tests.datasets_api.chat_server import chat_server
from tests.support.endpoints import tiny_model_endpoint
from tests.support.live import in_process_service
from tests.support.waiting import REQUEST_TIMEOUT, wait_until

PROMPTS = ["Add 2 and 3.", "Name a colour.", "Add 2 and 3.", "Spell cat.", "Add 2 and 3."] * 2  # duplicates
COLLECTION_KEY = "sk-collection-secret-42"
OPENROUTER_KEY = "sk-or-secret-77"
TINY_AGENT = "tiny/agent"


class TinyEndpoint:
    def __init__(self, base_url: str, model: str) -> None:
        self.base_url, self.model = base_url, model

    def chat_calls(self) -> int:
        return (
            httpx.get(self.base_url.removesuffix("/v1") + "/health", timeout=REQUEST_TIMEOUT)
            .json()["served"]
            .get("chat_completions", 0)
        )


@pytest.fixture(scope="module")
def tiny_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyEndpoint]:
    model_dir = init_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen3", seed=0)
    with tiny_model_endpoint(model_dir, tmp_path_factory.mktemp("run"), [TINY_AGENT]) as url:
        yield TinyEndpoint(url, TINY_AGENT)


def request_body(endpoint: TinyEndpoint, **overrides: Any) -> dict[str, Any]:
    body = {
        "name": "tiny-collection",
        "prompts": [{"prompt": text, "answer": "5", "task_id": i} for i, text in enumerate(PROMPTS)],
        "base_url": endpoint.base_url,
        "model": endpoint.model,
        "runs_per_prompt": 2,
        "concurrency": 1,
        "max_turns": 1,
        # Few tokens: what is checked is which (prompt, run) pairs ran and how often, not what the model said; a
        # long random answer from the tiny model only costs CPU (minutes of it for 20 pairs on a loaded machine).
        "max_tokens": 24,
        "discard_without_reasoning": False,  # the tiny model never reasons: keep its trajectories
    }
    return {**body, **overrides}


def collection(client: httpx.Client, collection_id: str) -> dict[str, Any]:
    response = client.get(f"/collections/{collection_id}")
    assert response.status_code == 200, response.text
    return response.json()


def wait_status(client: httpx.Client, collection_id: str, *statuses: str, timeout: float = 180) -> dict[str, Any]:
    return wait_until(
        lambda: (found := collection(client, collection_id))["status"] in statuses and found,
        timeout=timeout,
        message=f"collection {collection_id} reaches {statuses}",
    )


def all_items(client: httpx.Client, collection_id: str) -> list[dict[str, Any]]:
    return client.get(f"/collections/{collection_id}/items", params={"limit": 200}).json()["items"]


@pytest.mark.e2e
def test_cancel_then_resume_runs_every_pair_exactly_once(
    make_settings: Callable[..., Settings], tiny_endpoint: TinyEndpoint
) -> None:
    settings = make_settings()
    calls_before = tiny_endpoint.chat_calls()
    with in_process_service(settings) as live, live.client() as client:
        created = client.post("/collections", json=request_body(tiny_endpoint))
        assert created.status_code == 202, created.text
        collection_id = created.json()["id"]
        wait_until(
            lambda: collection(client, collection_id)["progress"]["kept"] >= 3, timeout=120, message="3 items kept"
        )
        assert client.post(f"/collections/{collection_id}/cancel").status_code == 200
        cancelled = wait_status(client, collection_id, "cancelled")
        assert cancelled["job"]["status"] == "cancelled" and cancelled["dataset_id"] is None
        early = {
            path.stem: json.loads(path.read_text())
            for path in (settings.data_path / "collections" / collection_id / "items").glob("*.json")
        }
        assert 3 <= len(early) == cancelled["progress"]["kept"] < 20
        assert client.post(f"/collections/{collection_id}/cancel").status_code == 409

        resumed = client.post(f"/collections/{collection_id}/resume")
        assert resumed.status_code == 202 and resumed.json()["job_id"] != cancelled["job_id"]
        done = wait_status(client, collection_id, "completed", "failed")
        assert done["status"] == "completed", done["error"]
        assert done["progress"] == {"total": 20, "kept": 20, "discarded": 0, "failed": 0, "pending": 0}
        assert client.post(f"/collections/{collection_id}/resume").status_code == 409

        items = all_items(client, collection_id)
        pairs = [(item["prompt_index"], item["run_index"]) for item in items]
        assert pairs == [(p, r) for p in range(10) for r in range(2)]
        assert {item["attempts"] for item in items} == {1} and {item["api_calls"] for item in items} == {1}

        records = [json.loads(line) for line in client.get(f"/datasets/{done['dataset_id']}/export").text.splitlines()]
        stats = client.get(f"/datasets/{done['dataset_id']}/stats").json()["stats"]
    assert tiny_endpoint.chat_calls() - calls_before == 20  # nothing ran twice
    assert [(r["metadata"]["prompt_index"], r["metadata"]["run_index"]) for r in records] == pairs
    for record in records:
        key = f"{record['metadata']['prompt_index']}-{record['metadata']['run_index']}"
        if key in early:
            # kept before the cancel, not run again after it (the export adds the record's own statistics)
            assert {k: v for k, v in record.items() if k not in RECORD_STATS_KEYS} == early[key]
        assert record["conversations"][0] == {"from": "human", "value": PROMPTS[record["metadata"]["prompt_index"]]}
        # terminal is off unless asked for
        assert record["metadata"]["answer"] == "5" and record["declared_tools"] == ["read_file", "write_file"]
    assert stats["records"] == 20 and stats["api_calls"]["total"] == 20
    assert stats["reasoning_stats"]["total_assistant_turns"] == 20 and stats["tool_calls"]["count"] == 0
    assert not (settings.data_path / "collections" / collection_id / "sandboxes").exists() or not any(
        (settings.data_path / "collections" / collection_id / "sandboxes").iterdir()
    )


@pytest.mark.e2e
def test_a_service_restart_resumes_and_discarded_pairs_are_not_run_again(
    make_settings: Callable[..., Settings], tiny_endpoint: TinyEndpoint
) -> None:
    settings = make_settings()
    calls_before = tiny_endpoint.chat_calls()
    body = request_body(tiny_endpoint, concurrency=2, runs_per_prompt=3)
    del body["discard_without_reasoning"]  # the default: samples without reasoning are dropped
    with in_process_service(settings) as live, live.client() as client:
        collection_id = client.post("/collections", json=body).json()["id"]
        first_job = wait_until(
            lambda: (c := collection(client, collection_id))["progress"]["discarded"] >= 3 and c["job_id"],
            timeout=120,
            message="3 items discarded",
        )
    # The service stopped mid-way; its job stays `running` until the next start resumes it.
    database = Database(settings.sqlalchemy_url)
    with database.session() as session:
        assert session.get(Job, first_job).status == "running"
        recorded = session.scalar(select(func.count()).where(CollectionItem.collection_id == collection_id))
    database.dispose()
    assert 3 <= recorded < 30
    with in_process_service(settings) as live, live.client() as client:
        done = wait_status(client, collection_id, "completed", "failed")
        # Nothing kept: the collection fails and says why, rather than completing with an empty dataset.
        assert done["status"] == "failed" and done["dataset_id"] is None
        assert "30 discarded: the model gave no reasoning" in done["error"], done["error"]
        assert done["job_id"] == first_job and done["job"]["status"] == "failed"
        items = all_items(client, collection_id)
    # The tiny model never reasons: every trajectory is discarded, each exactly once, and recorded as such.
    assert [(i["prompt_index"], i["run_index"]) for i in items] == [(p, r) for p in range(10) for r in range(3)]
    assert {(i["status"], i["reason"], i["attempts"]) for i in items} == {("discarded", "no_reasoning", 1)}
    assert tiny_endpoint.chat_calls() - calls_before == 30


def test_tool_calls_run_in_the_sandbox_and_keys_go_only_to_allowed_hosts(
    make_settings: Callable[..., Settings],
) -> None:
    # The tiny model emits random text and never calls a tool: a scripted model stands in for an agent model.
    def agent(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        assert [t["function"]["name"] for t in body["tools"]] == ["terminal", "read_file", "write_file"]
        turn = sum(1 for message in body["messages"] if message["role"] == "assistant")
        script = [
            {
                "content": "",
                "reasoning_content": "Write the note first.",
                "tool_calls": [_call("a", "write_file", {"path": "notes/n.txt", "content": "hello"})],
            },
            {
                "content": "Now read it.",
                "tool_calls": [
                    _call("b", "terminal", {"command": "cat notes/n.txt; echo k=${OPENROUTER_API_KEY:-none}"}),
                    _call("c", "read_file", {"path": "../../etc/passwd"}),
                ],
            },
            {"content": "<think>The note says hello.</think>The note says hello."},
        ]
        return 200, script[turn]

    with chat_server(agent) as model:
        settings = make_settings(openrouter_api_key=OPENROUTER_KEY, collection_api_key=COLLECTION_KEY)
        body = {
            "name": "scripted",
            "prompts": [{"prompt": "Leave a note."}, {"prompt": "Leave a note."}],
            "base_url": model.base_url,
            "model": "scripted",
            "concurrency": 2,
            "max_turns": 5,
            "tools": ["terminal", "read_file", "write_file"],
        }
        with in_process_service(settings) as live, live.client() as client:
            done_id = client.post("/collections", json=body).json()["id"]
            done = wait_status(client, done_id, "completed", "failed", timeout=60)
            assert done["status"] == "completed", done["error"]
            stats = client.get(f"/datasets/{done['dataset_id']}/stats").json()["stats"]
            records = client.get(f"/datasets/{done['dataset_id']}/records").json()["records"]
            responses = json.dumps(done) + json.dumps(records)
        assert set(model.authorizations) == {"Bearer no-key"}  # loopback is not an allowed host for the keys

        allowed = make_settings(collection_api_key=COLLECTION_KEY, collection_key_hosts="127.0.0.1")
        with in_process_service(allowed) as live, live.client() as client:
            second = client.post("/collections", json={**body, "runs_per_prompt": 2, "name": "keyed"}).json()["id"]
            assert wait_status(client, second, "completed", "failed", timeout=60)["status"] == "completed"
        assert model.authorizations[-1] == f"Bearer {COLLECTION_KEY}"

    assert stats["tool_stats"]["write_file"] == {**stats["tool_stats"]["write_file"], "count": 4, "success": 4}
    assert stats["tool_stats"]["terminal"]["success"] == 4
    assert stats["tool_stats"]["read_file"] == {**stats["tool_stats"]["read_file"], "count": 4, "failure": 4}
    assert stats["reasoning_stats"]["records_with_reasoning"] == 4 and stats["completion_rate"] == 1.0
    terminal = [t for t in records[0]["conversations"] if t.get("name") == "terminal"][0]["value"]
    assert "hello" in terminal and "k=none" in terminal  # ran in the sandbox, without the service's secrets
    assert records[0]["conversations"][1]["value"].startswith("<think>\nWrite the note first.\n</think>")
    for secret in (COLLECTION_KEY, OPENROUTER_KEY):
        assert secret not in responses
        assert all(secret.encode() not in p.read_bytes() for p in settings.data_path.rglob("*") if p.is_file())


def test_items_with_a_sandbox_wait_for_the_hosts_slots_and_their_cgroups_go_with_the_collection(
    make_settings: Callable[..., Settings],
) -> None:
    """RLCTL_SANDBOX_MAX_ITEMS=1 holds a collection of concurrency 4 to one sandboxed item at a time: the scripted
    model's first turn of an item waits (bounded) for another item's request, which never comes while it runs."""
    lock = threading.Lock()
    in_flight, peak = [0], [0]
    other_arrived = threading.Event()

    def agent(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
            if in_flight[0] > 1:
                other_arrived.set()
        try:
            if not any(message["role"] == "assistant" for message in body["messages"]):
                other_arrived.wait(timeout=1.0)  # a second item would arrive now, were it let in
                return 200, {"content": "", "tool_calls": [_call("a", "terminal", {"command": "echo ran"})]}
            return 200, {"content": "<think>Done.</think>Done."}
        finally:
            with lock:
                in_flight[0] -= 1

    with chat_server(agent) as model:
        settings = make_settings(sandbox_max_items=1, sandbox_collection_cpus=0.5, sandbox_memory_budget_bytes=1 << 30)
        body = {
            "name": "one-at-a-time",
            "prompts": [{"prompt": "Run it."}] * 2,  # two runs each: four items
            "base_url": model.base_url,
            "model": "scripted",
            "concurrency": 4,
            "max_turns": 3,
            "tools": ["terminal"],
        }
        with in_process_service(settings) as live, live.client() as client:
            created = client.post("/collections", json=body).json()["id"]
            done = wait_status(client, created, "completed", "failed", timeout=90)
            assert done["status"] == "completed", done["error"]
            stats = client.get(f"/datasets/{done['dataset_id']}/stats").json()["stats"]
    assert stats["tool_stats"]["terminal"]["success"] == 4
    assert peak[0] == 1 and not other_arrived.is_set()
    cgroups = find_cgroup_root()
    if cgroups is not None:  # the collection's cgroups are gone with it (the service's budget group stays)
        assert not list(cgroups.path.glob(f"rlctl-sandboxes-{os.getpid()}/rlctl-collection-*"))


def test_samples_without_reasoning_are_dropped_by_default_and_counted(
    make_settings: Callable[..., Settings],
) -> None:
    """The batch runner rlctl follows keeps only trajectories that reason: by default a collection drops the others
    (counted as discarded), and `discard_without_reasoning: false` keeps them. A scripted model stands in for a
    reasoning model (the tiny one never reasons): it reasons on even prompts only."""

    def model(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        number = int(body["messages"][-1]["content"].removeprefix("p"))
        if number % 2 == 0:
            return 200, {"content": "4", "reasoning_content": "Two and two make four."}
        return 200, {"content": "4"}

    prompts = [{"prompt": f"p{i}"} for i in range(4)]
    with chat_server(model) as server, in_process_service(make_settings()) as live, live.client() as client:
        body = {"name": "r", "prompts": prompts, "base_url": server.base_url, "model": "m", "concurrency": 2}
        default = wait_status(client, client.post("/collections", json=body).json()["id"], "completed", "failed")
        kept_all = client.post("/collections", json={**body, "discard_without_reasoning": False}).json()["id"]
        kept_all_done = wait_status(client, kept_all, "completed", "failed")
        dataset = client.get(f"/datasets/{default['dataset_id']}").json()
        records = client.get(f"/datasets/{default['dataset_id']}/records").json()["records"]
        items = all_items(client, default["id"])
    assert default["params"]["discard_without_reasoning"] is True
    assert default["progress"] == {"total": 8, "kept": 4, "discarded": 4, "failed": 0, "pending": 0}
    assert dataset["report"]["kept"] == 4 and dataset["report"]["discarded"] == 4 and dataset["record_count"] == 4
    assert {r["metadata"]["prompt_index"] for r in records} == {0, 2}
    assert {(i["prompt_index"] % 2, i["status"], i["reason"]) for i in items} == {
        (0, "kept", None),
        (1, "discarded", "no_reasoning"),
    }
    assert kept_all_done["progress"]["kept"] == 8 and kept_all_done["progress"]["discarded"] == 0


def test_collection_requests_are_validated(service: Any) -> None:
    base = {"name": "v", "prompts": [{"prompt": "x"}], "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    with service.client() as client:
        for change in (
            {"runs_per_prompt": 1},
            {"base_url": "file:///etc/passwd"},
            {"api_key": "sk-from-the-request"},
            {"prompts": []},
            {"prompts": [{"answer": "no prompt"}]},
            {"tools": ["browser"]},
            {"name": "../x"},
        ):
            response = client.post("/collections", json={**base, **change})
            assert response.status_code == 422, change
        assert client.get("/collections").json()["count"] == 0
        assert client.get("/collections/colmissing").status_code == 404
        assert client.post("/collections/colmissing/resume").status_code == 404
        assert client.get("/collections/..").status_code in (404, 422)


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def test_a_collection_cancelled_while_queued_can_resume(make_settings: Callable[..., Settings]) -> None:
    release = threading.Event()

    def held(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:  # answers once the test lets it
        release.wait(timeout=60)
        return 200, {"content": "<think>ok</think>done"}

    with chat_server(held) as model, in_process_service(make_settings(job_workers=1)) as live, live.client() as client:
        body = {"name": "held", "prompts": [{"prompt": "x"}], "base_url": model.base_url, "model": "m"}
        first = client.post("/collections", json=body).json()["id"]
        wait_until(lambda: len(model.requests) >= 1, timeout=30, message="the first collection is running")
        second = client.post("/collections", json=body).json()
        assert second["status"] == "queued" and second["job"]["status"] == "queued"
        assert client.post(f"/collections/{second['id']}/cancel").json()["status"] == "cancelled"
        assert [c["id"] for c in client.get("/collections", params={"status": "cancelled"}).json()["collections"]] == [
            second["id"]
        ]
        assert client.post(f"/collections/{second['id']}/resume").status_code == 202
        release.set()
        for collection_id in (first, second["id"]):
            done = wait_status(client, collection_id, "completed", "failed", timeout=60)
            assert done["status"] == "completed" and done["progress"]["kept"] == 2, done
