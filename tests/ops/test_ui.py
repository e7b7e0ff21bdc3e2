"""The /ui page: served without a build step, using only the public API; rendered in a real headless Chromium."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import build_settings
from tests.ops.seeding import SeededRun, record_step, seed_run
from tests.support.browser import Browser, chromium_executable, headless_chromium
from tests.support.live import LiveService, live_service
from tests.support.png import read_png
from tests.support.waiting import REQUEST_TIMEOUT

pytestmark = pytest.mark.e2e

TOKEN = "ui-token"
REWARDS = [0.125, 0.25, 0.1875, 0.5, 0.875, 1.0]
LOSSES = [1.5, 1.25, 1.0, 0.75, 0.5, 0.25]
REWARD_COLOUR = bytes((0x25, 0x63, 0xEB))  # the reward curve's stroke, var(--accent) in the page


@pytest.fixture
def chromium() -> str:
    executable = chromium_executable()
    if executable is None:
        if os.environ.get("RLCTL_TEST_REQUIRE_BROWSER") == "1":
            pytest.fail("chromium is required here (RLCTL_TEST_REQUIRE_BROWSER=1) but not installed")
        pytest.skip("chromium is not installed: apt-get install chromium (.ci/run does)")
    return executable


@pytest.fixture
def ui_service(tmp_path: Path) -> Iterator[LiveService]:
    settings = build_settings(tmp_path / "var", f"sqlite:///{tmp_path / 'rlctl.db'}", api_token=TOKEN)
    with live_service(settings) as live:
        yield live


def test_the_page_is_public_static_and_locked_down(ui_service: LiveService) -> None:
    page = httpx.get(f"{ui_service.base_url}/ui", timeout=REQUEST_TIMEOUT)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'sha256-" in policy and "connect-src 'self'" in policy and "unsafe-inline" not in policy
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page.text), "no CDN, no build: everything is inline"
    paths = httpx.get(f"{ui_service.base_url}/openapi.json", timeout=REQUEST_TIMEOUT).json()["paths"]
    assert "/ui" not in paths and "/metrics" not in paths


def test_the_page_plots_a_runs_reward_curve_and_shows_its_state(
    ui_service: LiveService, chromium: str, tmp_path: Path
) -> None:
    settings = ui_service.settings
    seed_run(settings, SeededRun(status="completed", series={"reward/mean": [0.5, 0.75]}))
    run = seed_run(
        settings,
        SeededRun(
            status="running",
            process_status="running",
            total_steps=10,
            series={"reward/mean": REWARDS, "train/loss": LOSSES},
            logs={"trainer": "trainer started\ntrainer at step 6/6 (a line the page must show)\n"},
        ),
    )
    with ui_service.client() as api:
        expected = api.get(f"/runs/{run.id}/metrics", params={"name": ["reward/mean", "train/loss"]}).json()["metrics"]
        datasets_served = api.get("/datasets").status_code != 404
    assert [value for _, value in expected["reward/mean"]] == REWARDS

    with headless_chromium(tmp_path, chromium) as browser:
        browser.navigate(f"{ui_service.base_url}/ui#run={run.id}")
        # The service has a token: a 401 makes the page ask for it.
        browser.wait_for("!document.getElementById('token-form').hidden", timeout=60)
        browser.evaluate(
            f"document.getElementById('token-input').value = {json.dumps(TOKEN)};"
            "document.getElementById('token-form').requestSubmit(); true"
        )
        rendered = f"document.getElementById('run-section').dataset.runId === '{run.id}'"
        browser.wait_for(rendered, timeout=60)

        assert browser.evaluate("document.getElementById('run-state').textContent") == "running"
        assert_curve(browser, "reward-chart", expected["reward/mean"])
        assert_curve(browser, "loss-chart", expected["train/loss"])
        rows = browser.evaluate(
            "[...document.querySelectorAll('#runs-table tbody tr')].map(r => [...r.cells].map(c => c.textContent))"
        )
        assert [row[:6] for row in rows][0] == [run.id, "echo", "local", "running", "6 / 10", "1.000"]
        assert [row[3] for row in rows] == ["running", "completed"]
        processes = browser.evaluate(
            "[...document.querySelectorAll('#processes-table tbody tr')].map(r => [r.cells[0].textContent,"
            " r.cells[2].textContent])"
        )
        assert processes == [["api", "running"], ["trainer", "running"], ["env", "running"]]
        assert "a line the page must show" in browser.evaluate("document.getElementById('log-trainer').textContent")
        assert browser.evaluate("document.getElementById('datasets-section').hidden") is not datasets_served

        # The token is kept in the browser: a reload does not ask again.
        assert browser.evaluate("localStorage.getItem('rlctl.token')") == TOKEN
        browser.navigate(f"{ui_service.base_url}/ui#run={run.id}")
        browser.wait_for(f"document.readyState === 'complete' && {rendered}", timeout=60)
        assert browser.evaluate("document.getElementById('token-form').hidden") is True

        # A running run's page follows it: a new step appears without a reload.
        record_step(settings, run.id, 7, {"reward/mean": 0.9375, "train/loss": 0.125})
        browser.wait_for("JSON.parse(document.getElementById('reward-chart').dataset.points).length === 7", timeout=60)
        assert browser.evaluate("document.querySelector('#runs-table tbody tr').cells[4].textContent") == "7 / 10"

        screenshot = browser.screenshot()
        errors = [e for e in browser.page_errors() if e["params"].get("entry", {}).get("source") != "network"]
    (tmp_path / "ui.png").write_bytes(screenshot)
    image = read_png(screenshot)
    pixels = image.pixels()
    assert image.width >= 800 and len(set(pixels)) > 1, "the screenshot is blank"
    assert sum(p[:3] == REWARD_COLOUR for p in pixels) > 20, "the reward curve is not visible in the screenshot"
    assert not errors, errors  # e.g. a script blocked by the content security policy


def assert_curve(browser: Browser, chart_id: str, series: list[list[float]]) -> None:
    """The chart plots exactly the API's series: one vertex per step, x by step, y by value (SVG y points down)."""
    plotted = json.loads(browser.evaluate(f"document.getElementById('{chart_id}').dataset.points"))
    assert plotted == series
    points = browser.evaluate(f"document.querySelector('#{chart_id} polyline.series').getAttribute('points')")
    vertices = [tuple(float(n) for n in pair.split(",")) for pair in points.split()]
    assert len(vertices) == len(series)
    xs, ys = [x for x, _ in vertices], [y for _, y in vertices]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)
    values = [value for _, value in series]
    for i in range(len(values)):
        for j in range(len(values)):
            if values[i] < values[j]:
                assert ys[i] > ys[j], f"step {series[i][0]} is drawn above a larger value"
    spans = [(ys[i] - ys[0]) / (values[0] - values[i]) for i in range(1, len(values)) if values[i] != values[0]]
    assert max(spans) - min(spans) < 0.01 * max(spans), "y is not linear in the value"  # coordinates are rounded


def test_the_page_shows_queued_runs_with_their_place_in_the_queue(
    ui_service: LiveService, chromium: str, tmp_path: Path
) -> None:
    settings = ui_service.settings
    first = seed_run(settings, SeededRun(status="queued", process_status="pending"))
    second = seed_run(settings, SeededRun(status="queued", process_status="pending"))
    with headless_chromium(tmp_path, chromium) as browser:
        browser.navigate(f"{ui_service.base_url}/ui#run={second.id}")
        browser.wait_for("!document.getElementById('token-form').hidden", timeout=60)
        browser.evaluate(
            f"document.getElementById('token-input').value = {json.dumps(TOKEN)};"
            "document.getElementById('token-form').requestSubmit(); true"
        )
        browser.wait_for(f"document.getElementById('run-section').dataset.runId === '{second.id}'", timeout=60)
        assert browser.evaluate("document.getElementById('run-state').textContent") == "queued #2"
        rows = browser.evaluate(
            "[...document.querySelectorAll('#runs-table tbody tr')].map(r => [r.cells[0].textContent,"
            " r.cells[3].textContent])"
        )
        assert rows == [[second.id, "queued #2"], [first.id, "queued #1"]]
        facts = browser.evaluate("document.getElementById('run-facts').textContent")
        assert "queue position2" in facts
