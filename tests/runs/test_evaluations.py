"""The proof, offline with the tiny model: a run trained on a scored echo dataset beats the base model on the
dataset's held-out prompts, by a 95 % bootstrap interval above zero; and the evaluation's own rules."""

from __future__ import annotations

from typing import Any

from service.evaluations.stats import compare, prompt_means
from tests.datasets_api.conftest import wait_job
from tests.runs.conftest import wait_for_status
from tests.runs.test_dataset_runs import error_of, start, upload_records
from tests.support.live import LiveService
from tests.support.waiting import wait_until


def varied_echo_records(prompts: int) -> list[dict[str, Any]]:
    """Four replies per echo prompt, from the digits themselves to none of them: rewards differ in every group."""
    records = []
    for p in range(prompts):
        digits = f"{(7919 * (p + 3)) % 10000:04d}"
        for reply in (digits, digits[:2] + "ab", "a" + digits[2:] + "c", "wxyz"):
            records.append(
                {
                    "conversations": [{"from": "human", "value": f"Echo: {digits}"}, {"from": "gpt", "value": reply}],
                    "answer": digits,
                }
            )
    return records


def test_bootstrap_comparison_is_paired_by_prompt() -> None:
    base = prompt_means({0: [0.0, 0.2], 1: [0.5], 2: [0.1, 0.1]})
    better = prompt_means({0: [0.6, 0.6], 1: [0.9], 2: [0.4, 0.2], 3: [1.0]})  # prompt 3: base never answered
    found = compare(base, better, seed=1)
    assert round(found.mean_difference, 6) == round((0.5 + 0.4 + 0.2) / 3, 6)
    assert 0 < found.interval[0] <= found.mean_difference <= found.interval[1]
    assert (found.wins, found.ties, found.losses, found.win_rate) == (3, 0, 0, 1.0)
    same = compare(base, base)
    assert (same.mean_difference, same.interval, same.win_rate) == (0.0, (0.0, 0.0), 0.5)


def test_the_trained_checkpoint_beats_the_base_on_held_out_prompts(run_service: LiveService) -> None:
    with run_service.client() as client:
        scored = client.post(
            f"/datasets/{upload_records(client, varied_echo_records(24))['id']}/score",
            json={"rewards": [{"name": "echo"}]},
        )
        dataset = wait_job(client, scored.json())["result"]["dataset_id"]
        created = start(
            client,
            dataset={"id": dataset, "held_out": 0.25},
            config={"group_size": 4, "batch_size": 16, "epochs": 4},
        ).json()
        run_id = created["id"]
        assert created["total_steps"] == 18 * 4 * 4 // 16
        wait_for_status(client, run_id, {"completed"}, timeout=600)

        too_soon = client.post("/evaluations", json={"run_id": run_id, "steps": [5]})
        assert too_soon.status_code == 422 and error_of(too_soon)["details"]["available"] == [3, 6, 9, 12, 15, 18]
        no_rewards = client.post("/evaluations", json={"run_id": run_id})  # an offline run has no rewards of its own
        assert no_rewards.status_code == 422 and error_of(no_rewards)["details"]["field"] == "rewards"
        assert client.post("/evaluations", json={"run_id": "nope"}).status_code == 404

        response = client.post(
            "/evaluations",
            json={"run_id": run_id, "rewards": [{"name": "echo"}], "samples_per_prompt": 4, "max_tokens": 8},
        )
        assert response.status_code == 202, response.text
        evaluation = response.json()

        def ended() -> dict[str, Any] | None:
            current = client.get(f"/evaluations/{evaluation['id']}").json()
            return current if current["status"] in ("succeeded", "failed", "cancelled") else None

        done = wait_until(ended, timeout=300, message="evaluation ends")
        assert done["status"] == "succeeded", done["error"]
        base, trained = done["models"]
        assert (base["name"], trained["name"]) == ("base", "step_18")
        assert base["samples"] == trained["samples"] == 6 * 4  # 6 held-out prompts x 4 samples
        assert trained["mean_reward"] > base["mean_reward"]
        assert trained["interval"][0] > 0, done["models"]  # the 95 % interval of the difference is above zero
        assert trained["win_rate"] > 0.5
        assert len(done["prompts"]) == 6 and set(done["prompts"][0]["rewards"]) == {"base", "step_18"}
        assert done["progress"]["done"] == done["progress"]["total"] == 48
