"""The control plane's side of a run on another node (docs/RAY.md#what-crosses-the-network-and-what-does-not).

A run on Ray has no file system in common with the control plane. Its node-side supervisor (rlctl/supervisor/node.py)
fetches its plan once and then reports every interval; both calls carry a per-run secret, never the API token:

- `issue_bootstrap_secret` makes the secret the job is submitted with and stores its SHA-256 only;
- `node_plan` accepts it once, answers the plan and a new run secret (whose hash replaces the first), so the
  bootstrap secret that Ray keeps in its job records opens nothing once the run has started;
- `node_report` accepts the run secret: it writes the mirrored log, metrics and trainer-state files where a local
  run's processes would have written them (so logs, follow, metrics and results read them unchanged), hands the
  supervisor's events to the executor, and answers how much of each file it holds and whether to stop.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import sys
from pathlib import Path

from sqlalchemy import select, update

from rlctl.service.context import AppContext
from rlctl.service.db.models import Run
from rlctl.service.environments.catalog import EnvironmentCatalog
from rlctl.service.errors import Conflict, Unauthorized, Unavailable
from rlctl.service.runs import lifecycle
from rlctl.service.runs.admission import run_resources
from rlctl.service.runs.launch import Ports, process_specs
from rlctl.service.runs.paths import RunPaths
from rlctl.service.runs.schemas import NodePlan, NodeProcess, NodeReport, NodeReportAnswer, NodeSupervision
from rlctl.service.runs.wandb import WandbMode, run_wandb_mode
from rlctl.service.settings import REPO_ROOT
from rlctl.supervisor.node import DATA_TOKEN, PYTHON_TOKEN, REPO_TOKEN
from rlctl.supervisor.process import ProcessSpec
from rlctl.supervisor.run import API, ENV, TRAINER

BAD_SECRET = "unknown run or wrong run secret"
PLAN_SKIPPED = {"metrics.jsonl", "env_metrics.jsonl", "trainer_state.json", "config.yaml"}


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def issue_bootstrap_secret(ctx: AppContext, run_id: str) -> str:
    """A new secret for the run's job; only its hash is stored. Never logged, never in a response."""
    secret = secrets.token_urlsafe(32)
    with ctx.db.session() as session:
        session.execute(update(Run).where(Run.id == run_id).values(node_secret_hash=secret_hash(secret)))
    return secret


def _check(ctx: AppContext, run_id: str, given: str | None) -> str:
    """The stored hash when `given` is the run's current secret; else 401 (the same answer for an unknown run)."""
    with ctx.db.read() as session:
        stored = session.scalar(select(Run.node_secret_hash).where(Run.id == run_id))
    if not given or not stored or not hmac.compare_digest(secret_hash(given), stored):
        raise Unauthorized(BAD_SECRET)
    return stored


def node_plan(ctx: AppContext, run_id: str, given: str | None) -> NodePlan:
    stored = _check(ctx, run_id, given)
    run_secret = secrets.token_urlsafe(32)
    with ctx.db.session() as session:  # compare-and-set: one fetch spends the bootstrap secret
        spent = session.execute(
            update(Run)
            .where(Run.id == run_id, Run.node_secret_hash == stored, Run.status == lifecycle.STARTING)
            .values(node_secret_hash=secret_hash(run_secret))
        )
        if spent.rowcount != 1:  # type: ignore[attr-defined]  # an UPDATE's result has it; Result[Any] does not say so
            status = session.scalar(select(Run.status).where(Run.id == run_id))
            if status != lifecycle.STARTING:
                # Stopped (or ended) before its node asked: the start is cancelled, nothing of it starts.
                raise Conflict(f"run {run_id} is {status}, not starting: no plan")
            raise Unauthorized(BAD_SECRET)
        run = session.get_one(Run, run_id)
        environment, backend, ports = run.environment, run.backend, Ports(**run.ports)
        wandb_mode = run_wandb_mode(ctx.settings, run.wandb)
        gpus = run_resources(run).gpus
    return build_plan(ctx, run_id, run_secret, environment, backend, ports, wandb_mode, gpus)


def build_plan(
    ctx: AppContext,
    run_id: str,
    run_secret: str,
    environment: str,
    backend: str,
    ports: Ports,
    wandb_mode: WandbMode,
    gpus: int = 0,
) -> NodePlan:
    settings = ctx.settings
    paths = RunPaths(settings.data_path, run_id)
    environment_file = EnvironmentCatalog.of(ctx).get(environment).file_path
    specs = process_specs(settings, paths, ports, environment_file, backend, wandb_mode)
    shipped_environment = paths.run_dir / "environment" / environment_file.name
    tokens = _Tokens(settings.data_path)
    files = {
        tokens.relative(paths.config): tokens.text(paths.config.read_text()),
        tokens.relative(shipped_environment): environment_file.read_text(),
    }
    for path in sorted(paths.run_dir.rglob("*")):  # a dataset run's split (docs/RUNS.md#training-on-a-dataset)
        if (
            path.is_file()
            and path.name not in PLAN_SKIPPED
            and "environment" not in path.relative_to(paths.run_dir).parts[:1]
        ):
            files[tokens.relative(path)] = tokens.text(path.read_text())
    processes = []
    for spec in specs:
        argv = [str(shipped_environment) if arg == str(environment_file) else arg for arg in spec.argv]
        processes.append(_process(tokens, spec, argv))
    prepare: list[str] = []
    if backend == "local" and not settings.local_base_model:
        prepare = [
            PYTHON_TOKEN,
            "-c",
            "import sys; from rlctl.trainer.tiny_model import init_tiny_model; init_tiny_model(sys.argv[1])",
            tokens.text(str(settings.tiny_model_dir)),
        ]
    return NodePlan(
        run_id=run_id,
        secret=run_secret,
        files=files,
        processes=processes,
        prepare=prepare,
        logs={role: tokens.text(str(paths.log(role))) for role in (API, TRAINER, ENV)},
        supervision=NodeSupervision(
            stop_grace_s=settings.stop_grace_s,
            poll_interval_s=settings.monitor_interval_s,
            stall_after_s=settings.stall_after_s,
            drain_timeout_s=settings.drain_timeout_s,
            report_interval_s=settings.ray_report_interval_s,
            fork_server=settings.fork_server,
        ),
        gpus=gpus,
    )


class _Tokens:
    """The control plane's own paths → the placeholders each node replaces with its own (longest first)."""

    def __init__(self, data_path: Path) -> None:
        self.data_path = data_path
        pairs = [(str(data_path), DATA_TOKEN), (sys.executable, PYTHON_TOKEN), (str(REPO_ROOT), REPO_TOKEN)]
        self.pairs = sorted(pairs, key=lambda pair: len(pair[0]), reverse=True)

    def text(self, value: str) -> str:
        for own, token in self.pairs:
            value = value.replace(own, token)
        return value

    def relative(self, path: Path) -> str:
        return str(path.relative_to(self.data_path))


def _process(tokens: _Tokens, spec: ProcessSpec, argv: list[str]) -> NodeProcess:
    ready = spec.ready
    kind, url = getattr(ready, "kind", None), getattr(ready, "url", None)
    probe = {"kind": str(kind), "url": str(url)} if kind and url else {}
    envs = getattr(ready, "envs", 1)
    if probe and envs != 1:  # a mixed run's environments (docs/RUNS.md#mixed-environments)
        probe["envs"] = str(envs)
    # Only what this process adds to an environment: the node's own PATH, HOME, ... stay the node's.
    env = {k: tokens.text(v) for k, v in spec.env.items() if os.environ.get(k) != v}
    return NodeProcess(
        role=spec.role,
        argv=[tokens.text(arg) for arg in argv],
        env=env,
        cwd=tokens.text(str(spec.cwd)),
        log_path=tokens.text(str(spec.log_path)),
        ready=probe,
        ready_timeout_s=spec.ready_timeout_s,
        after=list(spec.after) if spec.after is not None else None,
        probe_after=list(spec.probe_after),
    )


# --- reports ---


def mirrored_files(paths: RunPaths) -> dict[str, Path]:
    return {
        "log/api": paths.log(API),
        "log/trainer": paths.log(TRAINER),
        "log/env": paths.log(ENV),
        "metrics": paths.metrics,
        "env_metrics": paths.env_metrics,
    }


def node_report(ctx: AppContext, sink: object, run_id: str, given: str | None, report: NodeReport) -> NodeReportAnswer:
    _check(ctx, run_id, given)
    if not hasattr(sink, "deliver"):
        raise Conflict("this control plane does not run runs on Ray (RLCTL_EXECUTOR is not ray)")
    paths = RunPaths(ctx.settings.data_path, run_id)
    files = mirrored_files(paths)
    for name, chunk in report.files.items():
        _write_at(files[name], chunk.offset, base64.b64decode(chunk.data))
    if report.trainer_state is not None:
        _replace(paths.trainer_state, json.dumps(report.trainer_state))
    if report.events:
        log_paths = {role: paths.log(role) for role in (API, TRAINER, ENV)}
        events = [event.model_dump() for event in report.events]
        if not sink.deliver(run_id, events, log_paths):
            # Not watched here yet (the control plane is starting): the node keeps the events and sends them again.
            raise Unavailable("this run is not watched by this control plane now; report again")
    with ctx.db.read() as session:
        status = session.scalar(select(Run.status).where(Run.id == run_id))
    return NodeReportAnswer(
        offsets={name: _size(path) for name, path in files.items()},
        stop=status in (lifecycle.STOPPING, *lifecycle.TERMINAL),
    )


def _write_at(path: Path, offset: int, data: bytes) -> None:
    """The node's bytes from `offset` on: a resend overwrites, a gap (never expected) is refused by not writing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    size = _size(path)
    if offset > size:
        return  # the answer's offsets tell the node where to resend from
    with path.open("r+b" if path.exists() else "wb") as handle:
        handle.seek(offset)
        handle.write(data)
        handle.truncate()


def _replace(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.node")
    staging.write_text(text)
    staging.replace(path)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
