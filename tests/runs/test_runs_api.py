"""The runs API around the processes: creation rules, idempotency, listing, metrics, logs, stalls."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from rlctl.service.db.engine import Database
from rlctl.service.db.models import Run, RunMetric, RunProcess
from rlctl.service.runs.metrics import upsert_metrics
from rlctl.service.runs.paths import RunPaths
from rlctl.service.runs.schemas import RunSummary
from rlctl.service.settings import Settings
from tests.runs.conftest import wait_for_status
from tests.support.live import Service, in_process_service
from tests.support.waiting import wait_until


def add_runs(database_url: str, *runs: Run, metrics: tuple[RunMetric, ...] = ()) -> None:
    db = Database(database_url)
    with db.session() as session:
        session.add_all(runs)
    with db.session() as session:
        session.add_all(metrics)
    db.dispose()


def make_run(run_id: str, status: str = "completed", environment: str = "echo", minutes_ago: int = 0) -> Run:
    created = datetime.now(UTC) - timedelta(minutes=minutes_ago)
    config = {"tinker": {"total_steps": 10 + minutes_ago}}
    return Run(id=run_id, environment=environment, backend="local", status=status, created_at=created, config=config)


@pytest.fixture
def service(make_settings: Callable[..., Settings]) -> Service:
    with in_process_service(make_settings()) as live:
        yield live


def test_tinker_without_a_key_is_refused_before_anything_exists(service: Service) -> None:
    with service.client() as client:
        response = client.post("/runs", json={"environment": "echo", "backend": "tinker"})
        assert response.status_code == 409
        assert response.json()["error"]["code"] == "BACKEND_UNAVAILABLE"
        assert "TINKER_API_KEY" in response.json()["error"]["message"]
        assert client.get("/runs").json()["count"] == 0


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"environment": "nope"}, 404, "ENVIRONMENT_NOT_FOUND"),
        ({"environment": "echo", "config": {"total_steps": 5}}, 422, "FIELD_LOCKED"),
        ({"environment": "echo", "config": {"group_size": "8"}}, 422, "VALIDATION_ERROR"),
        ({"environment": "echo", "config": {"no_such": 1}}, 422, "UNKNOWN_FIELD"),
        ({"environment": "../etc"}, 422, "VALIDATION_ERROR"),
        ({"environment": "echo", "backend": "gpu"}, 422, "VALIDATION_ERROR"),
    ],
)
def test_bad_run_requests_change_nothing(service: Service, body: dict, status: int, code: str) -> None:
    with service.client() as client:
        response = client.post("/runs", json={"backend": "local", **body})
        assert response.status_code == status, response.text
        assert response.json()["error"]["code"] == code
        assert client.get("/runs").json()["count"] == 0
    assert not (service.settings.data_path / "runs").exists() or not any(
        (service.settings.data_path / "runs").iterdir()
    )


def test_the_same_idempotency_key_gives_the_same_run(service: Service) -> None:
    body = {"environment": "echo", "backend": "local", "idempotency_key": "retry-me"}
    with service.client() as client:
        first = client.post("/runs", json=body)
        again = client.post("/runs", json=body)
        assert first.status_code == 201 and again.status_code == 201
        assert again.json()["id"] == first.json()["id"]
        assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
        other = client.post("/runs", json={**body, "config": {"group_size": 4, "batch_size": 16}})
        assert other.status_code == 422 and "different request" in other.json()["error"]["message"]
        assert client.get("/runs").json()["count"] == 1
        assert client.post(f"/runs/{first.json()['id']}/stop", params={"wait_s": 120}).json()["status"] == "stopped"


def test_listing_filters_and_pages_newest_first(service: Service, database_url: str) -> None:
    add_runs(
        database_url,
        *(make_run(f"r{i}", "completed" if i % 2 else "failed", minutes_ago=10 - i) for i in range(5)),
        make_run("g1", "completed", environment="gsm8k", minutes_ago=20),
    )
    with service.client() as client:
        page = client.get("/runs", params={"limit": 2}).json()
        assert [r["id"] for r in page["runs"]] == ["r4", "r3"]
        seen = [r["id"] for r in page["runs"]]
        while page["next_cursor"]:
            page = client.get("/runs", params={"limit": 2, "cursor": page["next_cursor"]}).json()
            seen += [r["id"] for r in page["runs"]]
        assert seen == ["r4", "r3", "r2", "r1", "r0", "g1"]
        # A listing does not load the config, but shows its total_steps, each run's own.
        assert [r["total_steps"] for r in page["runs"]] == [20, 30]
        assert [r["total_steps"] for r in client.get("/runs", params={"limit": 2}).json()["runs"]] == [16, 17]
        failed = client.get("/runs", params={"status": "failed"}).json()
        assert [r["id"] for r in failed["runs"]] == ["r4", "r2", "r0"]
        assert [r["id"] for r in client.get("/runs", params={"environment": "gsm8k"}).json()["runs"]] == ["g1"]
        assert client.get("/runs", params={"status": "exploded"}).status_code == 422
        assert client.get("/runs", params={"cursor": "not a cursor"}).status_code == 422


@pytest.mark.parametrize("query", ["limit=0", "limit=201", "limit=abc", "cursor=not-a-cursor!", "limit=0&cursor=x"])
def test_a_bad_page_query_is_refused_as_every_listing_refuses_it(service: Service, query: str) -> None:
    """GET /runs reads its query itself (rlctl/service/pagination.py, QueryModel): the same 422 as a listing whose
    query FastAPI reads (GET /jobs), error for error."""
    with service.client() as client:
        runs, jobs = client.get(f"/runs?{query}"), client.get(f"/jobs?{query}")
    assert runs.status_code == jobs.status_code == 422
    refused, expected = runs.json()["error"], jobs.json()["error"]
    assert refused.pop("request_id") != expected.pop("request_id")
    assert refused == expected and refused["code"] == "VALIDATION_ERROR"


def test_a_bad_filter_is_refused_with_its_place_and_unknown_parameters_are_ignored(service: Service) -> None:
    add_runs(service.settings.database_url, make_run("q1"), make_run("q2", minutes_ago=1))
    with service.client() as client:
        refused = client.get("/runs?status=bogus&environment=" + "e" * 129)
        listed = client.get("/runs?limit=5&limit=1&unknown=1")  # the last of a name counts
    assert refused.status_code == 422
    errors = refused.json()["error"]["details"]["errors"]
    assert [(e["location"], e["type"]) for e in errors] == [
        (["query", "status"], "enum"),
        (["query", "environment"], "string_too_long"),
    ]
    assert listed.status_code == 200 and [run["id"] for run in listed.json()["runs"]] == ["q1"]


def test_a_listed_run_reads_exactly_as_its_record(service: Service, database_url: str) -> None:
    """A listing's JSON is written by the database (rlctl/service/db/json_sql.py), a record's by pydantic: each run must
    read the same in both, key for key in the model's order, with the same datetime text."""
    moment = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)  # no fraction of a second: pydantic writes none
    bare = Run(id="bare", environment="echo", backend="local", status="completed", created_at=moment, config={})
    full = Run(
        id="full",
        environment="gsm8k",
        backend="tinker",
        status="failed",
        created_at=moment - timedelta(microseconds=1),
        started_at=moment + timedelta(microseconds=450),
        ended_at=moment + timedelta(hours=30, microseconds=999_999),
        stalled=True,
        last_step=7,
        priority=-3,
        dataset_id="ds1",
        dataset_mode="offline",
        wandb_run_name='a "quoted" back\\slash, é ✓ and a\ttab',
        config={"tinker": {"total_steps": 12}},
    )
    add_runs(database_url, bare, full)
    with service.client() as client:
        listed = client.get("/runs").json()["runs"]
        assert [run["id"] for run in listed] == ["bare", "full"]
        for run in listed:
            record = client.get(f"/runs/{run['id']}").json()
            assert list(run) == list(RunSummary.model_fields)
            assert run == {key: record[key] for key in RunSummary.model_fields}
    assert listed[1]["created_at"] == "2026-03-04T05:06:06.999999Z" and listed[1]["stalled"] is True
    assert listed[0]["created_at"] == "2026-03-04T05:06:07Z" and listed[0]["ended_at"] is None


def test_a_record_lists_its_processes_in_the_order_they_were_recorded(service: Service, database_url: str) -> None:
    """The record's processes come from one JSON array the database aggregates (in no order of its own): they must
    read as their rows do, in the order of their ids (the order recorded), datetimes and nulls included; a run with
    none lists none. The rows are stored out of that order, as a table's storage may hold them."""
    moment = datetime(2026, 3, 4, 5, 6, 7, 120_000, tzinfo=UTC)
    rows = [
        (30, "trainer", 41, "exited", 0, None),
        (10, "api", 40, "running", None, None),
        (20, "env", None, "exited", -9, 9),
    ]
    recorded = Run(id="procs", environment="echo", backend="local", status="running", created_at=moment, config={})
    recorded.processes = [
        RunProcess(
            id=process_id,
            role=role,
            pid=pid,
            status=status,
            exit_code=exit_code,
            signal=signal,
            log_path=f"/logs/{role}.log" if pid else None,
            started_at=moment + timedelta(seconds=index) if pid else None,
            ended_at=moment + timedelta(hours=1) if exit_code is not None else None,
        )
        for index, (process_id, role, pid, status, exit_code, signal) in enumerate(rows)
    ]
    bare = Run(id="noprocs", environment="echo", backend="local", status="queued", created_at=moment, config={})
    add_runs(database_url, recorded, bare)
    with service.client() as client:
        processes = client.get("/runs/procs").json()["processes"]
        assert client.get("/runs/noprocs").json()["processes"] == []
    assert [process["role"] for process in processes] == ["api", "env", "trainer"]
    api, env, trainer = processes
    assert trainer == {
        "role": "trainer",
        "pid": 41,
        "status": "exited",
        "exit_code": 0,
        "signal": None,
        "log_path": "trainer.log",  # outside the data directory: its last part (docs/SECURITY.md)
        "started_at": "2026-03-04T05:06:07.120000Z",
        "ended_at": "2026-03-04T06:06:07.120000Z",
    }
    assert api["started_at"] == "2026-03-04T05:06:08.120000Z" and api["ended_at"] is None
    assert env == {
        "role": "env",
        "pid": None,
        "status": "exited",
        "exit_code": -9,
        "signal": 9,
        "log_path": None,
        "started_at": None,
        "ended_at": "2026-03-04T06:06:07.120000Z",
    }


def test_metrics_filter_by_name_and_step_range(service: Service, database_url: str) -> None:
    rows = tuple(
        RunMetric(run_id="m1", name=name, step=step, value=step * factor)
        for step in range(1, 11)
        for name, factor in (("reward/mean", 0.1), ("train/loss", -1.0))
    )
    add_runs(database_url, make_run("m1"), metrics=rows)
    with service.client() as client:
        everything = client.get("/runs/m1/metrics").json()["metrics"]
        assert set(everything) == {"reward/mean", "train/loss"} and len(everything["train/loss"]) == 10
        some = client.get("/runs/m1/metrics", params={"name": "reward/mean", "min_step": 3, "max_step": 5}).json()
        assert some["metrics"] == {"reward/mean": [[3, pytest.approx(0.3)], [4, pytest.approx(0.4)], [5, 0.5]]}
        results = client.get("/runs/m1/results").json()
        assert results["final_metrics"] == {"reward/mean": 1.0, "train/loss": -10.0}
        assert client.get("/runs/missing/metrics").status_code == 404


def test_the_trainers_warnings_are_on_the_run_record(service: Service, database_url: str) -> None:
    add_runs(database_url, make_run("w1"), make_run("w2"))
    warning = {"code": "parameter_ignored", "parameter": "adam_params.grad_clip_norm", "message": "ignored"}
    state = RunPaths(service.settings.data_path, "w1").trainer_state
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps({"status": "running", "step": 1, "warnings": [warning]}))
    with service.client() as client:
        assert client.get("/runs/w1").json()["warnings"] == [warning]
        assert client.get("/runs/w2").json()["warnings"] == []  # no trainer state yet


def test_logs_tail_and_follow_until_the_run_ends(service: Service, database_url: str) -> None:
    add_runs(database_url, make_run("l1", "running"))
    log = RunPaths(service.settings.data_path, "l1").log("trainer")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("".join(f"line {i}\n" for i in range(10)))
    with service.client() as client:
        assert client.get("/runs/l1/logs/trainer", params={"tail": 2}).text == "line 8\nline 9\n"
        assert client.get("/runs/l1/logs/nope").status_code == 422
        received: list[str] = []

        def follow() -> None:
            with (
                service.client() as follower,
                follower.stream("GET", "/runs/l1/logs/trainer", params={"tail": 1, "follow": True}) as response,
            ):
                for line in response.iter_lines():
                    received.append(line)

        reader = threading.Thread(target=follow)
        reader.start()
        wait_until(lambda: received == ["line 9"], timeout=30, message="tail")
        with log.open("a") as handle:
            handle.write("line 10\nline 11\n")
        wait_until(lambda: received[-1:] == ["line 11"], timeout=30, message="followed lines")
        db = Database(database_url)
        with db.session() as session:
            session.get(Run, "l1").status = "completed"
        db.dispose()
        reader.join(timeout=30)
        assert not reader.is_alive(), "the stream did not end with the run"
        assert received == ["line 9", "line 10", "line 11"]


@pytest.mark.e2e
def test_a_run_without_progress_is_flagged_stalled(run_settings: Callable[..., Settings], tmp_path: Path) -> None:
    """gsm8k on the tiny model, sampled greedily: the replies of a group are all the same, so are their scores,
    Atropos drops each group and no step ever happens. (Sampled at temperature 1, 1-2 % of the tiny model's replies
    end in the right number, a fifth of the groups differ, and the sampler now fills a batch in seconds.)"""
    config = {"max_new_tokens": 16, "eval_items": 0, "temperature": 0.0}
    with in_process_service(run_settings(stall_after_s=3, local_total_steps=50)) as live, live.client() as client:
        run_id = client.post("/runs", json={"environment": "gsm8k", "backend": "local", "config": config}).json()["id"]
        wait_for_status(client, run_id, {"running"}, timeout=240)
        stalled = wait_until(
            lambda: (r := client.get(f"/runs/{run_id}").json())["stalled"] and r, timeout=120, message="stalled flag"
        )
        assert stalled["status"] == "running" and stalled["last_step"] is None
        wait_until(
            lambda: "waiting for rollouts" in client.get(f"/runs/{run_id}/logs/trainer", params={"tail": 200}).text,
            timeout=60,
            message="the trainer says it waits",
        )
        assert client.post(f"/runs/{run_id}/stop", params={"wait_s": 120}).json()["status"] == "stopped"


def test_metrics_are_upserted_by_run_name_and_step_the_later_value_winning(database_url: str) -> None:
    """Ingestion's upsert (rlctl.service.runs.metrics) on both engines: more rows than one batch of VALUES, a value
    logged twice in one call, and a step stored earlier written again."""
    add_runs(database_url, make_run("u1"), make_run("u2"))
    first = [(f"m/{index}", step, float(step)) for step in range(60) for index in range(40)]  # 2,400 rows
    db = Database(database_url)
    try:
        with db.session() as session:
            upsert_metrics(session, "u1", [*first, ("m/0", 5, -1.0)])
            upsert_metrics(session, "u2", [("m/0", 5, 7.0)])
        with db.session() as session:
            upsert_metrics(session, "u1", [("m/1", 5, -2.0), ("m/new", 0, 3.0)])
        with db.session() as session:
            stored = {(r.run_id, r.name, r.step): r.value for r in session.scalars(select(RunMetric))}
    finally:
        db.dispose()
    assert len(stored) == 2400 + 1 + 1
    assert stored[("u1", "m/0", 5)] == -1.0 and stored[("u1", "m/1", 5)] == -2.0
    assert stored[("u1", "m/2", 5)] == 5.0 and stored[("u1", "m/39", 59)] == 59.0
    assert stored[("u2", "m/0", 5)] == 7.0 and stored[("u1", "m/new", 0)] == 3.0
