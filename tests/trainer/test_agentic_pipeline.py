"""Online multi-turn tool training end to end, all real processes: `run-api`, the trainer on the local backend with
the primed tiny model, and `environments/tool_lookup.py serve`: every episode a conversation of tool calls sampled
from the trainer's inference server, the tool's results appended as tool turns, the answer rewarded. Checked: the
run completes every step; the policy calls tools over several turns (the environment's `agent/...` metrics, as a
supervised run records them); the trained rollouts are whole conversations; the reward rises from the first quarter
of the run to the last (the policy learns to call `lookup` rather than `guess`); and the run's last checkpoint,
evaluated against the base through the service's POST /evaluations on held-out tasks with the environment's own
episode code and rewards, is better with a 95 % interval above zero (docs/TOOL_ENVIRONMENTS.md#tool_lookup)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from environments.tool_lookup import prime_model
from rlctl.service.evaluations.schemas import EvaluationModelResult
from tests.conftest import build_settings
from tests.runs.test_evaluation_judge import evaluable_run
from tests.runs.test_tool_evaluations import evaluated, tool_run_config
from tests.support.databases import MigratedDatabases, database_kinds, fresh_database
from tests.support.live import in_process_service
from tests.support.tiny_model import session_tiny_model
from tests.trainer.pipeline import env_metrics_of, metrics_environment, run_pipeline, step_metrics, trainer_state

pytestmark = pytest.mark.e2e

TOTAL_STEPS = 24
# eight episodes a task, four tasks a step: measured reliable (docs/TOOL_ENVIRONMENTS.md#tool_lookup)
GROUP_SIZE, BATCH_SIZE, LEARNING_RATE = 8, 32, 5e-3
# first → last quarter of the mean reward, measured +0.12 to +0.22 over five seeds: half the smallest
MIN_RISE = 0.06
HELD_OUT_TASKS, EPISODES = 16, 4
_lock = threading.Lock()


@pytest.fixture(scope="session")
def primed_model_dir() -> Path:
    """The tiny model primed for tool_lookup, once per session beside the session's tiny model (~30 s CPU)."""
    tiny = session_tiny_model()
    with _lock:
        return prime_model(output=tiny.parent / "tiny-qwen3-tool_lookup", base=tiny)


def test_a_multi_turn_tool_run_learns_and_its_checkpoint_beats_the_base(
    primed_model_dir: Path, tmp_path: Path, session_databases: MigratedDatabases
) -> None:
    run_dir = tmp_path / "tool_lookup"
    ended = run_pipeline(
        run_dir,
        model_dir=primed_model_dir,
        total_steps=TOTAL_STEPS,
        environment=metrics_environment(tmp_path / "var", run_dir),
        timeout_s=300,
        environment_file="tool_lookup.py",
        group_size=GROUP_SIZE,
        batch_size=BATCH_SIZE,
        # one batch ahead at most: rollouts of the policy being trained, not of one three steps old
        env={
            "max_token_length": 1024,
            "max_turns": 3,
            "eval_items": 0,
            "steps_per_eval": 1000,
            "seed": 0,
            "max_batches_offpolicy": 1,
        },
        tinker={"max_token_trainer_length": 1536, "learning_rate": LEARNING_RATE},
    )
    assert ended.exit_code == 0, ended.trainer.log_tail()
    assert "Traceback" not in ended.environment_log, ended.environment_log[-4000:]

    records = step_metrics(run_dir)
    assert [record["step"] for record in records] == list(range(1, TOTAL_STEPS + 1))
    rewards = [record["metrics"]["reward/mean"] for record in records]
    quarter = TOTAL_STEPS // 4
    first, last = sum(rewards[:quarter]) / quarter, sum(rewards[-quarter:]) / quarter
    print(f"tool_lookup: first-quarter mean reward {first:.3f}, last-quarter {last:.3f}")
    assert all(0.0 <= reward <= 1.0 for reward in rewards), rewards
    assert last >= first + MIN_RISE, rewards
    assert trainer_state(run_dir)["status"] == "completed"
    logged = env_metrics_of(run_dir)
    agent = [metrics for metrics in logged if "agent/turns_per_episode" in metrics]
    assert agent, logged
    assert all(1.0 <= metrics["agent/turns_per_episode"] <= 3.0 for metrics in agent)
    assert max(metrics["agent/tool_calls_per_episode"] for metrics in agent) > 0.5  # the policy calls tools
    # multi-turn datums: more tokens than one reply, most of them masked (prompt and tool turns)
    assert min(record["metrics"]["completion/mean_tokens"] for record in records) > 20

    base, trained = checkpoint_against_base(
        primed_model_dir, trainer_state(run_dir)["checkpoints"][-1], tmp_path, session_databases
    )
    print(f"tool_lookup held-out: base {base.mean_reward:.3f}, trained {trained.mean_reward:.3f}, {trained.interval}")
    assert trained.name == f"step_{TOTAL_STEPS}" and trained.samples == HELD_OUT_TASKS * EPISODES
    assert trained.interval is not None and trained.interval[0] > 0.0, (base, trained)
    assert trained.tool_calls_per_episode is not None and trained.tool_calls_per_episode > 0.5, trained


def checkpoint_against_base(
    model: Path, checkpoint: dict[str, object], tmp_path: Path, session_databases: MigratedDatabases
) -> tuple[EvaluationModelResult, EvaluationModelResult]:
    """The checkpoint and the base, each playing the environment's held-out tasks through the service."""
    with fresh_database(database_kinds()[-1], tmp_path, session_databases) as url:
        settings = build_settings(tmp_path / "service", url)
        run_id = evaluable_run(
            settings, [checkpoint], prompts=[], config=tool_run_config(model), environment="tool_lookup"
        )
        body = {"run_id": run_id, "max_prompts": HELD_OUT_TASKS, "samples_per_prompt": EPISODES, "temperature": 1.0}
        with in_process_service(settings) as live, live.client() as client:
            done = evaluated(client, body, timeout=300)
    assert done["status"] == "succeeded", done["error"]
    base, trained = (EvaluationModelResult.model_validate(m) for m in done["models"])
    return base, trained
