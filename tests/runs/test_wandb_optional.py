"""W&B never blocks or fails a run (docs/RUNS.md#wb-mirror).

W&B is a paid remote service, so it is played by a stand-in that is a real HTTP server on loopback
(tests/support/wandb_standin.py): the faults are those of real sockets (a refused port, a port that accepts and
never answers, a 401), which a mocked client library would never show. Everything else is real: the service,
its run processes, the wandb library in the trainer and the environment.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlctl.service.runs.wandb import Probe, WandbMode, plan_wandb, probe_wandb
from tests.runs.conftest import wait_for_status
from tests.support.live import live_service
from tests.support.wandb_standin import WandbStandin, refusing_url

KEY = "PLANTED-wandb-key-0123456789abcdef0123"  # never a real key; must never reach a response or a file
CHECK_TIMEOUT_S = 1.0
# Creating a run waits for W&B at most the check's time-out; the rest is the service's own work on a shared CPU
# (the environment's config schema is read before the clock starts). A check that waited for a black hole
# without a time-out would take minutes.
CREATE_BOUND_S = CHECK_TIMEOUT_S + 30


def warm(client: Any) -> None:
    """Read the environment's config schema once (a child process) so that creation times only the run."""
    assert client.get("/environments/echo").status_code == 200


def settings_for(run_settings: Callable[..., Any], base_url: str) -> Any:
    return run_settings(wandb_api_key=KEY, wandb_base_url=base_url, wandb_check_timeout_s=CHECK_TIMEOUT_S)


@pytest.mark.parametrize(
    ("fault", "outcome"),
    [
        ("refuse", Probe.UNREACHABLE),
        ("silent", Probe.UNREACHABLE),
        ("reject", Probe.REJECTED),
        ("accept", Probe.ACCEPTED),
    ],
)
def test_the_key_check_answers_within_its_time_out(
    run_settings: Callable[..., Any], fault: str, outcome: Probe
) -> None:
    # the settings are built before the clock starts: the first of a session builds its tiny model
    if fault == "refuse":
        settings = settings_for(run_settings, refusing_url())
        started = time.monotonic()
        result = probe_wandb(settings)
        elapsed = time.monotonic() - started
    else:
        with WandbStandin(fault) as standin:  # type: ignore[arg-type]
            settings = settings_for(run_settings, standin.url)
            started = time.monotonic()
            result = probe_wandb(settings)
            elapsed = time.monotonic() - started
    assert result is not None and result.outcome == outcome, result
    assert elapsed < CHECK_TIMEOUT_S + 5
    assert KEY not in result.detail


def test_the_mode_follows_the_server_and_the_check() -> None:
    rejected = plan_wandb(True, False, probe_wandb_result(Probe.REJECTED))
    assert rejected.mode == WandbMode.OFFLINE and rejected.warning_code == "wandb_key_rejected"
    unreachable = plan_wandb(True, False, probe_wandb_result(Probe.UNREACHABLE))
    assert unreachable.mode == WandbMode.OFFLINE and unreachable.warning_code == "wandb_unreachable"
    assert plan_wandb(True, False, probe_wandb_result(Probe.ACCEPTED)).mode == WandbMode.ONLINE
    assert plan_wandb(False, False, None).mode == WandbMode.DISABLED
    assert plan_wandb(True, True, None).mode == WandbMode.OFFLINE  # the operator's WANDB_MODE=offline wins
    record = unreachable.record(Path("/data/runs/abc"))
    assert record["offline_dir"] == "/data/runs/abc/wandb"
    assert record["sync_command"] == "wandb sync /data/runs/abc/wandb/offline-run-*"


def probe_wandb_result(outcome: Probe):  # type: ignore[no-untyped-def]
    from rlctl.service.runs.wandb import ProbeResult

    return ProbeResult(outcome, "detail")


@pytest.mark.parametrize(("fault", "code"), [("refuse", "wandb_unreachable"), ("reject", "wandb_key_rejected")])
def test_a_bad_wandb_is_a_warning_on_the_new_run_not_a_failure(
    run_settings: Callable[..., Any], fault: str, code: str
) -> None:
    def create(base_url: str) -> dict:
        with live_service(settings_for(run_settings, base_url)) as live, live.client() as client:
            warm(client)
            started = time.monotonic()
            response = client.post("/runs", json={"environment": "echo", "backend": "local"})
            assert time.monotonic() - started < CREATE_BOUND_S
            assert response.status_code == 201, response.text
            run = response.json()
            assert client.post(f"/runs/{run['id']}/stop", params={"wait_s": 120}).json()["status"] == "stopped"
            return run

    if fault == "refuse":
        run = create(refusing_url())
    else:
        with WandbStandin("reject") as standin:
            run = create(standin.url)
            assert ("POST", "/graphql") in standin.requests
    assert [w["code"] for w in run["warnings"]] == [code]
    assert run["wandb"]["mode"] == "offline" and run["wandb"]["offline_dir"] == f"runs/{run['id']}/wandb"
    assert f"wandb sync runs/{run['id']}/wandb" in run["warnings"][0]["message"] and KEY not in str(run)


def test_a_run_trains_to_the_end_while_wandb_never_answers(run_settings: Callable[..., Any]) -> None:
    """The fault that used to hold a run in `starting` for ten minutes: W&B accepts connections and never
    answers. The run must complete with W&B offline, its own metrics complete."""
    with WandbStandin("silent") as standin:
        settings = settings_for(run_settings, standin.url)
        with live_service(settings) as live, live.client() as client:
            warm(client)
            started = time.monotonic()
            response = client.post("/runs", json={"environment": "echo", "backend": "local"})
            assert response.status_code == 201, response.text
            assert time.monotonic() - started < CREATE_BOUND_S
            run_id = response.json()["id"]
            assert [w["code"] for w in response.json()["warnings"]] == ["wandb_unreachable"]
            final = wait_for_status(client, run_id, {"completed"}, timeout=400)
            series = client.get(f"/runs/{run_id}/metrics").json()["metrics"]
            assert final["last_step"] == 6 and len(series["reward/mean"]) == 6
            assert "train/percent_correct" in series  # the environment's metrics too
            offline_dir = settings.data_path / final["wandb"]["offline_dir"]
            assert list(offline_dir.glob("offline-run-*")), "no offline W&B files where the run says they are"
            config = (settings.data_path / final["config_path"]).read_text()
        texts = [p.read_text(errors="replace") for p in settings.data_path.rglob("*") if p.suffix in (".log", ".yaml")]
    assert config.count("use_wandb: true") == 1
    assert not any(KEY in text for text in texts)
