"""Runs that train on a trajectory dataset: the refusals made before anything starts, and an offline run through
the real lifecycle (run-api, trainer on the tiny model, the dataset_offline environment), with its held-out
split and its lineage. The online run is in test_dataset_judge_runs.py (its rewards: the judge's and a scorer's)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import yaml

from tests.datasets_api.conftest import succeeded
from tests.runs.conftest import wait_for_status
from tests.support.live import LiveService


def echo_records(prompts: int, per_prompt: int, start: int = 1000) -> list[dict[str, Any]]:
    """`per_prompt` replies to each of `prompts` echo prompts; the first reply of each echoes the digits."""
    records = []
    for p in range(prompts):
        digits = str(start + 37 * p)
        for r in range(per_prompt):
            reply = digits if r == 0 else ("x" * (r + 1))
            records.append(
                {
                    "conversations": [{"from": "human", "value": f"Echo: {digits}"}, {"from": "gpt", "value": reply}],
                    "answer": digits,
                }
            )
    return records


def upload_records(client: httpx.Client, records: list[dict[str, Any]], name: str = "echo") -> dict[str, Any]:
    body = "".join(json.dumps(r) + "\n" for r in records)
    response = client.post("/datasets", params={"name": name, "format": "sharegpt"}, content=body.encode())
    assert response.status_code == 201, response.text
    return response.json()


def score(client: httpx.Client, dataset_id: str) -> str:
    response = client.post(f"/datasets/{dataset_id}/score", json={"rewards": [{"name": "correctness"}]})
    return succeeded(client, response)["dataset_id"]


def start(client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post("/runs", json={"backend": "local", **body})


def error_of(response: httpx.Response) -> dict[str, Any]:
    return response.json()["error"]


def test_a_dataset_that_cannot_train_is_refused_before_anything_starts(run_service: LiveService) -> None:
    with run_service.client() as client:
        unscored = upload_records(client, echo_records(3, 4))["id"]
        response = start(client, dataset={"id": unscored})
        assert response.status_code == 422 and error_of(response)["code"] == "DATASET_NOT_TRAINABLE"
        assert error_of(response)["details"]["reason"] == "not_scored"

        singles = score(client, upload_records(client, echo_records(4, 1), "singles")["id"])
        response = start(client, dataset={"id": singles})
        assert error_of(response)["code"] == "DATASET_NOT_TRAINABLE"
        assert error_of(response)["details"]["reason"] == "groups_too_small"
        assert error_of(response)["details"]["issues"] == {"too_small": 4}

        prompts_only = [{"conversations": [{"from": "human", "value": "hi"}], "metadata": {"reward": 1}}] * 2
        no_reply = upload_records(client, prompts_only, "no-reply")["id"]
        scored_no_reply = score(client, no_reply)
        response = start(client, dataset={"id": scored_no_reply})
        assert error_of(response)["details"]["reason"] == "no_assistant_turn"

        scored = score(client, unscored)
        response = start(client, dataset={"id": scored}, config={"group_size": 4, "batch_size": 32})
        assert error_of(response)["details"]["reason"] == "too_few_groups"  # 3 groups of 4 never fill 32

        for body, status, code in [
            ({"dataset": {"id": "nope"}}, 404, "DATASET_NOT_FOUND"),
            ({"dataset": {"id": scored}, "environment": "echo"}, 422, "VALIDATION_ERROR"),
            ({}, 422, "VALIDATION_ERROR"),
            ({"environment": "dataset_offline"}, 422, "VALIDATION_ERROR"),
            ({"dataset": {"id": scored}, "config": {"groups_path": "/etc/passwd"}}, 422, "FIELD_LOCKED"),
            ({"dataset": {"id": scored}, "config": {"epochs": 0}}, 422, "VALIDATION_ERROR"),
            ({"dataset": {"id": scored}, "config": {"group_size": 3, "batch_size": 8}}, 422, "VALIDATION_ERROR"),
            ({"dataset": {"id": scored, "held_out": 1.0}}, 422, "VALIDATION_ERROR"),
            # this service has no judge: an online run cannot ask for the rewards that need one
            (
                {"dataset": {"id": scored, "mode": "online", "rewards": [{"name": "judge"}]}},
                409,
                "JUDGE_NOT_CONFIGURED",
            ),
            (
                {"dataset": {"id": scored, "mode": "online", "rewards": [{"name": "completion"}]}},
                409,
                "JUDGE_NOT_CONFIGURED",
            ),
        ]:
            response = start(client, **body)
            assert (response.status_code, error_of(response)["code"]) == (status, code), (body, response.text)
        assert client.get("/runs").json()["count"] == 0  # nothing was recorded
        runs_dir = run_service.settings.data_path / "runs"
        assert not runs_dir.exists() or not any(runs_dir.iterdir())  # nor written


def test_an_offline_run_trains_on_the_stored_completions(run_service: LiveService) -> None:
    with run_service.client() as client:
        dataset = score(client, upload_records(client, echo_records(5, 4))["id"])
        response = start(
            client,
            dataset={"id": dataset, "mode": "offline", "held_out": 0.2},
            config={"group_size": 4, "batch_size": 8, "epochs": 2, "seed": 3},
        )
        assert response.status_code == 201, response.text
        created = response.json()
        run_id = created["id"]
        assert (created["environment"], created["dataset_id"], created["dataset_mode"]) == (
            "dataset_offline",
            dataset,
            "offline",
        )
        # 4 training groups x 2 epochs x 4 completions = 32 sequences: 4 batches of 8
        assert created["total_steps"] == 4
        assert created["dataset"]["counts"] == {
            "groups": 5,
            "train_groups": 4,
            "held_out_groups": 1,
            "trainable_groups": 4,
            "smaller_than_group_size": 0,
        }
        merged = yaml.safe_load((run_service.settings.data_path / created["config_path"]).read_text())
        assert merged["env"]["groups_path"].startswith(str(run_service.settings.data_path))
        assert (merged["env"]["epochs"], merged["env"]["total_steps"], merged["tinker"]["total_steps"]) == (2, 4, 4)

        final = wait_for_status(client, run_id, {"completed"}, timeout=300)
        assert final["last_step"] == 4
        series = client.get(f"/runs/{run_id}/metrics").json()["metrics"]
        # every batch holds stored completions with rewards 2, 0, 0, 0: each group trains
        assert [value for _, value in series["batch/skipped_groups"]] == [0.0] * 4
        assert all(value > 0 for _, value in series["batch/trained_tokens"])
        assert [value for _, value in series["reward/mean"]] == [0.5] * 4  # the stored rewards: 2, 0, 0, 0 per group
        results = client.get(f"/runs/{run_id}/results").json()
        assert results["weights"] and (run_service.settings.data_path / results["weights"]).exists()

        held_out = client.get(f"/runs/{run_id}/prompts", params={"split": "held_out"}).json()
        train = client.get(f"/runs/{run_id}/prompts", params={"split": "train"}).json()
        assert (held_out["total"], train["total"]) == (1, 4)
        held_prompt = held_out["prompts"][0]["messages"]
        assert held_prompt[0]["role"] == "user" and held_prompt[0]["content"].startswith("Echo: ")
        assert held_prompt not in [p["messages"] for p in train["prompts"]]

        lineage = client.get(f"/datasets/{dataset}").json()["runs"]
        assert [(r["id"], r["mode"], r["status"]) for r in lineage] == [(run_id, "offline", "completed")]
        listed = client.get("/runs", params={"dataset_id": dataset}).json()["runs"]
        assert [r["id"] for r in listed] == [run_id]
