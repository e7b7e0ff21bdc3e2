"""The probe listener (`RLCTL_PROBE_PORT`, rlctl/service/health/listener.py): /healthz and /readyz on a port of
their own, answered by a process of their own, so that an orchestrator's probes never queue behind requests on the
event loop; its /healthz still fails once the event loop stops running. The service is real, served by uvicorn on
loopback; the listener is its real child process; the stall is a real blocked event loop."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import httpx
import psutil
import pytest

from rlctl.service.health.listener import ProbeListener
from rlctl.service.health.readiness import ReadinessMonitor
from rlctl.service.settings import Settings
from tests.support.live import live_service
from tests.support.waiting import REQUEST_TIMEOUT, scaled, wait_until

STALL_S = 1.0


def test_the_probe_listener_answers_as_the_api_does_and_fails_liveness_while_the_loop_is_stalled(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(probe_port=0, probe_stall_s=STALL_S)
    with live_service(settings) as live, live.anonymous() as api:
        context = live.app.state.context
        listener = ProbeListener.of(context)
        port, pid = listener.port, listener.pid
        probes = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=REQUEST_TIMEOUT)
        with probes:
            # the same answers as the API's probes, without a token
            assert probes.get("/healthz").json() == api.get("/healthz").json() == {"status": "ok"}
            ready = probes.get("/readyz")
            assert ready.status_code == 200 and ready.json() == api.get("/readyz").json()
            assert ready.json()["database"] == "ok"
            missing = probes.get("/runs")
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "NOT_FOUND"

            # the event loop blocked (what a wedged handler does): the listener still answers, and says so
            stall = max(scaled(6.0), 4 * STALL_S)
            loop = ReadinessMonitor.of(context)._task.get_loop()  # the service's event loop
            loop.call_soon_threadsafe(time.sleep, stall)

            # neither live nor ready: the readiness it holds is as old as the loop's last turn
            def both_stalled() -> list[httpx.Response] | None:
                found = [probes.get("/healthz"), probes.get("/readyz")]
                return found if all(answer.status_code == 503 for answer in found) else None

            answers = wait_until(
                both_stalled, timeout=stall, message="the probe listener reports the stalled event loop on both probes"
            )
            for stalled in answers:
                assert stalled.json()["error"] == {
                    "code": "UNAVAILABLE",
                    "message": "event loop stalled",
                    "details": {"seconds_since_tick": stalled.json()["error"]["details"]["seconds_since_tick"]},
                }
                assert stalled.json()["error"]["details"]["seconds_since_tick"] >= STALL_S
            # once the loop runs again, it is live and ready again
            wait_until(
                lambda: probes.get("/healthz").status_code == probes.get("/readyz").status_code == 200,
                timeout=stall + scaled(30),
            )
    # the listener ends with the service: its process is gone and its port closed
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_without_a_probe_port_there_is_no_listener(make_settings: Callable[..., Settings]) -> None:
    with live_service(make_settings()) as live, pytest.raises(LookupError):
        ProbeListener.of(live.app.state.context)
