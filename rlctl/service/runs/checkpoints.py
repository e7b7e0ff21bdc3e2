"""A run's checkpoints named by run id and step: the ones evaluations compare with the base, and the one a
collection serves as its agent (`python -m rlctl.trainer.serve`, a supervised child on a loopback port)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from rlctl.service.children import service_child_environment
from rlctl.service.context import AppContext
from rlctl.service.db.models import Run
from rlctl.service.db.rows import load_row
from rlctl.service.errors import InvalidState, RunNotFound, ValidationFailed
from rlctl.service.runs.paths import RunPaths
from rlctl.service.settings import Backend
from rlctl.supervisor.ports import free_ports
from rlctl.supervisor.process import ProcessSpec, SupervisedProcess

REPO_ROOT = Path(__file__).resolve().parents[3]
SERVE_START_TIMEOUT_S = 600.0  # loading a base model and its adapter on CPU
POLL_S = 0.25
STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class RunCheckpoints:
    run_id: str
    backend: Backend
    status: str
    config: dict[str, Any]
    weights: dict[int, str]  # step → a local adapter directory or a tinker:// sampler URI
    environment: str = ""

    def steps(self, wanted: list[int] | None, field: str = "steps") -> list[int]:
        """The steps asked for (default: the newest); InvalidState when the run has none yet, ValidationFailed
        (naming `field` and the steps there are) when one is missing."""
        if not self.weights:
            details = {"run_id": self.run_id, "status": self.status}
            raise InvalidState(f"run {self.run_id} has no checkpoint yet", details)
        steps = wanted or [max(self.weights)]
        missing = [step for step in steps if step not in self.weights]
        if missing:
            raise ValidationFailed(
                f"run {self.run_id} has no checkpoint at step(s) {missing}",
                {"field": field, "available": sorted(self.weights)},
            )
        return steps


def run_checkpoints(ctx: AppContext, run_id: str) -> RunCheckpoints:
    """The run's checkpoints as its trainer_state.json lists them (RunNotFound for an unknown run)."""
    with ctx.db.session() as session:
        run = load_row(session, Run, run_id, RunNotFound)
        backend, config, status = Backend(run.backend), dict(run.config), str(run.status)
        environment = str(run.environment)
    state = RunPaths(ctx.settings.data_path, run_id).read_trainer_state() or {}
    weights = {int(c["step"]): str(c["weights"]) for c in state.get("checkpoints") or [] if c.get("weights")}
    return RunCheckpoints(run_id, backend, status, config, weights, environment)


def served_model_id(run_id: str, step: int) -> str:
    """The id a served checkpoint answers to (`rlctl model serve` names a run's checkpoint the same way)."""
    return f"{run_id}/step-{step}"


@contextmanager
def serve_checkpoint(
    ctx: AppContext, run_id: str, step: int, log_path: Path, check_cancelled: Callable[[], None]
) -> Iterator[str]:
    """A local run's checkpoint served by `python -m rlctl.trainer.serve` (the base model with the checkpoint's
    adapter) until the block ends; yields its `/v1` URL once it answers /health. The child is stopped however the
    block ends; `check_cancelled` is called while it starts (it raises to give up)."""
    checkpoints = run_checkpoints(ctx, run_id)
    if checkpoints.backend != Backend.LOCAL:
        raise InvalidState(f"run {run_id} is a {checkpoints.backend} run: only local checkpoints are served here")
    weights = checkpoints.weights[checkpoints.steps([step], "model.step")[0]]
    tinker = checkpoints.config.get("tinker") or {}
    port = free_ports(1)[0]
    argv = [sys.executable, "-m", "rlctl.trainer.serve", str(tinker["base_model"]), "--adapter", weights]
    argv += ["--name", served_model_id(run_id, step), "--port", str(port), "--device", "cpu"]
    spec = ProcessSpec(
        role="checkpoint-server",
        argv=argv,
        env={**service_child_environment(), "PYTHONUNBUFFERED": "1"},
        cwd=REPO_ROOT,
        log_path=log_path,
    )
    process = SupervisedProcess.spawn(spec, ctx.children.fork_server)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVE_START_TIMEOUT_S
        while not _healthy(base_url):
            if (ended := process.poll()) is not None:
                raise RuntimeError(f"the checkpoint's model server {ended.describe()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the checkpoint's model server did not start in {SERVE_START_TIMEOUT_S:.0f} s")
            check_cancelled()
            time.sleep(POLL_S)  # the child is polled, as the run supervisor polls its processes
        yield f"{base_url}/v1"
    finally:
        process.terminate(grace_s=STOP_GRACE_S)


def _healthy(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
