"""Mixed runs (docs/RUNS.md#mixed-environments): several environments, each with a weight, on one run's
trajectory API. The requests a mix refuses, on both databases; a mixed echo run end to end with real processes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import yaml

from rlctl.service.settings import Settings
from tests.runs.conftest import wait_for_status
from tests.support.live import Service, in_process_service

ECHO = {"name": "echo"}


@pytest.fixture
def service(make_settings: Callable[..., Settings]) -> Service:
    with in_process_service(make_settings()) as live:
        yield live


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        ({"environment": "echo", "environments": [ECHO]}, 422, "VALIDATION_ERROR", None),
        ({"environments": []}, 422, "VALIDATION_ERROR", None),
        ({"environments": [ECHO] * 9}, 422, "VALIDATION_ERROR", None),
        ({"environments": [ECHO, {"name": "echo", "weight": 0}]}, 422, "VALIDATION_ERROR", None),
        ({"environments": [ECHO, {"name": "echo", "weight": -1}]}, 422, "VALIDATION_ERROR", None),
        ({"environments": [ECHO, {"name": "echo", "extra": 1}]}, 422, "VALIDATION_ERROR", None),
        ({"environments": [ECHO, {"name": "nope"}]}, 404, "ENVIRONMENT_NOT_FOUND", None),
        ({"environments": [ECHO, {"name": "dataset_offline"}]}, 422, "VALIDATION_ERROR", "environments[1].name"),
        ({"environments": [ECHO, {"name": "echo", "config": {"total_steps": 3}}]}, 422, "FIELD_LOCKED", "total_steps"),
        ({"environments": [ECHO, {"name": "echo", "config": {"digits": 99}}]}, 422, "VALIDATION_ERROR", "digits"),
        (
            {"environments": [ECHO, {"name": "echo", "config": {"group_size": 4, "batch_size": 16}}]},
            422,
            "VALIDATION_ERROR",
            "environments[1].config.group_size",
        ),
    ],
)
def test_a_bad_mix_is_refused_and_changes_nothing(
    service: Service, body: dict, status: int, code: str, field: str | None
) -> None:
    with service.client() as client:
        response = client.post("/runs", json={"backend": "local", **body})
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["code"] == code
        if field is not None:
            assert error["details"]["field"] == field
        if code in ("FIELD_LOCKED", "ENVIRONMENT_NOT_FOUND") or field == "digits":
            assert error["details"]["environment_index"] == 1
        assert client.get("/runs").json()["count"] == 0
    runs = service.settings.data_path / "runs"
    assert not runs.exists() or not any(runs.iterdir())


def test_a_mixed_run_records_each_environment_and_its_weight(service: Service) -> None:
    mix = [{"name": "echo", "weight": 3}, {"name": "echo", "weight": 1, "config": {"digits": 2, "seed": 7}}]
    with service.client() as client:
        created = client.post("/runs", json={"backend": "local", "environments": mix, "config": {"seed": 1}})
        assert created.status_code == 201, created.text
        run = created.json()
        assert run["environment"] == "echo"
        assert run["environments"] == [
            {"name": "echo", "weight": 3.0, "metric_prefix": "env/0.echo/"},
            {"name": "echo", "weight": 1.0, "metric_prefix": "env/1.echo/"},
        ]
        run_dir = (service.settings.data_path / run["config_path"]).parent
        members = [yaml.safe_load((run_dir / f"config.env{i}.yaml").read_text()) for i in (0, 1)]
        assert [m["env"]["inference_weight"] for m in members] == [3.0, 1.0]
        assert [m["env"]["digits"] for m in members] == [4, 2]
        assert [m["env"]["seed"] for m in members] == [1, 7]  # the run's config, under each one's own edits
        merged = yaml.safe_load((service.settings.data_path / run["config_path"]).read_text())
        assert all(m["tinker"] == merged["tinker"] for m in members)  # the answer shows its paths relative
        assert client.post(f"/runs/{run['id']}/stop", params={"wait_s": 120}).json()["status"] == "stopped"


# Long enough for both environments to be in the batches: they start together, but the first to send fills the
# queue (first come, first served) and on a loaded machine the other's first groups came after a 6-step run ended.
MIXED_STEPS = 24


@pytest.mark.e2e
def test_a_mixed_echo_run_trains_on_both_environments(run_settings: Callable[..., Settings]) -> None:
    mix = [{"name": "echo", "weight": 1}, {"name": "echo", "weight": 1, "config": {"digits": 2, "seed": 7}}]
    body = {"backend": "local", "environments": mix, "config": {"group_size": 8, "batch_size": 32}}
    settings = run_settings(local_total_steps=MIXED_STEPS, local_save_checkpoint_interval=MIXED_STEPS)
    with in_process_service(settings) as run_service, run_service.client() as client:
        created = client.post("/runs", json=body)
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]
        final = wait_for_status(client, run_id, {"completed"}, timeout=300)
        assert {p["role"]: p["status"] for p in final["processes"]} == dict.fromkeys(
            ("api", "trainer", "env"), "exited"
        )
        series = client.get(f"/runs/{run_id}/metrics").json()["metrics"]
        assert len(series["reward/mean"]) == final["last_step"] == MIXED_STEPS
        # The trainer's batches held groups of both environments (by the ids the trajectory API gave them).
        totals = [sum(value for _, value in series[f"batch/groups_env{i}"]) for i in (0, 1)]
        print(f"groups trained per environment over {final['last_step']} steps: {totals}")
        assert all(total > 0 for total in totals), totals
        assert sum(totals) == MIXED_STEPS * 32 // 8  # every group of every batch came from one of them
        # Each environment's own metrics, under its prefix.
        assert {"env/0.echo/train/percent_correct", "env/1.echo/train/percent_correct"} <= set(series)
        log = client.get(f"/runs/{run_id}/logs/env", params={"tail": 400}).text
        assert "2 environments started" in log
