"""Prometheus metrics at /metrics and the access log: HTTP by route template, state gauges from the database."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from rlctl.service.jobs.runner import JobFailed, JobHandle, JobKind, JobRunner
from rlctl.service.settings import Settings
from tests.conftest import build_settings
from tests.ops.seeding import SeededRun, seed_run
from tests.support.live import in_process_service

TOKEN = "metrics-token"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: httpx.Client) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_http_requests_are_counted_by_route_and_logged_with_their_request_id(
    make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(api_token=TOKEN, max_body_bytes=1000)
    with (
        in_process_service(settings) as live,
        live.client() as client,
        caplog.at_level(logging.INFO, logger="rlctl.access"),
    ):
        for run_id in ("missing-1", "missing-2"):
            answer = client.get(f"/runs/{run_id}", headers={"X-Request-ID": f"req-{run_id}"})
            assert answer.json()["error"]["request_id"] == f"req-{run_id}"
        assert client.get("/no/such/path").status_code == 404
        assert client.request("PROPFIND", "/healthz").status_code == 405
        too_large = client.post("/runs", content=b"{" * 2000, headers={"Content-Type": "application/json"})
        assert too_large.status_code == 413
        with live.anonymous() as anonymous:
            assert anonymous.get("/metrics").status_code == 401  # behind the token, like the API
        samples = scrape(client)

    assert value(samples, "rlctl_http_requests_total", method="GET", route="/runs/{run_id}", status="404") == 2
    assert value(samples, "rlctl_http_request_duration_seconds_count", method="GET", route="/runs/{run_id}") == 2
    assert value(samples, "rlctl_http_requests_total", method="GET", route="unmatched", status="404") == 1
    assert value(samples, "rlctl_http_requests_total", method="POST", route="/runs", status="413") == 1
    assert value(samples, "rlctl_http_requests_total", method="OTHER", route="/healthz", status="405") == 1
    labels = {v for name, pairs in samples for _, v in pairs}
    assert not {"/runs/missing-1", "/no/such/path", "PROPFIND"} & labels, "a series per id or verb would be unbounded"

    access = {r.request_id: r for r in caplog.records if r.name == "rlctl.access"}  # type: ignore[attr-defined]
    first = access["req-missing-1"]
    assert (first.method, first.route, first.path, first.status) == ("GET", "/runs/{run_id}", "/runs/missing-1", 404)  # type: ignore[attr-defined]
    assert first.duration_ms >= 0  # type: ignore[attr-defined]
    assert "GET /runs/missing-1 404" in first.getMessage()
    assert TOKEN not in caplog.text


def _succeed(_ctx: Any, handle: JobHandle) -> dict[str, Any]:
    handle.progress(1, 1, force=True)
    return {"ok": True}


def _fail(_ctx: Any, _handle: JobHandle) -> dict[str, Any]:
    raise JobFailed("bad input")


def _register_jobs(app: FastAPI) -> None:
    JobRunner.of(app.state.context).register(JobKind("ops_ok", _succeed))
    JobRunner.of(app.state.context).register(JobKind("ops_fail", _fail))


def test_state_gauges_come_from_the_database_on_every_replica_and_after_a_restart(
    make_settings: Callable[..., Settings], database_url: str, tmp_path: Path
) -> None:
    settings = make_settings()
    seed_run(settings, SeededRun(status="running", process_status="running", stalled=True))
    live_run = seed_run(settings, SeededRun(status="running", process_status="running"))
    done = seed_run(settings, SeededRun(status="completed"))
    seed_run(settings, SeededRun(status="failed"))

    with in_process_service(settings, _register_jobs) as first, first.client() as client:
        runner = JobRunner.of(first.app.state.context)
        jobs = [runner.submit("ops_ok", {}), runner.submit("ops_ok", {}), runner.submit("ops_fail", {})]
        assert [runner.wait(job, 30) for job in jobs] == ["succeeded", "succeeded", "failed"]
        assert client.get(f"/runs/{live_run.id}/status").status_code == 200
        assert client.get(f"/runs/{live_run.id}/status").status_code == 429
        assert client.get(f"/runs/{done.id}/status").status_code == 200  # ended: outside the limit, not counted
        on_first = scrape(client)
        other_settings = build_settings(tmp_path / "replica-2", database_url)
        with in_process_service(other_settings) as second, second.client() as other:
            on_second = scrape(other)
    with in_process_service(settings, _register_jobs) as restarted, restarted.client() as client:
        after_restart = scrape(client)

    expected = {
        ("rlctl_runs", (("status", "running"),)): 2,
        ("rlctl_runs", (("status", "completed"),)): 1,
        ("rlctl_runs", (("status", "failed"),)): 1,
        ("rlctl_runs", (("status", "pending"),)): 0,
        ("rlctl_runs_stalled", ()): 1,
        ("rlctl_run_processes", (("role", "trainer"), ("status", "running"))): 2,
        ("rlctl_run_processes", (("role", "env"), ("status", "exited"))): 2,
        ("rlctl_jobs", (("kind", "ops_ok"), ("status", "succeeded"))): 2,
        ("rlctl_jobs", (("kind", "ops_ok"), ("status", "running"))): 0,
        ("rlctl_jobs", (("kind", "ops_fail"), ("status", "failed"))): 1,
        ("rlctl_status_checks_total", (("outcome", "allowed"),)): 1,
        ("rlctl_status_checks_total", (("outcome", "limited"),)): 1,
        ("rlctl_database_up", ()): 1,
    }
    for samples in (on_first, on_second, after_restart):
        observed = {key: value(samples, key[0], **dict(key[1])) for key in expected}
        assert observed == expected
    # HTTP counters belong to each process: the second replica never served the status checks.
    status_route = {"method": "GET", "route": "/runs/{run_id}/status"}
    assert value(on_first, "rlctl_http_requests_total", **status_route, status="429") == 1
    assert value(on_second, "rlctl_http_requests_total", **status_route, status="429") is None
