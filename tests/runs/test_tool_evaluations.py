"""An evaluation of a run of a multi-turn tool environment (docs/EVALUATIONS.md#tool-environments): POST /evaluations
plays the environment's held-out tasks with each model through the environment's own episode code and rewards (the
evaluation child imports `environments/tool_lookup.py`), and reports each model's tool-call statistics beside its
reward. All real: the service in process, the sampler child, the primed tiny model on the local backend. The
checkpoint is a fresh LoRA adapter of the primed model as the local backend saves one (no training: its figures are
the base's, which is not what is checked here)."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from environments.tool_lookup import prime_model
from rlctl.service.evaluations.schemas import EvaluationModelResult
from rlctl.trainer.evaluate import backend_for
from tests.runs.test_dataset_runs import error_of
from tests.runs.test_evaluation_judge import evaluable_run
from tests.support.live import in_process_service
from tests.support.tiny_model import session_tiny_model
from tests.support.waiting import wait_until

TASKS, EPISODES = 4, 2
_lock = threading.Lock()


def primed_model() -> Path:
    """The tiny model primed for tool_lookup, shared with tests/trainer/test_agentic_pipeline.py (built once)."""
    tiny = session_tiny_model()
    with _lock:
        return prime_model(output=tiny.parent / "tiny-qwen3-tool_lookup", base=tiny)


def saved_adapter(model: Path, run_dir: Path) -> str:
    with tempfile.TemporaryDirectory() as scratch:
        backend = backend_for({"base_model": str(model), "tokenizer_name": str(model), "device": "cpu"}, None, scratch)
        try:
            saved = backend.save_checkpoint(3)
        finally:
            backend.close()
        target = run_dir / "checkpoints" / "step_3"
        target.parent.mkdir(parents=True, exist_ok=True)
        Path(saved.path).rename(target)
    return str(target)


def tool_run_config(model: Path) -> dict[str, Any]:
    """A tool_lookup run's config as its evaluation reads it: the environment's and the local backend's model."""
    return {
        "env": {"tokenizer_name": str(model), "max_token_length": 1024, "max_turns": 3},
        "tinker": {"base_model": str(model), "lora_rank": 8},
    }


def evaluated(client: Any, body: dict[str, Any], timeout: float = 240) -> dict[str, Any]:
    """POST /evaluations and the evaluation once it has ended."""
    response = client.post("/evaluations", json=body)
    assert response.status_code == 202, response.text

    def ended() -> dict[str, Any] | None:
        found = client.get(f"/evaluations/{response.json()['id']}").json()
        return found if found["status"] in ("succeeded", "failed", "cancelled") else None

    return wait_until(ended, timeout=timeout, message="evaluation ends")


def test_a_tool_environments_run_is_evaluated_by_playing_its_held_out_tasks(
    run_settings: Callable[..., Any], tmp_path: Path
) -> None:
    model = primed_model()
    settings = run_settings()
    config = tool_run_config(model)
    weights = saved_adapter(model, tmp_path / "adapter")
    run_id = evaluable_run(
        settings, [{"step": 3, "weights": weights}], prompts=[], config=config, environment="tool_lookup"
    )
    with in_process_service(settings) as live, live.client() as client:
        # the environment's own rewards score it: naming others is refused, starting nothing
        refused = client.post("/evaluations", json={"run_id": run_id, "rewards": [{"name": "echo"}]})
        assert refused.status_code == 422 and error_of(refused)["details"]["field"] == "rewards", refused.text
        body = {"run_id": run_id, "max_prompts": TASKS, "samples_per_prompt": EPISODES, "temperature": 1.0}
        done = evaluated(client, body)
    assert done["status"] == "succeeded", done["error"]
    base, trained = (EvaluationModelResult.model_validate(m) for m in done["models"])
    assert (base.name, trained.name) == ("base", "step_3")
    assert base.samples == trained.samples == TASKS * EPISODES
    for result in (base, trained):
        assert result.mean_reward is not None and 0.0 <= result.mean_reward <= 1.0
        # the primed model calls `lookup`: real episodes of several turns, not single replies
        assert result.tool_calls_per_episode is not None and result.tool_calls_per_episode > 0, result
        assert result.turns_per_episode is not None and result.turns_per_episode >= 1.0
        assert result.failed_calls_per_episode is not None
        assert 0.0 <= result.failed_calls_per_episode <= result.tool_calls_per_episode
    # a fresh adapter is the base exactly, and both models play the same tasks on the same random numbers
    assert trained.mean_reward == base.mean_reward and trained.difference == 0.0
    assert trained.tool_calls_per_episode == base.tool_calls_per_episode
    assert [p["group_key"] for p in done["prompts"]] == [f"task_{i}" for i in range(TASKS)]
    assert done["progress"]["done"] == done["progress"]["total"] == 2 * TASKS * EPISODES
