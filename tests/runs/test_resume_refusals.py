"""Resume refusals that need no run to have trained (docs/RUNS.md#resume-and-warm-start): a stopped run whose
newest checkpoint is of its last step has nothing left to train, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Callable

from rlctl.service.db.engine import Database
from rlctl.service.db.models import Run
from rlctl.service.runs.paths import RunPaths
from rlctl.service.settings import Settings
from tests.support.live import in_process_service


def test_a_run_stopped_at_its_last_step_is_not_resumed(
    make_settings: Callable[..., Settings], database_url: str
) -> None:
    """A run stopped just as it finished its steps (the stop raced the end) keeps a checkpoint of its last step:
    its trainer would exit at once, before it was ready, and fail the run. Refused instead, changing nothing."""
    settings = make_settings()
    paths = RunPaths(settings.data_path, "finished1")
    paths.run_dir.mkdir(parents=True)
    state = {
        "step": 30,
        "status": "stopped",
        "checkpoints": [
            {"step": step, "path": str(paths.run_dir / "checkpoints" / f"step_{step}"), "weights": ""}
            for step in (25, 30)
        ],
    }
    paths.trainer_state.write_text(json.dumps(state))
    db = Database(settings.database_url)
    with db.session() as session:
        config = {"env": {"total_steps": 30}, "tinker": {"total_steps": 30}}
        session.add(Run(id="finished1", environment="echo", backend="local", status="stopped", config=config))
    db.dispose()
    with in_process_service(settings) as live, live.client() as client:
        refused = client.post("/runs/finished1/resume")
        if refused.status_code == 200:  # resumed after all: its processes must not outlive the failed test
            client.post("/runs/finished1/stop", params={"wait_s": 60})
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "INVALID_STATE"
        assert error["details"] == {"run_id": "finished1", "step": 30, "total_steps": 30}
        assert client.get("/runs/finished1").json()["status"] == "stopped"
    assert json.loads(paths.trainer_state.read_text()) == state  # not rewound
