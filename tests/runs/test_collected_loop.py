"""The whole loop on trajectories the base model wrote itself, offline with the tiny model and no keys: serve the
base model (`rlctl model serve`, a real process), collect several answers per echo prompt through POST /collections,
score them with the `echo` reward, train offline on them, and evaluate the trained checkpoint against the base on
held-out prompts (docs/EVALUATIONS.md#the-proof-in-the-test-suite), with the evaluation's own checks on the way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rlctl.trainer.tiny_model import init_tiny_model
from tests.datasets_api.conftest import succeeded
from tests.runs.conftest import wait_for_status
from tests.runs.test_dataset_runs import error_of
from tests.support.live import in_process_service
from tests.support.served_model import echo_collection, served_model
from tests.support.waiting import wait_until

PROMPTS = 16
SAMPLES = 8  # answers per prompt: a group for GRPO


@pytest.mark.e2e
def test_trajectories_collected_from_the_served_base_model_train_a_checkpoint_that_beats_it(
    run_settings: Callable[..., Any],
) -> None:
    settings = run_settings()
    model_dir = init_tiny_model(settings.tiny_model_dir, seed=0)  # the base model of the service's local runs
    with served_model(str(model_dir)) as base_url, in_process_service(settings) as live, live.client() as client:
        body = echo_collection(base_url, model_dir, PROMPTS, SAMPLES)
        created = client.post("/collections", json=body)
        assert created.status_code == 202, created.text

        def collected() -> dict[str, Any] | None:
            found = client.get(f"/collections/{created.json()['id']}").json()
            return found if found["status"] in ("completed", "failed") else None

        collection = wait_until(collected, timeout=180, message="collection ends")
        assert collection["status"] == "completed", collection["error"]
        assert collection["progress"]["kept"] == PROMPTS * SAMPLES

        score = client.post(f"/datasets/{collection['dataset_id']}/score", json={"rewards": [{"name": "echo"}]})
        scored = succeeded(client, score)
        rewards = scored["report"]["rewards"]
        assert rewards["count"] == PROMPTS * SAMPLES and rewards["std"] > 0  # the samples differ: there is signal

        run = client.post(
            "/runs",
            json={
                "backend": "local",
                "dataset": {"id": scored["dataset_id"], "held_out": 0.25},
                "config": {"group_size": SAMPLES, "batch_size": 16, "epochs": 3},
            },
        )
        assert run.status_code == 201, run.text
        run_id = run.json()["id"]
        assert run.json()["total_steps"] == 12 * SAMPLES * 3 // 16  # 12 training prompts, 3 epochs, 16 per step
        wait_for_status(client, run_id, {"completed"}, timeout=600)

        # The evaluation's own checks: a step without a checkpoint, an offline run's missing rewards, no such run.
        too_soon = client.post("/evaluations", json={"run_id": run_id, "steps": [5]})
        assert too_soon.status_code == 422 and error_of(too_soon)["details"]["available"] == [3, 6, 9, 12, 15, 18]
        no_rewards = client.post("/evaluations", json={"run_id": run_id})  # an offline run has no rewards of its own
        assert no_rewards.status_code == 422 and error_of(no_rewards)["details"]["field"] == "rewards"
        assert client.post("/evaluations", json={"run_id": "nope"}).status_code == 404

        response = client.post(
            "/evaluations",
            json={"run_id": run_id, "rewards": [{"name": "echo"}], "samples_per_prompt": 8, "max_tokens": 8},
        )
        assert response.status_code == 202, response.text

        def evaluated() -> dict[str, Any] | None:
            found = client.get(f"/evaluations/{response.json()['id']}").json()
            return found if found["status"] in ("succeeded", "failed", "cancelled") else None

        done = wait_until(evaluated, timeout=300, message="evaluation ends")
    assert done["status"] == "succeeded", done["error"]
    base, trained = done["models"]
    assert (base["name"], trained["name"]) == ("base", "step_18")
    assert base["samples"] == trained["samples"] == 4 * 8  # 4 held-out prompts x 8 samples
    assert trained["mean_reward"] > base["mean_reward"], done["models"]
    assert trained["interval"][0] > 0, done["models"]  # the 95 % interval of the difference is above zero
    assert trained["win_rate"] > 0.5, done["models"]
    assert len(done["prompts"]) == 4 and set(done["prompts"][0]["rewards"]) == {"base", "step_18"}
    assert done["progress"]["done"] == done["progress"]["total"] == 2 * 4 * 8
