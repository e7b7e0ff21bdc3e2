"""Responses show server paths relative to the data directory (or an environment directory), never absolute: a
caller learns nothing of the server's filesystem (docs/SECURITY.md#paths-in-responses).

Attacked before: GET /runs/{id} answered `config_path`, `logs` and each process's `log_path` as absolute paths of
the server, and so did the tools, inference tests (`output_directory`, `files`) and the environment catalog."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rlctl.service.db.engine import Database
from rlctl.service.db.models import Run, RunProcess
from rlctl.service.runs.paths import RunPaths
from rlctl.service.settings import REPO_ROOT, Settings
from tests.datasets_api.chat_server import chat_server
from tests.ops.seeding import SeededRun, seed_run
from tests.support.live import in_process_service
from tests.support.waiting import scaled, wait_until


def strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def _give_paths(settings: Settings, run_id: str) -> RunPaths:
    """A seeded run's paths as the supervisor and trainer record them: absolute, under the data directory."""
    paths = RunPaths(settings.data_path, run_id)
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    paths.config.write_text("tinker:\n  total_steps: 6\n")
    adapter = paths.run_dir / "checkpoints" / "step_6"
    checkpoint = {"step": 6, "path": str(adapter), "weights": str(adapter / "adapter"), "value": 1.0}
    state = {"checkpoints": [checkpoint], "best_checkpoint": checkpoint, "weights": str(adapter / "adapter")}
    paths.trainer_state.write_text(json.dumps(state))
    offline = paths.run_dir / "wandb"
    wandb = {"mode": "offline", "offline_dir": str(offline), "sync_command": f"wandb sync {offline}/offline-run-*"}
    db = Database(settings.sqlalchemy_url)
    try:
        with db.session() as session:
            run = session.get(Run, run_id)
            assert run is not None
            run.config_path, run.weights, run.wandb = str(paths.config), str(adapter / "adapter"), wandb
            for process in session.query(RunProcess).filter_by(run_id=run_id):
                process.log_path = str(paths.log(process.role))
    finally:
        db.dispose()
    return paths


def _ended(client: Any, url: str, done: tuple[str, ...]) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        found: dict[str, Any] = client.get(url).json()
        return found if found["status"] in done else None

    return wait_until(ended, timeout=scaled(120), message=f"{url} ends")


def test_no_response_names_an_absolute_server_path(make_settings: Callable[..., Settings], tmp_path: Path) -> None:
    reply = {"content": "<think>fine</think>The answer is 5."}
    with chat_server(lambda body: (200, reply)) as model:
        settings = make_settings(tokenizer_name=str(make_settings().tiny_model_dir))  # the session's tiny model
        run = seed_run(settings, SeededRun(logs={"trainer": "step 6/6\n"}, series={"reward/mean": [0.5, 1.0]}))
        paths = _give_paths(settings, run.id)
        with in_process_service(settings) as live, live.client() as client:
            collection = {"name": "paths", "prompts": [{"prompt": "Add 2 and 3.", "answer": "5"}]}
            collection |= {"base_url": model.base_url, "model": "scripted", "max_turns": 1}
            created = client.post("/collections", json=collection)
            assert created.status_code == 202, created.text
            done = _ended(client, f"/collections/{created.json()['id']}", ("completed", "failed"))
            assert done["status"] == "completed", done.get("error")
            inference = {"environment": "echo", "num_steps": 1, "group_size": 2, "models": ["scripted"]}
            started = client.post("/inference-tests", json=inference | {"base_url": model.base_url})
            assert started.status_code == 202, started.text
            test = _ended(client, f"/inference-tests/{started.json()['id']}", ("succeeded", "failed"))
            assert test["status"] == "succeeded", test
            urls = [
                f"/runs/{run.id}",
                f"/runs/{run.id}/results",
                f"/runs/{run.id}/status",
                "/runs",
                "/environments",
                "/environments/echo",
                "/datasets",
                f"/datasets/{done['dataset_id']}",
                "/collections",
                "/evaluations",
                "/inference-tests",
                "/jobs",
            ]
            answers: dict[str, Any] = {url: client.get(url).json() for url in urls}
            for tool, arguments in [
                ("rl_list_environments", {}),
                ("rl_select_environment", {"name": "echo"}),
                ("rl_get_current_config", {}),
                ("rl_get_results", {"run_id": run.id}),
                ("rl_get_inference_test", {"test_id": test["id"]}),
            ]:
                answers[tool] = client.post(f"/tools/{tool}", json=arguments).json()

    # the paths are there, relative to the data directory
    detail, results = answers[f"/runs/{run.id}"], answers[f"/runs/{run.id}/results"]
    assert detail["config_path"] == f"runs/{run.id}/config.yaml"
    assert detail["logs"]["trainer"] == f"logs/rl_training/trainer_{run.id}.log"
    assert {p["log_path"] for p in detail["processes"]} >= {detail["logs"]["trainer"]}
    assert detail["wandb"]["sync_command"] == f"wandb sync runs/{run.id}/wandb/offline-run-*"
    assert results["checkpoints"][0]["path"] == f"runs/{run.id}/checkpoints/step_6"
    assert (settings.data_path / results["weights"]).parent == paths.run_dir / "checkpoints" / "step_6"
    summary = test["result"]["summary"] if "result" in test else None
    assert answers["/inference-tests"]["inference_tests"][0]["result"]["summary"]["output_directory"] == (
        "logs/rl_training/inference_tests"
    ), summary
    assert answers["rl_select_environment"]["file_path"] == "environments/echo.py"
    for tool in ("rl_list_environments", "rl_get_results", "rl_get_inference_test"):
        assert "error" not in answers[tool], answers[tool]

    absolute = [str(settings.data_path), str(REPO_ROOT), str(tmp_path), str(Path(tempfile.gettempdir()).resolve())]
    leaks = {
        (where, text)
        for where, answer in answers.items()
        for text in strings(answer)
        if any(root in text for root in absolute[:3]) or text.startswith(absolute[3])
    }
    assert not leaks
