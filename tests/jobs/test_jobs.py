"""Background jobs: progress, results, failure, cancel, and what a service restart does to them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from fastapi import FastAPI

from rlctl.service.jobs import runner as runner_module
from rlctl.service.jobs.runner import JobFailed, JobHandle, JobKind, JobRunner
from rlctl.service.settings import Settings
from tests.support.live import in_process_service
from tests.support.waiting import scaled, wait_until

release = threading.Event()


def counting(_ctx: Any, handle: JobHandle) -> dict[str, Any]:
    total = handle.params["count"]
    for done in range(total + 1):
        handle.progress(done, total, force=True)
        handle.check_cancelled()
        if done == handle.params.get("pause_at"):
            wait_until(lambda: release.is_set() or handle.cancelled, timeout=60, message="released")
    return {"counted": total, "resumed": handle.resumed}


def failing(_ctx: Any, _handle: JobHandle) -> dict[str, Any]:
    raise JobFailed("the input was not what it should be")


def crashing(_ctx: Any, _handle: JobHandle) -> dict[str, Any]:
    raise RuntimeError("unexpected")


def register(app: FastAPI, resumable: bool = True) -> None:
    runner = JobRunner.of(app.state.context)
    runner.register(JobKind("test_count", counting, resumable=resumable))
    runner.register(JobKind("test_fail", failing))
    runner.register(JobKind("test_crash", crashing))


def test_progress_and_result(make_settings: Callable[..., Settings]) -> None:
    with in_process_service(make_settings(), register) as live, live.client() as client:
        job_id = JobRunner.of(live.app.state.context).submit("test_count", {"count": 5})
        job = wait_until(
            lambda: (j := client.get(f"/jobs/{job_id}").json())["status"] == "succeeded" and j,
            timeout=30,
            message="succeeded",
        )
        assert job["progress"] == {"done": 5, "total": 5}
        assert job["result"] == {"counted": 5, "resumed": False}
        listed = client.get("/jobs", params={"kind": "test_count"}).json()
        assert [j["id"] for j in listed["jobs"]] == [job_id]


def test_failures_are_recorded_with_their_reason(make_settings: Callable[..., Settings]) -> None:
    with in_process_service(make_settings(), register) as live, live.client() as client:
        runner = JobRunner.of(live.app.state.context)
        failed, crashed = runner.submit("test_fail", {}), runner.submit("test_crash", {})
        assert runner.wait(failed, 30) == "failed" and runner.wait(crashed, 30) == "failed"
        assert client.get(f"/jobs/{failed}").json()["error"] == "the input was not what it should be"
        assert client.get(f"/jobs/{crashed}").json()["error"] == "RuntimeError: unexpected"


def test_cancel_a_running_job_and_refuse_to_cancel_an_ended_one(make_settings: Callable[..., Settings]) -> None:
    release.clear()
    with in_process_service(make_settings(), register) as live, live.client() as client:
        job_id = JobRunner.of(live.app.state.context).submit("test_count", {"count": 10, "pause_at": 3})
        wait_until(lambda: client.get(f"/jobs/{job_id}").json()["progress"]["done"] == 3, timeout=30, message="3")
        assert client.post(f"/jobs/{job_id}/cancel").status_code == 200
        assert JobRunner.of(live.app.state.context).wait(job_id, 30) == "cancelled"
        again = client.post(f"/jobs/{job_id}/cancel")
        assert again.status_code == 409 and again.json()["error"]["code"] == "INVALID_STATE"
        assert client.get("/jobs/nope").status_code == 404


def test_a_restart_resumes_resumable_jobs_and_fails_the_others(make_settings: Callable[..., Settings]) -> None:
    release.clear()
    settings = make_settings()
    with in_process_service(settings, register) as live:
        resumable = JobRunner.of(live.app.state.context).submit("test_count", {"count": 4, "pause_at": 2})
        wait_until(
            lambda: JobRunner.of(live.app.state.context).wait(resumable, 0) == "running", timeout=30, message="run"
        )
    release.set()  # the service is gone; the next one will finish the job
    with in_process_service(settings, register) as live, live.client() as client:
        assert JobRunner.of(live.app.state.context).wait(resumable, 30) == "succeeded"
        assert client.get(f"/jobs/{resumable}").json()["result"] == {"counted": 4, "resumed": True}


def test_a_restart_fails_jobs_that_cannot_resume(make_settings: Callable[..., Settings]) -> None:
    release.clear()
    settings = make_settings()
    with in_process_service(settings, lambda app: register(app, resumable=False)) as live:
        job_id = JobRunner.of(live.app.state.context).submit("test_count", {"count": 4, "pause_at": 2})
        wait_until(lambda: JobRunner.of(live.app.state.context).wait(job_id, 0) == "running", timeout=30, message="run")
    with in_process_service(settings, lambda app: register(app, resumable=False)) as live, live.client() as client:
        job = client.get(f"/jobs/{job_id}").json()
        assert job["status"] == "failed"
        assert "restarted" in job["error"]


def test_a_job_claimed_while_the_service_closes_is_asked_to_stop_too(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A job is `running` in the database a moment before the runner holds its handle. The close of a service that
    # looked for running jobs in that moment must still reach it, or the close waits for the whole job.
    release.clear()
    claimed, looked = threading.Event(), threading.Event()

    class LateHandle(JobHandle):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            claimed.set()
            looked.wait(timeout=scaled(30))  # held until close() has looked for running jobs
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(runner_module, "JobHandle", LateHandle)
    settings = make_settings()
    with in_process_service(settings, lambda app: register(app, resumable=False)) as live:
        jobs = JobRunner.of(live.app.state.context)
        job_id = jobs.submit("test_count", {"count": 4, "pause_at": 2})
        wait_until(claimed.is_set, timeout=30, message="the job claimed")
        pool = jobs._pool  # close() waits for its threads right after it has looked for running jobs
        wait_for_threads = pool.shutdown
        monkeypatch.setattr(pool, "shutdown", lambda **kwargs: (looked.set(), wait_for_threads(**kwargs)))
    monkeypatch.undo()
    with in_process_service(settings, lambda app: register(app, resumable=False)) as live, live.client() as client:
        job = client.get(f"/jobs/{job_id}").json()
    assert job["status"] == "failed" and "restarted" in job["error"], job
