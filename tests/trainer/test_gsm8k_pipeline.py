"""The pipeline on `gsm8k` with the local JSONL data: the environment produces and scores real rollouts
through the trainer's inference server. A tiny random model never answers correctly, so every group scores
all zeros and Atropos drops it: the trainer must say it is waiting for rollouts (log and metrics) rather
than hang silently, and stop cleanly on SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from tests.conftest import TEST_DATA
from tests.support.live import free_port
from tests.support.waiting import REQUEST_TIMEOUT
from tests.trainer.pipeline import (
    REPO_ROOT,
    child_environment,
    metric_lines,
    processes,
    start_api,
    start_environment,
    start_trainer,
    trainer_state,
    wait_for,
    wait_http,
    write_run_yaml,
)

pytestmark = pytest.mark.e2e

GSM8K_ENV = REPO_ROOT / "environments" / "gsm8k.py"
GSM8K_DATA = TEST_DATA / "gsm8k"  # the excerpt (tests/data/SOURCES.md)


def test_gsm8k_rollouts_flow_and_the_trainer_reports_waiting(tiny_model_dir: Path, tmp_path: Path) -> None:
    api_port, inference_port = free_port(), free_port()
    run_dir = tmp_path / "gsm8k"
    config = write_run_yaml(
        run_dir,
        model_dir=tiny_model_dir,
        api_port=api_port,
        inference_port=inference_port,
        total_steps=5,
        group_size=4,
        batch_size=8,
        env={
            "max_new_tokens": 24,
            "eval_items": 0,
            "steps_per_eval": 1000,
        },
        tinker={"waiting_report_interval_s": 1.0, "max_token_trainer_length": 4096},
    )
    environment = child_environment(tmp_path / "var", RLCTL_GSM8K_PATH=str(GSM8K_DATA))
    health_url = f"http://127.0.0.1:{inference_port}/health"
    with processes() as start:
        start_api(start, run_dir, api_port, environment)
        trainer = start_trainer(start, config, environment)
        wait_http(health_url, trainer, 90)
        env = start_environment(start, "gsm8k.py", config, environment)

        def groups_scored_and_dropped() -> bool:
            if not env.alive:
                raise AssertionError(f"the gsm8k environment exited:\n{env.log_tail()}")
            return env.log_text().count("Scores are the same in a group") >= 2

        wait_for(groups_scored_and_dropped, 60, "the environment to score and drop two groups")
        served = httpx.get(health_url, timeout=REQUEST_TIMEOUT).json()["served"]
        assert served.get("generate", 0) >= 2 and served["completions"] >= 8  # rollouts of 4 each
        wait_for(
            lambda: [r for r in metric_lines(run_dir) if r.get("event") == "waiting_for_rollouts"],
            30,
            "a waiting_for_rollouts report in metrics.jsonl",
        )
        assert "waiting for rollouts" in trainer.log_text()
        assert trainer_state(run_dir)["waiting_for_rollouts_s"] >= 1.0

        trainer.signal_group(signal.SIGTERM)
        assert trainer.wait(30) == 0
        assert "Traceback" not in env.log_text(), env.log_tail()

    state = trainer_state(run_dir)
    assert state["status"] == "stopped" and state["step"] == 0 and state["checkpoints"] == []
    assert "Traceback" not in trainer.log_text()
