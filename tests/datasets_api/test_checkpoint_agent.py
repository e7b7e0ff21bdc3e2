"""A run's checkpoint as a collection's agent (docs/DATASETS.md#a-checkpoint-as-the-agent): `model: {run, step}`
is served by the service itself (`python -m rlctl.trainer.serve`, a supervised child) for the collection's length,
its replies' tool calls run as any agent's, and the lineage (which checkpoint collected the dataset) is readable
from the collection and from its dataset. The collection is started and followed by the CLI (`rlctl collect
SPEC --checkpoint RUN[:STEP]`).

The run is seeded as its trainer leaves one (a row, trainer_state.json listing a checkpoint directory of a real
LoRA adapter): training is not what is tested here. Its base model is the tiny model fitted to call `write_file`
and then answer (tests/support/fitted_model.py), so the trajectories and their tool calls are known.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlctl.service.runs.paths import RunPaths
from rlctl.service.settings import Settings
from rlctl.trainer.evaluate import backend_for
from tests.conftest import build_settings
from tests.ops.cli import rlctl
from tests.ops.seeding import SeededRun, seed_run
from tests.support.databases import MigratedDatabases, database_kinds, fresh_database
from tests.support.fitted_model import WRITE_ARGUMENTS, WRITE_DONE, WRITE_PROMPT, fitted_tool_call_model
from tests.support.live import live_service

STEP = 2


def run_with_checkpoint(settings: Settings, base_model: Path, backend: str = "local") -> str:
    run = seed_run(settings, SeededRun(backend=backend, config={"tinker": {"base_model": str(base_model)}}))
    paths = RunPaths(settings.data_path, run.id)
    scratch = backend_for({"base_model": str(base_model), "lora_rank": 4, "device": "cpu"}, None, str(paths.run_dir))
    try:  # a fresh adapter: the checkpoint answers as the fitted base does
        weights = scratch.save_checkpoint(STEP).path
    finally:
        scratch.close()
    state = {"status": "completed", "step": STEP, "checkpoints": [{"step": STEP, "weights": weights}]}
    paths.trainer_state.write_text(json.dumps(state))
    return run.id


def collection_body(model: Any, **extra: Any) -> dict[str, Any]:
    return {
        "name": "checkpoint-agent",
        "prompts": [{"prompt": WRITE_PROMPT, "answer": "42"}],
        "model": model,
        "runs_per_prompt": 2,
        "concurrency": 2,
        "max_turns": 3,
        "max_tokens": 120,  # the call is 101 characters, one token each
        "temperature": 0,
        "tools": ["write_file"],
        "discard_without_reasoning": False,  # the tiny model does not reason
        **extra,
    }


def test_a_checkpoint_collects_a_dataset_that_names_it(tmp_path: Path, session_databases: MigratedDatabases) -> None:
    model = fitted_tool_call_model()
    with fresh_database(database_kinds()[-1], tmp_path, session_databases) as url:
        settings = build_settings(tmp_path / "var", url, tokenizer_name=str(model))
        run_id = run_with_checkpoint(settings, model)
        tinker_run = seed_run(settings, SeededRun(backend="tinker")).id
        tinker_state = RunPaths(settings.data_path, tinker_run).trainer_state
        tinker_state.parent.mkdir(parents=True)
        tinker_state.write_text(json.dumps({"checkpoints": [{"step": STEP, "weights": "tinker://sampler/weights/2"}]}))
        with live_service(settings) as live, live.client() as client:
            refusals = {
                "unknown run": client.post("/collections", json=collection_body({"run": "nosuchrun"})),
                "missing step": client.post("/collections", json=collection_body({"run": run_id, "step": 9})),
                "base_url too": client.post(
                    "/collections", json=collection_body({"run": run_id}, base_url="http://127.0.0.1:9/v1")
                ),
                "no base_url": client.post("/collections", json=collection_body("some/model")),
                "tinker run": client.post("/collections", json=collection_body({"run": tinker_run})),
            }
            # the CLI names the checkpoint as `runs start --init-from` does; RUN alone is its newest: step 2
            spec = tmp_path / "collection.json"
            spec.write_text(json.dumps(collection_body("replaced by --checkpoint")))
            collected = rlctl(live.base_url, "collect", str(spec), "--checkpoint", run_id, "--json", timeout=300)
            assert collected.returncode == 0, collected.stderr
            collection = json.loads(collected.stdout)
            items = client.get(f"/collections/{collection['id']}/items").json()["items"]
            dataset = client.get(f"/datasets/{collection['dataset_id']}").json()
            records = client.get(f"/datasets/{collection['dataset_id']}/export", params={"format": "rlctl"})

    assert refusals["unknown run"].status_code == 404
    missing = refusals["missing step"]
    assert missing.status_code == 422 and missing.json()["error"]["details"]["available"] == [STEP]
    assert refusals["base_url too"].status_code == 422 and refusals["no base_url"].status_code == 422
    tinker = refusals["tinker run"]
    assert tinker.status_code == 422 and tinker.json()["error"]["details"]["field"] == "model.run"

    assert collection["status"] == "completed", collection["error"]
    lineage = {"run_id": run_id, "step": STEP}
    assert collection["checkpoint"] == lineage and dataset["checkpoint"] == lineage
    assert collection["model"] == f"{run_id}/step-{STEP}" and collection["base_url"] is None
    outcomes = [(item["status"], item["tool_calls"], item["completed"]) for item in items]
    assert outcomes == [("kept", 1, True)] * 2, records.text[:3000]
    assert records.status_code == 200, records.text
    lines = records.text.splitlines()
    assert len(lines) == 2
    for line in lines:
        record = json.loads(line)
        turns = record["conversations"]
        calls = [call for turn in turns for call in turn.get("tool_calls") or []]
        assert [(call["name"], call["arguments"]) for call in calls] == [("write_file", WRITE_ARGUMENTS)]
        assert turns[-1]["from"] == "gpt" and turns[-1]["value"] == WRITE_DONE
        assert record["metadata"]["model"] == collection["model"]
