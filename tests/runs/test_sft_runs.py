"""Supervised warm-up (docs/RUNS.md#supervised-warm-up): a dataset run in `sft` mode trains the cross-entropy of
the best-scored stored completions of each group. The requests it refuses, on both databases; an sft run through
the real lifecycle whose loss on the kept completions falls."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import yaml

from rlctl.service.settings import Settings
from tests.runs.conftest import wait_for_status
from tests.runs.test_dataset_runs import echo_records, score, start, upload_records
from tests.support.live import LiveService, Service, in_process_service


@pytest.fixture
def service(make_settings: Callable[..., Settings]) -> Service:
    # A key, so that the tinker backend gets as far as the sft rule (no call reaches Tinker: the run is refused).
    with in_process_service(make_settings(tinker_api_key="tml-placeholder-not-a-key")) as live:
        yield live


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"dataset": {"id": "d1", "mode": "offline", "top_n": 2}}, "VALIDATION_ERROR", None),
        ({"dataset": {"id": "d1", "mode": "sft", "top_n": 0}}, "VALIDATION_ERROR", None),
        ({"dataset": {"id": "d1", "mode": "sft"}, "config": {"loss_fn": "ppo"}}, "FIELD_LOCKED", "loss_fn"),
        (
            {"dataset": {"id": "d1", "mode": "sft"}, "config": {"advantage_normalization": "mean_std"}},
            "FIELD_LOCKED",
            "advantage_normalization",
        ),
        ({"dataset": {"id": "d1", "mode": "sft"}, "backend": "tinker"}, "VALIDATION_ERROR", "backend"),
        ({"dataset": {"id": "d1", "mode": "sft"}, "config": {"sft_top_n": 3}}, "FIELD_LOCKED", "sft_top_n"),
    ],
)
def test_a_bad_sft_request_is_refused_and_changes_nothing(
    service: Service, body: dict, code: str, field: str | None
) -> None:
    with service.client() as client:
        response = client.post("/runs", json={"backend": "local", **body})
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == code
        if field is not None:
            assert error["details"]["field"] == field
        assert client.get("/runs").json()["count"] == 0


@pytest.mark.e2e
def test_an_sft_run_lowers_the_loss_of_the_kept_completions(run_service: LiveService) -> None:
    with run_service.client() as client:
        # 4 replies per prompt, the first echoing its digits (correctness 1), the others not (0)
        dataset = score(client, upload_records(client, echo_records(4, 4))["id"])
        response = start(
            client,
            dataset={"id": dataset, "mode": "sft", "top_n": 1},
            config={"group_size": 4, "batch_size": 8, "epochs": 6, "seed": 3},
        )
        assert response.status_code == 201, response.text
        created = response.json()
        assert (created["environment"], created["dataset_mode"]) == ("dataset_offline", "sft")
        merged = yaml.safe_load((run_service.settings.data_path / created["config_path"]).read_text())
        assert merged["env"]["sft_top_n"] == 1
        assert (merged["tinker"]["loss_fn"], merged["tinker"]["advantage_normalization"]) == ("cross_entropy", "none")
        assert created["total_steps"] == 4 * 6 * 4 // 8

        final = wait_for_status(client, created["id"], {"completed"}, timeout=300)
        series = client.get(f"/runs/{created['id']}/metrics").json()["metrics"]
        # one kept completion per group of 4: the scores the trainer saw
        assert [value for _, value in series["reward/mean"]] == [0.25] * final["last_step"]
        losses = [value for _, value in series["train/loss"]]
        print(f"sft: cross-entropy per completion token, first step {losses[0]:.3f}, last {losses[-1]:.3f}: {losses}")
        assert sum(losses[-3:]) / 3 < 0.5 * losses[0], losses
        lineage = client.get(f"/datasets/{dataset}").json()["runs"]
        assert [(r["id"], r["mode"]) for r in lineage] == [(created["id"], "sft")]

        # The recipe: GRPO from the SFT run's weights (a warm start, docs/RUNS.md#resume-and-warm-start).
        grpo = client.post(
            "/runs",
            json={"environment": "echo", "backend": "local", "init_from": {"run": created["id"]}},
        )
        assert grpo.status_code == 201, grpo.text
        assert grpo.json()["init_from"] == {"run": created["id"], "step": final["last_step"]}
        assert wait_for_status(client, grpo.json()["id"], {"completed"}, timeout=300)["last_step"] == 6
