"""A run continued: resumed from its own checkpoint (same run id, history continued), or a new run warm-started
from another run's weights (docs/RUNS.md#resume-and-warm-start)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sqlalchemy import delete, update

from rlctl.service.context import AppContext
from rlctl.service.db.models import Run, RunMetric
from rlctl.service.db.rows import load_row
from rlctl.service.db.types import utcnow
from rlctl.service.environments import run_config
from rlctl.service.errors import CheckpointNotFound, InvalidState, RunNotFound, ValidationFailed
from rlctl.service.runs import lifecycle
from rlctl.service.runs.launch import Ports
from rlctl.service.runs.paths import RunPaths
from rlctl.service.runs.schemas import InitFrom
from rlctl.supervisor.ports import free_ports

RESUMABLE = frozenset({lifecycle.STOPPED, lifecycle.FAILED})


def checkpoint_of(paths: RunPaths, step: int | None) -> dict[str, Any]:
    """The run's checkpoint of `step` (the newest when None), as its trainer recorded it: {step, path, weights}."""
    checkpoints = (paths.read_trainer_state() or {}).get("checkpoints") or []
    if not checkpoints:
        raise CheckpointNotFound(f"run {paths.run_id} has no checkpoint", {"run_id": paths.run_id, "step": step})
    if step is None:
        return dict(max(checkpoints, key=lambda entry: entry["step"]))
    for entry in checkpoints:
        if entry["step"] == step:
            return dict(entry)
    raise CheckpointNotFound(
        f"run {paths.run_id} has no checkpoint of step {step}",
        {"run_id": paths.run_id, "step": step, "available": sorted(entry["step"] for entry in checkpoints)},
    )


# --- warm start ---


def warm_start(ctx: AppContext, source: InitFrom, backend: str) -> dict[str, Any]:
    """The source run's checkpoint a new run on `backend` starts from, checked before anything is recorded:
    {run, step, path, base_model, lora_rank}."""
    with ctx.db.read() as session:
        run = session.get(Run, source.run)
        if run is None:
            raise RunNotFound.for_id(source.run)
        source_backend, tinker = run.backend, dict((run.config or {}).get("tinker") or {})
    if source_backend != backend:
        raise ValidationFailed(
            f"run {source.run} trained on the {source_backend} backend; this run is on {backend}",
            {"field": "init_from", "backend": source_backend},
        )
    checkpoint = checkpoint_of(RunPaths(ctx.settings.data_path, source.run), source.step)
    return {
        "run": source.run,
        "step": checkpoint["step"],
        "path": checkpoint["path"],
        "base_model": tinker.get("base_model"),
        "lora_rank": tinker.get("lora_rank"),
    }


def apply_warm_start(config: dict[str, Any], start: dict[str, Any]) -> None:
    """Write the warm start into the new run's merged config: the trainer reads `tinker.init_from`, the record
    shows `tinker.init_from_run` and `tinker.init_from_step` (the lineage). Its model and LoRA rank must be the
    source's: the adapter is loaded as it is."""
    tinker = config["tinker"]
    for key in ("base_model", "lora_rank"):
        if start[key] is not None and tinker.get(key) != start[key]:
            raise ValidationFailed(
                f"{key} is {tinker.get(key)!r} but run {start['run']} trained {start[key]!r}: a warm start keeps it",
                {"field": "init_from", key: start[key]},
            )
    tinker.update(init_from=start["path"], init_from_run=start["run"], init_from_step=start["step"])


def lineage(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """{run, step} of the checkpoint a run was warm-started from; None for a run started from the base."""
    tinker = (config or {}).get("tinker") or {}
    if not tinker.get("init_from_run"):
        return None
    return {"run": tinker["init_from_run"], "step": tinker.get("init_from_step")}


# --- resume ---


def reopen(ctx: AppContext, replica_id: str, run_id: str, step: int | None) -> None:
    """Make a stopped or failed run `pending` again, to continue from its checkpoint of `step` (the newest when
    None) with its optimiser state: later checkpoints and metrics are dropped, new ports chosen (the old ones may
    be taken by now), and its failure cleared. The manager's admission starts it as any pending run."""
    paths = RunPaths(ctx.settings.data_path, run_id)
    with ctx.db.session() as session:
        run = load_row(session, Run, run_id, RunNotFound)
        if run.status not in RESUMABLE:
            raise InvalidState(
                f"run {run_id} is {run.status}: only a stopped or failed run resumes",
                {"run_id": run_id, "status": run.status},
            )
        checkpoint = checkpoint_of(paths, step)
        _require_steps_left(run_id, checkpoint["step"], run.total_steps)
        ports = Ports(*free_ports(2))
        config = with_ports(run.config, ports)
        paths.config.write_text(run_config.render_yaml(config))
        rewind(paths, checkpoint["step"])
        session.execute(delete(RunMetric).where(RunMetric.run_id == run_id, RunMetric.step > checkpoint["step"]))
        reopened = lifecycle.reopen(
            session,
            run_id,
            RESUMABLE,
            config=config,
            ports=ports.to_dict(),
            last_step=checkpoint["step"],
            owner_id=replica_id,  # this replica starts it (admission admits a replica's own runs)
            heartbeat_at=utcnow(),
        )
        if not reopened:  # it moved meanwhile (another resume won)
            raise InvalidState(f"run {run_id} changed state meanwhile", {"run_id": run_id})
        session.execute(update(Run).where(Run.id == run_id).values(executor_handle=None, weights=checkpoint["weights"]))


def _require_steps_left(run_id: str, step: int, total: int | None) -> None:
    """A checkpoint of the run's last step leaves its trainer nothing to do: it would exit at once, before it was
    ready, and fail the run (a run stopped just as it finished its steps has one)."""
    if total is not None and step >= total:
        raise InvalidState(
            f"run {run_id}'s checkpoint of step {step} is of its last step: nothing is left to train; a new run "
            "warm-started from it (init_from) trains on",
            {"run_id": run_id, "step": step, "total_steps": total},
        )


def with_ports(config: dict[str, Any], ports: Ports) -> dict[str, Any]:
    """The merged config with the run's processes on `ports`."""
    updated: dict[str, Any] = json.loads(json.dumps(config))
    updated["env"]["rollout_server_url"] = f"http://127.0.0.1:{ports.api}"
    for server in updated.get("openai") or []:
        server["base_url"] = f"http://127.0.0.1:{ports.inference}/v1"
    updated["tinker"]["inference_port"] = ports.inference
    return updated


def rewind(paths: RunPaths, step: int) -> None:
    """The run's files as they were at `step`: the trainer's state lists no later checkpoint (it resumes from the
    newest it lists) and the metrics files no later step (the service reads them again from the start)."""
    state = json.loads(paths.trainer_state.read_text())
    state["checkpoints"] = [entry for entry in state.get("checkpoints") or [] if entry["step"] <= step]
    state["step"] = step
    state["status"], state["error"], state["failure_kind"] = "stopped", None, None
    newest = max(state["checkpoints"], key=lambda entry: entry["step"])
    state["weights"] = newest.get("weights", newest["path"])
    if (state.get("best_checkpoint") or {}).get("step", 0) > step:
        state["best_checkpoint"] = None
    if (state.get("collapse") or {}).get("step", 0) > step:
        state["collapse"] = None
    _replace(paths.trainer_state, json.dumps(state, indent=2))
    for path in (paths.metrics, paths.env_metrics):
        _keep_steps_up_to(path, step)


def _keep_steps_up_to(path: Path, step: int) -> None:
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("step"), int) or entry["step"] <= step:
            kept.append(line)
    _replace(path, "".join(line + "\n" for line in kept))


def _replace(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
