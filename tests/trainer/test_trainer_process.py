"""`python -m rlctl.trainer` as a real process against the real Atropos API (`run-api`); the test plays the
environment's part by posting scored groups to the API, so the trainer's behaviour is checked step by step:
metrics, waiting reports, SIGTERM, checkpoints and resume."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import httpx
import pytest

from tests.support.live import free_port
from tests.support.waiting import REQUEST_TIMEOUT
from tests.trainer.pipeline import (
    child_environment,
    metric_lines,
    processes,
    start_api,
    start_trainer,
    step_metrics,
    trainer_state,
    wait_for,
    wait_http,
    wait_registered,
    write_run_yaml,
)

REQUIRED_METRICS = {
    "train/loss",
    "train/learning_rate",
    "reward/mean",
    "logprobs/mean",
    "logprobs/mean_training",
    "logprobs/diff",
    "advantages/mean",
    "advantages/std",
    "time/step_s",
    "throughput/tokens_per_s",
}
GROUP_SIZE, BATCH_SIZE = 4, 8


def scored_group(rng: random.Random, with_logprobs: bool) -> dict:
    """A group as an environment would send it: prompt tokens masked with -100, varied scores."""
    prompt = [1] + [rng.randrange(5, 100) for _ in range(6)]
    tokens, masks, logprobs = [], [], []
    for _ in range(GROUP_SIZE):
        completion = [rng.randrange(5, 100) for _ in range(rng.randint(2, 5))]
        tokens.append(prompt + completion)
        masks.append([-100] * len(prompt) + completion)
        logprobs.append([1.0] * len(prompt) + [-4.6] * len(completion))
    group = {"tokens": tokens, "masks": masks, "scores": [rng.random() for _ in range(GROUP_SIZE)]}
    if with_logprobs:
        group["inference_logprobs"] = logprobs
    return group


def post_batch(api_url: str, rng: random.Random, with_logprobs: bool = True) -> None:
    for _ in range(BATCH_SIZE // GROUP_SIZE):
        response = httpx.post(f"{api_url}/scored_data", json=scored_group(rng, with_logprobs), timeout=REQUEST_TIMEOUT)
        response.raise_for_status()


def steps_done(run_dir: Path) -> list[int]:
    return [record["step"] for record in step_metrics(run_dir)]


@pytest.mark.e2e
def test_trainer_trains_reports_waiting_stops_on_sigterm_and_resumes(tiny_model_dir: Path, tmp_path: Path) -> None:
    api_port, inference_port = free_port(), free_port()
    run_dir = tmp_path / "run"
    config = write_run_yaml(
        run_dir,
        model_dir=tiny_model_dir,
        api_port=api_port,
        inference_port=inference_port,
        total_steps=4,
        group_size=GROUP_SIZE,
        batch_size=BATCH_SIZE,
        tinker={"save_checkpoint_interval": 2, "waiting_report_interval_s": 0.5},
    )
    environment = child_environment(tmp_path / "var")
    api_url = f"http://127.0.0.1:{api_port}"
    rng = random.Random(0)
    with processes() as start:
        start_api(start, run_dir, api_port, environment)
        trainer = start_trainer(start, config, environment)
        wait_http(f"http://127.0.0.1:{inference_port}/health", trainer, 90)

        waiting = wait_for(
            lambda: [r for r in metric_lines(run_dir) if r.get("event") == "waiting_for_rollouts"],
            30,
            "a waiting_for_rollouts report",
        )
        assert waiting[0]["waited_s"] >= 0.5 and waiting[0]["step"] == 0
        assert "waiting for rollouts" in trainer.log_text()

        post_batch(api_url, rng, with_logprobs=False)  # the trainer computes sampler logprobs itself
        post_batch(api_url, rng)
        post_batch(api_url, rng)
        wait_for(lambda: steps_done(run_dir) == [1, 2, 3], 60, "three steps")
        for record in step_metrics(run_dir):
            assert record["metrics"].keys() >= REQUIRED_METRICS
            assert record["metrics"]["batch/sequences"] == BATCH_SIZE
        health = httpx.get(f"http://127.0.0.1:{inference_port}/health", timeout=REQUEST_TIMEOUT).json()
        assert health["weights_version"] == 3  # published after every step

        trainer.signal_group(signal.SIGTERM)
        assert trainer.wait(60) == 0
        state = trainer_state(run_dir)
        assert state["status"] == "stopped" and state["step"] == 3
        assert [c["step"] for c in state["checkpoints"]] == [2, 3]  # by interval, then at the stop
        assert Path(state["weights"]).name == "step_3" and Path(state["weights"]).is_dir()

        resumed = start_trainer(start, config, environment, name="trainer-resumed")
        wait_http(f"http://127.0.0.1:{inference_port}/health", resumed, 90)
        assert (
            httpx.get(f"http://127.0.0.1:{inference_port}/health", timeout=REQUEST_TIMEOUT).json()["weights_version"]
            == 3
        )
        # The API forgets its trainer on /reset_data and answers /batch with 500 until it registers again.
        httpx.get(f"{api_url}/reset_data", timeout=REQUEST_TIMEOUT).raise_for_status()
        wait_for(lambda: "registering again" in resumed.log_text(), 30, "the trainer to register again")
        wait_for(
            lambda: httpx.get(f"{api_url}/info", timeout=REQUEST_TIMEOUT).json()["batch_size"] == BATCH_SIZE,
            30,
            "registration",
        )
        post_batch(api_url, rng)
        assert resumed.wait(90) == 0
        assert "resuming from the checkpoint of step 3" in resumed.log_text()

    state = trainer_state(run_dir)
    assert state["status"] == "completed" and state["step"] == 4 and state["total_steps"] == 4
    assert [c["step"] for c in state["checkpoints"]] == [2, 3, 4]
    assert steps_done(run_dir) == [1, 2, 3, 4]  # appended across both processes, each step once


def test_bad_configuration_exits_with_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("tinker:\n  run_dir: /tmp/x\n  total_steps: many\n")
    with processes() as start:
        trainer = start_trainer(start, config, child_environment(tmp_path / "var"))
        assert trainer.wait(60) == 2
        assert "invalid run configuration" in trainer.log_text()


@pytest.mark.parametrize("key", [None, ""])
def test_tinker_backend_without_api_key_fails_clearly(tiny_model_dir: Path, tmp_path: Path, key: str | None) -> None:
    run_dir = tmp_path / "run"
    config = write_run_yaml(
        run_dir,
        model_dir=tiny_model_dir,
        api_port=free_port(),
        inference_port=free_port(),
        total_steps=2,
        tinker={"backend": "tinker"},
    )
    environment = child_environment(tmp_path / "var")
    if key is not None:
        environment["TINKER_API_KEY"] = key
    with processes() as start:
        trainer = start_trainer(start, config, environment)
        assert trainer.wait(60) == 1
        assert "TINKER_API_KEY is not set" in trainer.log_text()
    state = trainer_state(run_dir)
    assert state["status"] == "failed" and "TINKER_API_KEY" in state["error"]


def rewarded_group(rng: random.Random, level: float) -> dict:
    """A group whose scores average `level`, spread a little so that it trains."""
    group = scored_group(rng, with_logprobs=True)
    group["scores"] = [level - 0.05, level + 0.05, level - 0.02, level + 0.02]
    return group


def test_a_collapse_is_flagged_and_stop_on_collapse_ends_the_run_keeping_the_best_weights(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    api_port, inference_port = free_port(), free_port()
    run_dir = tmp_path / "run"
    config = write_run_yaml(
        run_dir,
        model_dir=tiny_model_dir,
        api_port=api_port,
        inference_port=inference_port,
        total_steps=20,
        group_size=GROUP_SIZE,
        batch_size=BATCH_SIZE,
        tinker={"save_checkpoint_interval": 2, "collapse_steps": 2, "stop_on_collapse": True},
    )
    environment = child_environment(tmp_path / "var")
    api_url = f"http://127.0.0.1:{api_port}"
    rng = random.Random(0)
    levels = [0.6, 0.6, 0.8, 0.8, 0.7, 0.7, 0.0, 0.0]  # the collapse begins at step 7
    with processes() as start:
        start_api(start, run_dir, api_port, environment)
        trainer = start_trainer(start, config, environment)
        wait_registered(api_url, trainer, 90)
        for step, level in enumerate(levels, start=1):  # one batch per step, in order
            for _ in range(BATCH_SIZE // GROUP_SIZE):
                httpx.post(
                    f"{api_url}/scored_data", json=rewarded_group(rng, level), timeout=REQUEST_TIMEOUT
                ).raise_for_status()
            wait_for(lambda step=step: len(steps_done(run_dir)) >= step, 60, f"step {step}")
        assert trainer.wait(120) == 1, trainer.log_tail()
    state = trainer_state(run_dir)
    assert state["status"] == "failed" and state["failure_kind"] == "collapsed", state.get("error")
    rewards = [(r["step"], round(r["metrics"]["reward/mean"], 3)) for r in step_metrics(run_dir)]
    assert state["step"] == 8, rewards
    assert state["collapse"]["step"] == 7 and state["collapse"]["detected_at"] == 8
    assert state["collapse"]["reason"] == "reward_drop"
    assert state["best_checkpoint"]["step"] == 4 and Path(state["best_checkpoint"]["weights"]).is_dir()
    assert Path(state["weights"]).name == "step_8"  # the final weights are reported too, apart from the best
    events = [r for r in metric_lines(run_dir) if r.get("event") == "collapse"]
    assert [(e["step"], e["collapse"]["step"]) for e in events] == [(8, 7)]


def test_a_batch_with_fields_the_trainer_cannot_honour_fails_the_run_unsupported_batch(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    api_port, inference_port = free_port(), free_port()
    run_dir = tmp_path / "run"
    config = write_run_yaml(
        run_dir,
        model_dir=tiny_model_dir,
        api_port=api_port,
        inference_port=inference_port,
        total_steps=4,
        group_size=GROUP_SIZE,
        batch_size=BATCH_SIZE,
    )
    environment = child_environment(tmp_path / "var")
    api_url = f"http://127.0.0.1:{api_port}"
    rng = random.Random(0)
    with processes() as start:
        start_api(start, run_dir, api_port, environment)
        trainer = start_trainer(start, config, environment)
        wait_registered(api_url, trainer, 90)
        honoured = scored_group(rng, with_logprobs=True)
        honoured["advantages"] = [[0.0] * 7 + [0.5] * (len(t) - 7) for t in honoured["tokens"]]
        refused = scored_group(rng, with_logprobs=True)
        refused["ref_logprobs"] = [[-1.0] * len(tokens) for tokens in refused["tokens"]]
        for payload in (honoured, refused):
            httpx.post(f"{api_url}/scored_data", json=payload, timeout=REQUEST_TIMEOUT).raise_for_status()
        assert trainer.wait(120) == 1, trainer.log_tail()
    state = trainer_state(run_dir)
    assert state["status"] == "failed" and state["failure_kind"] == "unsupported_batch"
    assert "ref_logprobs" in state["error"]
    assert state["step"] == 0 and not steps_done(run_dir)  # the batch trained nothing, once: no retries
