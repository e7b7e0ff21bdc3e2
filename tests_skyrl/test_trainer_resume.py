"""The trainer process alone against SkyRL, and again after a restart: it resumes from its last checkpoint.

Real processes: `run-api` (atroposlib) and `python -m rlctl.trainer` on the `tinker` backend, pointed at SkyRL. The
test plays the environment: it samples each group through the trainer's inference server (so from SkyRL's
sampler), scores it, and posts it to the API.
"""

from __future__ import annotations

import random
from pathlib import Path

import httpx

from tests.support.live import free_port
from tests.trainer.pipeline import (
    processes,
    start_api,
    start_trainer,
    step_metrics,
    trainer_state,
    wait_for,
    wait_http,
    write_run_yaml,
)
from tests_skyrl.server import SkyRLServer

GROUP_SIZE, BATCH_SIZE = 4, 8


def sampled_group(inference_url: str, rng: random.Random) -> dict:
    """One group as an environment makes it: completions from the served model, scored (here: share of even ids)."""
    prompt = [1] + [rng.randrange(5, 100) for _ in range(4)]
    params = {"n": GROUP_SIZE, "max_new_tokens": 4, "temperature": 1.0}
    results = httpx.post(
        f"{inference_url}/generate", json={"input_ids": prompt, "sampling_params": params}, timeout=300
    )
    results.raise_for_status()
    completions = [[token for _logprob, token, _ in r["meta_info"]["output_token_logprobs"]] for r in results.json()]
    logprobs = [[logprob for logprob, _token, _ in r["meta_info"]["output_token_logprobs"]] for r in results.json()]
    return {
        "tokens": [prompt + c for c in completions],
        "masks": [[-100] * len(prompt) + c for c in completions],
        "scores": [sum(token % 2 == 0 for token in c) / len(c) for c in completions],
        "inference_logprobs": [[1.0] * len(prompt) + lp for lp in logprobs],
    }


def post_batch(api_url: str, inference_url: str, rng: random.Random) -> None:
    for _ in range(BATCH_SIZE // GROUP_SIZE):
        httpx.post(f"{api_url}/scored_data", json=sampled_group(inference_url, rng)).raise_for_status()


def test_the_trainer_trains_on_skyrl_and_resumes(skyrl: SkyRLServer, tmp_path: Path) -> None:
    api_port, inference_port = free_port(), free_port()
    run_dir = tmp_path / "run"
    tinker = {"backend": "tinker", "base_model": str(skyrl.model_dir), "save_checkpoint_interval": 2}
    sizes = {"group_size": GROUP_SIZE, "batch_size": BATCH_SIZE}
    run = {"model_dir": skyrl.model_dir, "api_port": api_port, "inference_port": inference_port, **sizes}
    config = write_run_yaml(run_dir, total_steps=2, tinker=tinker, **run)
    environment = skyrl.client_environment(tmp_path / "var")
    api_url, inference_url = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{inference_port}"
    rng = random.Random(0)
    with processes() as start:
        start_api(start, run_dir, api_port, environment)
        trainer = start_trainer(start, config, environment)
        wait_http(f"{inference_url}/health", trainer, 300)
        for step in (1, 2):  # each batch sampled from the newest weights: on-policy, so logprobs/diff is ~0
            post_batch(api_url, inference_url, rng)
            wait_for(lambda step=step: len(step_metrics(run_dir)) == step, 600, f"step {step}")
        assert trainer.wait(600) == 0, trainer.log_tail()
        first = trainer_state(run_dir)
        assert "tinker protocol: legacy" in trainer.log_text()

        write_run_yaml(run_dir, total_steps=3, tinker=tinker, **run)
        resumed = start_trainer(start, config, environment, name="trainer-resumed")
        wait_http(f"{inference_url}/health", resumed, 300)
        post_batch(api_url, inference_url, rng)
        assert resumed.wait(600) == 0, resumed.log_tail()

    assert first["status"] == "completed" and first["step"] == 2 and first["backend"] == "tinker"
    assert [c["step"] for c in first["checkpoints"]] == [2]
    assert first["checkpoints"][0]["path"].startswith("tinker://")
    assert "resuming from the checkpoint of step 2" in resumed.log_text()
    state = trainer_state(run_dir)
    assert state["status"] == "completed" and state["step"] == 3
    assert [c["step"] for c in state["checkpoints"]] == [2, 3]
    assert state["weights"].startswith("tinker://") and state["weights"].endswith("step_3")
    assert {w["parameter"] for w in state["warnings"]} >= {"lora_config.train_unembed", "adam_params.grad_clip_norm"}

    records = step_metrics(run_dir)
    assert [record["step"] for record in records] == [1, 2, 3]
    for record in records:  # SkyRL's sampler and its trainer agree on the rollouts' logprobs
        assert abs(record["metrics"]["logprobs/diff"]) < 1e-3, record["metrics"]
        assert record["metrics"]["batch/sequences"] == BATCH_SIZE
