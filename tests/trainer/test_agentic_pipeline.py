"""The agentic loop end to end, all real processes and the real sandbox: online multi-turn tool training of
`environments/file_lookup.py` (`run-api`, the trainer on the local backend with the primed tiny model, the
environment's `serve`: every episode a conversation whose `read_file` calls run in the collections' sandboxed toolbox,
the tool's results appended as tool turns, the answer rewarded); then the run's last checkpoint evaluated against the
base through the service's POST /evaluations on held-out tasks, with the environment's own episode code and rewards;
then a collection (POST /collections) whose agent is that checkpoint, served by the service, calling the same tool.

Checked: the run completes every step; the policy calls the tool over several turns (the environment's `agent/...`
metrics, as a supervised run records them); the trained rollouts are whole conversations; the reward rises from
the first quarter of the run to the last (the policy learns to read `code.txt` rather than the decoy); the
checkpoint beats the base with a 95 % interval above zero; and the collection's trajectories record the
checkpoint's real `read_file` calls, with the checkpoint as their lineage (docs/TOOL_ENVIRONMENTS.md#file_lookup).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from environments.file_lookup import PROMPT, prime_model
from rlctl.service.evaluations.schemas import EvaluationModelResult
from tests.conftest import build_settings
from tests.runs.test_evaluation_judge import evaluable_run
from tests.runs.test_tool_evaluations import evaluated, tool_run_config
from tests.support.databases import MigratedDatabases, database_kinds, fresh_database
from tests.support.live import in_process_service
from tests.support.sandbox import required_sandbox
from tests.support.tiny_model import session_tiny_model
from tests.support.waiting import wait_until
from tests.trainer.pipeline import (
    TOOL_RUN_ENV,
    env_metrics_of,
    metrics_environment,
    run_pipeline,
    step_metrics,
    trainer_state,
)

pytestmark = pytest.mark.e2e

TOTAL_STEPS = 24
# eight episodes a task, four tasks a step: measured reliable (docs/TOOL_ENVIRONMENTS.md#file_lookup)
GROUP_SIZE, BATCH_SIZE, LEARNING_RATE = 8, 32, 5e-3
# first → last quarter of the mean reward, measured +0.13 to +0.23 over three seeds: half the smallest
MIN_RISE = 0.06
HELD_OUT_TASKS, EPISODES = 16, 4
_lock = threading.Lock()


@pytest.fixture(scope="session")
def primed_model_dir() -> Path:
    """The tiny model primed for file_lookup, once per session beside the session's tiny model (~20 s CPU)."""
    tiny = session_tiny_model()
    with _lock:
        return prime_model(output=tiny.parent / "tiny-qwen3-file_lookup", base=tiny)


def test_an_agent_trained_online_beats_its_base_and_collects_as_the_agent(
    primed_model_dir: Path, tmp_path: Path, session_databases: MigratedDatabases
) -> None:
    required_sandbox()  # the environment's tool runs in it: this fails (CI) or skips where there is none
    run_dir = tmp_path / "file_lookup"
    ended = run_pipeline(
        run_dir,
        model_dir=primed_model_dir,
        total_steps=TOTAL_STEPS,
        environment=metrics_environment(tmp_path / "var", run_dir),
        timeout_s=300,
        environment_file="file_lookup.py",
        group_size=GROUP_SIZE,
        batch_size=BATCH_SIZE,
        env=TOOL_RUN_ENV,
        tinker={"max_token_trainer_length": 1536, "learning_rate": LEARNING_RATE},
    )
    assert ended.exit_code == 0, ended.trainer.log_tail()
    assert "Traceback" not in ended.environment_log, ended.environment_log[-4000:]

    records = step_metrics(run_dir)
    assert [record["step"] for record in records] == list(range(1, TOTAL_STEPS + 1))
    rewards = [record["metrics"]["reward/mean"] for record in records]
    quarter = TOTAL_STEPS // 4
    first, last = sum(rewards[:quarter]) / quarter, sum(rewards[-quarter:]) / quarter
    print(f"file_lookup: first-quarter mean reward {first:.3f}, last-quarter {last:.3f}")
    assert all(0.0 <= reward <= 1.0 for reward in rewards), rewards
    assert last >= first + MIN_RISE, rewards
    assert trainer_state(run_dir)["status"] == "completed"
    logged = env_metrics_of(run_dir)
    agent = [metrics for metrics in logged if "agent/turns_per_episode" in metrics]
    assert agent, logged
    assert all(1.0 <= metrics["agent/turns_per_episode"] <= 3.0 for metrics in agent)
    assert max(metrics["agent/tool_calls_per_episode"] for metrics in agent) > 0.5  # the policy calls the tool
    assert max(metrics["agent/tool_s_per_episode"] for metrics in agent) > 0.0  # in the sandbox, not skipped
    # multi-turn datums: more tokens than one reply, most of them masked (prompt and tool turns)
    assert min(record["metrics"]["completion/mean_tokens"] for record in records) > 20

    checkpoint = trainer_state(run_dir)["checkpoints"][-1]
    with fresh_database(database_kinds()[-1], tmp_path, session_databases) as url:
        settings = build_settings(tmp_path / "service", url, tokenizer_name=str(primed_model_dir))
        config = tool_run_config(primed_model_dir)
        run_id = evaluable_run(settings, [checkpoint], prompts=[], config=config, environment="file_lookup")
        with in_process_service(settings) as live, live.client() as client:
            body = {"run_id": run_id, "max_prompts": HELD_OUT_TASKS, "samples_per_prompt": EPISODES}
            evaluation = evaluated(client, {**body, "temperature": 1.0}, timeout=300)
            collection = collected(client, run_id, checkpoint["step"])
            items = client.get(f"/collections/{collection['id']}/items").json()["items"]
            exported = client.get(f"/datasets/{collection['dataset_id']}/export", params={"format": "rlctl"})

    assert evaluation["status"] == "succeeded", evaluation["error"]
    base, trained = (EvaluationModelResult.model_validate(m) for m in evaluation["models"])
    print(f"file_lookup held-out: base {base.mean_reward:.3f}, trained {trained.mean_reward:.3f}, {trained.interval}")
    assert trained.name == f"step_{TOTAL_STEPS}" and trained.samples == HELD_OUT_TASKS * EPISODES
    assert trained.interval is not None and trained.interval[0] > 0.0, (base, trained)
    assert trained.tool_calls_per_episode is not None and trained.tool_calls_per_episode > 0.5, trained

    assert collection["status"] == "completed", collection["error"]
    assert collection["checkpoint"] == {"run_id": run_id, "step": TOTAL_STEPS}
    assert all(item["tool_calls"] >= 1 for item in items), exported.text[:3000]
    assert exported.status_code == 200, exported.text
    for line in exported.text.splitlines():
        record = json.loads(line)
        calls = [call for turn in record["conversations"] for call in turn.get("tool_calls") or []]
        assert calls and all(call["name"] == "read_file" for call in calls), record["conversations"]
        assert record["metadata"]["model"] == collection["model"]


def collected(client: Any, run_id: str, step: int) -> dict[str, Any]:
    """A collection whose agent is the run's checkpoint, offered the collections' `read_file`: the prompt renders
    as the environment's did (the same chat template, tool schema and question)."""
    body = {
        "name": "trained-agent",
        "prompts": [{"prompt": PROMPT}],
        "model": {"run": run_id, "step": step},
        "runs_per_prompt": 2,
        "concurrency": 2,
        "max_turns": 3,
        "max_tokens": 96,
        "temperature": 0,
        "tools": ["read_file"],
        "discard_without_reasoning": False,  # the tiny model does not reason
    }
    created = client.post("/collections", json=body)
    assert created.status_code == 202, created.text

    def ended() -> dict[str, Any] | None:
        found = client.get(f"/collections/{created.json()['id']}").json()
        return found if found["status"] in ("completed", "failed", "cancelled") else None

    return wait_until(ended, timeout=240, message="collection ends")
