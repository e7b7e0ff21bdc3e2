"""Offline end to end, all real processes: `run-api` (atroposlib), the trainer on the local backend with the
tiny model, and `environments/echo.py serve`, wired by one merged YAML. The policy must learn: the mean
reward of the last quarter of steps is at least 1.5 × the first quarter's and at least 0.05 higher."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.pipeline import child_environment, run_pipeline, step_metrics, trainer_state

TOTAL_STEPS = 32


@pytest.mark.parametrize("seed", [0, 1])
def test_echo_run_learns_and_completes(tiny_model_dir: Path, tmp_path: Path, seed: int) -> None:
    run_dir = tmp_path / f"echo-seed{seed}"
    # W&B in offline mode: the trainer must mirror its metrics and record the run's name.
    run = run_pipeline(
        run_dir,
        model_dir=tiny_model_dir,
        total_steps=TOTAL_STEPS,
        environment=child_environment(tmp_path / "var", WANDB_MODE="offline"),
        timeout_s=240,
        env={"seed": seed, "steps_per_eval": 16},
        tinker={"seed": seed},
    )
    assert run.exit_code == 0, run.trainer.log_tail()
    assert "Traceback" not in run.environment_log, run.environment_log[-4000:]

    records = step_metrics(run_dir)
    assert [record["step"] for record in records] == list(range(1, TOTAL_STEPS + 1))
    rewards = [record["metrics"]["reward/mean"] for record in records]
    quarter = TOTAL_STEPS // 4
    first, last = sum(rewards[:quarter]) / quarter, sum(rewards[-quarter:]) / quarter
    print(f"echo seed {seed}: first-quarter mean reward {first:.3f}, last-quarter {last:.3f}")
    assert last >= 1.5 * first and last >= first + 0.05, rewards

    state = trainer_state(run_dir)
    assert state["status"] == "completed" and state["step"] == TOTAL_STEPS
    assert [c["step"] for c in state["checkpoints"]] == [10, 20, 30, TOTAL_STEPS]
    assert state["wandb_run_name"] == run_dir.name
    assert list((run_dir / "wandb").glob("offline-run-*")), "no offline W&B run was written"
