"""Offline runs end to end through HTTP only: real run-api, trainer (local backend, tiny model), echo env."""

from __future__ import annotations

import io
import os
import signal
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.conftest import build_settings
from tests.runs.conftest import FAST_LOCAL, wait_for_status
from tests.support.databases import MigratedDatabases, database_kinds, fresh_database
from tests.support.live import Service, in_process_service
from tests.support.reaper import process_alive, stop_run_processes
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


def start(client: httpx.Client, **body: object) -> dict:
    response = client.post("/runs", json={"environment": "echo", "backend": "local", **body})
    assert response.status_code == 201, response.text
    return response.json()


def processes_of(client: httpx.Client, run_id: str) -> dict[str, dict]:
    return {p["role"]: p for p in client.get(f"/runs/{run_id}").json()["processes"]}


def test_an_offline_run_completes_on_its_own(run_service: Service) -> None:
    with run_service.client() as client:
        created = start(client, config={"group_size": 8, "batch_size": 32})
        assert created["status"] in ("pending", "starting")
        run_id = created["id"]
        assert (run_service.settings.data_path / created["config_path"]).exists()  # relative to it
        wait_for_status(client, run_id, {"running", "completed"}, timeout=240)
        # metrics grow while it runs
        first = wait_until(
            lambda: client.get(f"/runs/{run_id}/metrics", params={"name": "reward/mean"}).json()["metrics"],
            timeout=240,
            message="first metrics",
        )
        final = wait_for_status(client, run_id, {"completed"}, timeout=300)
        series = client.get(f"/runs/{run_id}/metrics").json()["metrics"]
        assert len(series["reward/mean"]) == 6 > len(first["reward/mean"]) - 1
        assert {"train/loss", "advantages/mean", "logprobs/mean"} <= set(series)
        assert "train/percent_correct" in series  # the environment's metric, through the env hook
        assert final["last_step"] == 6
        assert {p["role"]: p["status"] for p in final["processes"]} == dict.fromkeys(
            ("api", "trainer", "env"), "exited"
        )
        results = client.get(f"/runs/{run_id}/results").json()
        assert results["status"] == "completed"
        assert results["weights"] and (run_service.settings.data_path / results["weights"]).exists()
        assert [c["step"] for c in results["checkpoints"]][-1] == 6
        assert results["final_metrics"]["reward/mean"] == series["reward/mean"][-1][1]
        for role in ("api", "trainer", "env"):
            assert client.get(f"/runs/{run_id}/logs/{role}", params={"tail": 5}).status_code == 200
        stopped_again = client.post(f"/runs/{run_id}/stop")
        assert stopped_again.status_code == 409 and stopped_again.json()["error"]["code"] == "INVALID_STATE"


def test_two_runs_live_side_by_side_and_one_is_stopped(run_settings) -> None:  # type: ignore[no-untyped-def]
    with in_process_service(run_settings(local_total_steps=10_000)) as live, live.client() as client:
        first, second = start(client), start(client)
        assert first["ports"] != second["ports"]
        wait_for_status(client, first["id"], {"running"}, timeout=240)
        wait_for_status(client, second["id"], {"running"}, timeout=240)
        started = time.monotonic()
        stopped = client.post(f"/runs/{first['id']}/stop", params={"wait_s": 120}).json()
        assert stopped["status"] == "stopped"
        assert time.monotonic() - started < 60
        assert client.get(f"/runs/{second['id']}").json()["status"] == "running"
        pids = [p["pid"] for p in stopped["processes"]]
        assert all(not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie" for pid in pids)
        listed = client.get("/runs", params={"status": "running"}).json()
        assert [r["id"] for r in listed["runs"]] == [second["id"]]
        assert client.post(f"/runs/{second['id']}/stop", params={"wait_s": 120}).json()["status"] == "stopped"


def test_stop_during_start_up_cancels_it(run_service: Service) -> None:
    with run_service.client() as client:
        run_id = start(client)["id"]
        stopped = client.post(f"/runs/{run_id}/stop", params={"wait_s": 120}).json()
        assert stopped["status"] == "stopped"
        assert stopped["started_at"] is None  # it never reached running
        assert all(p["status"] == "exited" for p in stopped["processes"])  # whatever had started is gone
        assert not any(process_alive(p["pid"]) for p in stopped["processes"] if p["pid"])


# Fate sharing by exit status (docs/RUNS.md#fate-sharing): a SIGKILL is seen at the next poll (1 s); the bound
# leaves room for the stop of the others (grace 5 s each) on a shared CPU, far below the 900 s drain time-out
# that a killed environment mistaken for a clean finish would wait for.
KILLED_RUN_FAILS_WITHIN_S = 60


@pytest.mark.parametrize("role", ["env", "trainer", "api"])
def test_a_killed_process_fails_the_run_naming_it_and_its_siblings_go(run_settings, role: str) -> None:  # type: ignore[no-untyped-def]
    with in_process_service(run_settings(local_total_steps=10_000)) as live, live.client() as client:
        run_id = start(client)["id"]
        wait_for_status(client, run_id, {"running"}, timeout=240)
        processes = processes_of(client, run_id)
        os.kill(processes[role]["pid"], signal.SIGKILL)
        failed = wait_for_status_any(client, run_id, {"failed"}, timeout=KILLED_RUN_FAILS_WITHIN_S)
        failure = failed["failure"]
        assert failure["process"] == role and failure["signal"] == signal.SIGKILL and failure["exit_code"] is None
        assert failure["kind"] == "process_exited" and failure["log_tail"]
        assert f"{role} killed by signal SIGKILL" in failure["message"]
        for other in {"api", "trainer", "env"} - {role}:
            assert not process_alive(processes[other]["pid"])


def test_no_secret_reaches_a_response_log_yaml_or_row(run_settings, process_database_url: str) -> None:  # type: ignore[no-untyped-def]
    planted = {
        "tinker_api_key": "tml-PLANTED_tinker_SECRET_0123",
        "openrouter_api_key": "sk-or-PLANTED_openrouter_SECRET",
        "api_token": "PLANTEDapiTOKEN0123456789",
    }
    settings = run_settings(**planted)
    with (
        in_process_service(settings) as live,
        live.client() as client,
    ):
        run_id = start(client)["id"]
        wait_for_status(client, run_id, {"completed"}, timeout=300)
        bodies = [
            client.get(path).text
            for path in (
                f"/runs/{run_id}",
                f"/runs/{run_id}/status",
                f"/runs/{run_id}/results",
                f"/runs/{run_id}/metrics",
                "/runs",
                "/environments/echo",
                *(f"/runs/{run_id}/logs/{role}?tail=100000" for role in ("api", "trainer", "env")),
            )
        ]
        files = [
            p.read_text(errors="replace")
            for p in settings.data_path.rglob("*")
            if p.is_file() and p.suffix in (".log", ".yaml", ".jsonl", ".json")
        ]
    rows = _dump_database(process_database_url)
    for secret in planted.values():
        for text in [*bodies, *files, rows]:
            assert secret not in text


def wait_for_status_any(client: httpx.Client, run_id: str, statuses: set[str], timeout: float) -> dict:
    return wait_until(
        lambda: (run := client.get(f"/runs/{run_id}").json())["status"] in statuses and run,
        timeout=timeout,
        message=f"run {run_id} reaching {statuses}",
    )


def _dump_database(url: str) -> str:
    from sqlalchemy import MetaData, select

    from rlctl.service.db.engine import Database

    db = Database(url)
    metadata = MetaData()
    metadata.reflect(db.engine)
    chunks = []
    with db.engine.connect() as connection:
        for table in metadata.sorted_tables:
            chunks.extend(repr(tuple(row)) for row in connection.execute(select(table)))
    db.dispose()
    return "\n".join(chunks)


@pytest.fixture(params=database_kinds())
def any_database_settings(
    request: pytest.FixtureRequest, tmp_path: Path, session_databases: MigratedDatabases
) -> Iterator[Callable[..., Any]]:
    """Run settings on each database engine in turn (the resume's reopen and metric rewind are SQL of both)."""
    with fresh_database(request.param, tmp_path, session_databases) as url:
        yield lambda **overrides: build_settings(tmp_path / "var", url, **{**FAST_LOCAL, **overrides})
        stopped = stop_run_processes(url)
        assert not stopped, f"processes of runs were left running: {stopped}"


def rewards(client: httpx.Client, run_id: str) -> dict[int, float]:
    series = client.get(f"/runs/{run_id}/metrics", params={"name": "reward/mean"}).json()["metrics"]
    return {int(step): value for step, value in series.get("reward/mean", [])}


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


RESUMED_STEPS = 60


def test_a_stopped_run_resumes_and_a_new_run_starts_warm(any_database_settings: Callable[..., Any]) -> None:
    """Stopped halfway, the run resumes from its checkpoint with its optimiser state: same id, its reward curve
    continues where it was (no fall back to the base's), to completion. Then a run warm-started from it begins at
    its reward, not the base's, and shows where it came from."""
    # 60 steps: the stop at step 12 or later must land mid-run, and a step can take 40 ms here, while the metrics
    # that show step 12 reach the service up to a second later
    settings = any_database_settings(local_total_steps=RESUMED_STEPS, local_save_checkpoint_interval=5)
    with in_process_service(settings) as live, live.client() as client:
        run_id = start(client, config={"group_size": 8, "batch_size": 32})["id"]
        wait_until(lambda: max(rewards(client, run_id), default=0) >= 12, timeout=300, message="step 12")
        stopped = client.post(f"/runs/{run_id}/stop", params={"wait_s": 120}).json()
        assert stopped["status"] == "stopped", stopped
        before = rewards(client, run_id)
        last = max(before)
        checkpoints = [c["step"] for c in client.get(f"/runs/{run_id}/results").json()["checkpoints"]]
        assert checkpoints[-1] == last  # the trainer saved one as it stopped

        refused = client.post("/runs/no-such-run/resume")
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "RUN_NOT_FOUND"
        missing = client.post(f"/runs/{run_id}/resume", json={"step": 7})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "CHECKPOINT_NOT_FOUND"
        assert missing.json()["error"]["details"]["available"] == checkpoints
        assert client.get(f"/runs/{run_id}").json()["status"] == "stopped"  # a refused resume changes nothing

        resumed = client.post(f"/runs/{run_id}/resume")
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["id"] == run_id and resumed.json()["status"] in ("pending", "starting", "queued")
        final = wait_for_status(client, run_id, {"completed"}, timeout=300)
        assert final["last_step"] == RESUMED_STEPS and final["failure"] is None
        after = rewards(client, run_id)
        # one history: the steps before the stop kept, the rest after
        assert sorted(after) == list(range(1, RESUMED_STEPS + 1))
        assert all(after[step] == before[step] for step in before)
        base, before_stop = mean([after[s] for s in (1, 2, 3)]), mean([after[s] for s in range(last - 2, last + 1)])
        continued = mean([after[s] for s in range(last + 1, last + 4)])
        print(f"reward: base {base:.2f}, before the stop {before_stop:.2f}, after the resume {continued:.2f}")
        assert continued > base + 0.05, after  # not reset to the base's reward
        archived = client.get(f"/runs/{run_id}/checkpoints/{RESUMED_STEPS}/archive")
        assert archived.status_code == 200 and archived.headers["content-type"] == "application/x-tar"
        with tarfile.open(fileobj=io.BytesIO(archived.content)) as archive:
            assert set(archive.getnames()) >= {f"{run_id}-step_{RESUMED_STEPS}/adapter_model.safetensors"}
            assert not any(name.endswith("optimizer.pt") for name in archive.getnames())
        missing_archive = client.get(f"/runs/{run_id}/checkpoints/7/archive")
        assert missing_archive.status_code == 404
        assert missing_archive.json()["error"]["code"] == "CHECKPOINT_NOT_FOUND"
        pin = f"/runs/{run_id}/checkpoints/{RESUMED_STEPS}/pin"
        assert client.put(pin).json()["pinned"] == [RESUMED_STEPS]
        assert client.put(f"/runs/{run_id}/checkpoints/7/pin").status_code == 404
        assert client.delete(pin).json()["pinned"] == []
        again = client.post(f"/runs/{run_id}/resume")
        assert again.status_code == 409 and again.json()["error"]["code"] == "INVALID_STATE"  # completed

        source = {"run": run_id, "step": RESUMED_STEPS}
        warm = start(client, config={"group_size": 8, "batch_size": 32}, init_from=source)
        assert warm["init_from"] == source
        wait_for_status(client, warm["id"], {"completed"}, timeout=300)
        source_last = mean([after[s] for s in range(RESUMED_STEPS - 2, RESUMED_STEPS + 1)])
        warm_first = mean([rewards(client, warm["id"])[s] for s in (1, 2, 3)])
        print(f"warm start: source's last reward {source_last:.2f}, the new run's first {warm_first:.2f}")
        assert warm_first > base + 0.05 and abs(warm_first - source_last) < 0.2
