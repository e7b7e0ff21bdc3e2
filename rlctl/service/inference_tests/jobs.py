"""The `inference_test` job: one child process per model, a bounded number at once, each with its own time-out.

Each child runs the environment's own atroposlib `process` mode (see `child.py`), so prompts, parsing and scoring
are the environment's. A child is its own process group: a crash or a hang in one model's run cannot touch the
others, and a time-out or a cancel kills the whole group. Its output reaches the log only through this process,
scrubbed of every secret. Files are written in a work directory and moved into place when the model ends, so
two tests of the same environment and model never interleave their lines.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import yaml

from rlctl.service.children import service_child_environment
from rlctl.service.context import AppContext
from rlctl.service.environments.catalog import EnvironmentCatalog
from rlctl.service.errors import ServiceError
from rlctl.service.inference_tests import preflight
from rlctl.service.inference_tests.schemas import InferenceTestResult
from rlctl.service.inference_tests.summary import ModelOutcome, model_result, progress_done, result_file_stem, summarize
from rlctl.service.jobs.runner import JobCancelled, JobFailed, JobHandle, JobKind
from rlctl.service.settings import REPO_ROOT, Settings
from rlctl.supervisor.process import ProcessSpec, SupervisedProcess

logger = logging.getLogger("rlctl.inference_tests")

KIND = "inference_test"
WAIT_INTERVAL_S = 0.25
STOP_GRACE_S = 5.0
# How long the output may stay open once the child has ended (its last lines still being read).
OUTPUT_END_WAIT_S = 30.0


def output_directory(settings: Settings) -> Path:
    return settings.data_path / "logs" / "rl_training" / "inference_tests"


@dataclass(frozen=True)
class InferencePlan:
    job_id: str
    environment: str
    env_file: Path
    class_name: str
    num_steps: int
    group_size: int
    models: list[str]
    base_url: str
    edits: dict[str, Any]
    timeout_s: float
    output_dir: Path

    @property
    def work_dir(self) -> Path:
        return self.output_dir / ".work" / self.job_id


def process_config(plan: InferencePlan, settings: Settings, model: str, groups_path: Path) -> dict[str, Any]:
    """The YAML of one model's `process` run: caller's edits < locked values < what a test needs. No key."""
    env = {
        **plan.edits,
        "tokenizer_name": settings.tokenizer_name,
        "max_token_length": settings.max_token_length,
        "group_size": plan.group_size,
        "total_steps": plan.num_steps,
        "use_wandb": False,
        "wandb_name": f"inference-test-{plan.environment}",
        # Every group is kept and counted, all-equal scores included: a smoke test must see every completion.
        "ensure_scores_are_not_same": False,
        "include_messages": True,
        "data_path_to_save_groups": str(groups_path),
        "data_dir_to_save_evals": None,
    }
    openai = {
        "model_name": model,
        "base_url": plan.base_url,
        "api_key": None,  # the openai client reads OPENAI_API_KEY from the child's environment
        "server_type": "openai",
        "health_check": False,
        "timeout": max(1, math.ceil(plan.timeout_s)),
    }
    return {"env": env, "openai": openai, "slurm": False, "testing": False}


def child_environment(settings: Settings, key: str | None) -> dict[str, str]:
    """The service's environment without its secrets, plus the one key this endpoint may have."""
    env = service_child_environment()
    env.update(
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
        OPENAI_API_KEY=key or preflight.NO_KEY,
        # Environments written for SGLang's managed server still run on a plain OpenAI endpoint.
        ATROPOS_ALLOW_DUMMY_MANAGED_SERVER="1",
        WANDB_MODE="disabled",
        RLCTL_DATA_DIR=str(settings.data_path),
    )
    if settings.gsm8k_path:
        env["RLCTL_GSM8K_PATH"] = str(Path(settings.gsm8k_path).expanduser().resolve())
    return env


class ProgressTracker:
    """Steps done per model, reported to the job as done / (num_steps × models)."""

    def __init__(self, handle: JobHandle, models: list[str], num_steps: int) -> None:
        self._handle = handle
        self._num_steps = num_steps
        self._done = dict.fromkeys(models, 0)
        self._ended: set[str] = set()
        self._lock = threading.Lock()
        self.total = num_steps * len(models)

    def steps(self, model: str, done: int) -> None:
        with self._lock:
            if self._done[model] == done:
                return
            self._done[model] = done
            self._write()

    def ended(self, model: str) -> None:
        with self._lock:
            self._ended.add(model)
            self._write()

    def _write(self) -> None:
        # Under the lock: the models' threads write in the order they counted, so a smaller count computed
        # earlier never lands after a larger one (the job once ended `succeeded` at 4 of 6).
        self._handle.progress(progress_done(self._done, self._ended, self._num_steps), self.total, force=True)


class RecordReader:
    """Reads the child's records file as it grows; a trailing partial line waits for the next read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._pending = b""
        self.steps: list[dict[str, Any]] = []
        self.ending: dict[str, Any] | None = None

    def read(self) -> None:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return
        self._offset += len(chunk)
        lines = (self._pending + chunk).split(b"\n")
        self._pending = lines.pop()
        for line in filter(None, lines):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "event" in record:
                self.ending = record
            elif isinstance(record.get("step"), int):
                self.steps.append(record)


def pump_output(stream: IO[bytes], log: IO[str], scrub: Callable[[str], str]) -> None:
    """Copy the child's output into the log, line by line, with every secret scrubbed, until its end; then close
    it. Output that comes after the model's log was closed (by a process that outlived the child's group) is
    dropped."""
    with stream, contextlib.suppress(ValueError):  # written to a closed log
        for raw in iter(stream.readline, b""):
            log.write(scrub(raw.decode("utf-8", errors="replace")))
            log.flush()


def job_kinds() -> tuple[JobKind, ...]:
    # Not resumable: a test interrupted by a restart ends failed with the reason, to be submitted again.
    return (JobKind(KIND, run_inference_test, resumable=False),)


def run_inference_test(ctx: AppContext, handle: JobHandle) -> InferenceTestResult:
    """The job handler: plan, run every model, summarise."""
    plan = _plan(ctx, handle)
    try:
        key = preflight.endpoint_key(ctx.settings, plan.base_url)
        preflight.require_tokenizer(ctx.settings.tokenizer_name)
    except ServiceError as error:
        raise JobFailed(error.message) from error
    tracker = ProgressTracker(handle, plan.models, plan.num_steps)
    handle.progress(0, tracker.total, force=True)
    workers = min(ctx.settings.inference_test_concurrency, len(plan.models))
    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"inference-test-{plan.job_id}") as pool:
            runs = [ModelRun(ctx, plan, model, key, tracker, handle) for model in plan.models]
            outcomes = list(pool.map(ModelRun.run_isolated, runs))
    finally:
        shutil.rmtree(plan.work_dir, ignore_errors=True)
        with contextlib.suppress(OSError):  # still in use by another test
            plan.work_dir.parent.rmdir()
    if handle.cancelled:
        raise JobCancelled()
    results = [model_result(outcome) for outcome in outcomes]
    return InferenceTestResult(
        environment=plan.environment,
        base_url=plan.base_url,
        num_steps=plan.num_steps,
        group_size=plan.group_size,
        models_tested=results,
        summary=summarize(results, plan.num_steps, str(plan.output_dir)),
    )


def _plan(ctx: AppContext, handle: JobHandle) -> InferencePlan:
    params = handle.params
    try:
        env = EnvironmentCatalog.of(ctx).get(params["environment"])
    except ServiceError as error:
        raise JobFailed(error.message) from error
    return InferencePlan(
        job_id=handle.job_id,
        environment=env.name,
        env_file=env.file_path,
        class_name=env.class_name,
        num_steps=params["num_steps"],
        group_size=params["group_size"],
        models=list(params["models"]),
        base_url=params["base_url"],
        edits=dict(params.get("config") or {}),
        timeout_s=float(params["timeout_s"]),
        output_dir=output_directory(ctx.settings),
    )


class ModelRun:
    """One model's run: its child process, its files, its outcome."""

    def __init__(
        self,
        ctx: AppContext,
        plan: InferencePlan,
        model: str,
        key: str | None,
        tracker: ProgressTracker,
        handle: JobHandle,
    ) -> None:
        self.ctx, self.plan, self.model, self.tracker, self.handle = ctx, plan, model, tracker, handle
        self.scrub = _scrubber(ctx, key)
        self.key = key
        self.stem = result_file_stem(plan.environment, model)
        self.work = plan.work_dir / self.stem
        self.reader = RecordReader(self.work / "records.jsonl")

    def run_isolated(self) -> ModelOutcome:
        """One model's failure of any kind is that model's result; the others go on."""
        try:
            return self.run()
        except Exception as error:  # noqa: BLE001 - reported as this model's error
            logger.exception("inference test %s: model %s could not be run", self.plan.job_id, self.model)
            self.tracker.ended(self.model)
            message = self.scrub(f"could not run this model: {type(error).__name__}: {error}")
            return ModelOutcome(model=self.model, steps=self.reader.steps, error=message)

    def run(self) -> ModelOutcome:
        if self.handle.cancelled:  # waited for a free slot while the test was cancelled
            self.tracker.ended(self.model)
            return ModelOutcome(self.model, error="cancelled before it started")
        self.work.mkdir(parents=True, exist_ok=True)
        config = process_config(self.plan, self.ctx.settings, self.model, self.work / "groups" / "groups.jsonl")
        (self.work / "config.yaml").write_text(yaml.safe_dump(config))
        log_path = self.work / f"{self.stem}.log"
        started = time.monotonic()
        with log_path.open("w", encoding="utf-8") as log:
            log.write(_header(self.plan, self.model))
            log.flush()
            stop_reason, exit_text = self._supervise(log)
            self.reader.read()
            error = _model_error(self.plan, self.reader, stop_reason, exit_text)
            error = self.scrub(error) if error else None
            log.write(f"[inference test] {self.model}: {len(self.reader.steps)} steps; {error or 'finished'}\n")
        wall_time_s = time.monotonic() - started
        files = _publish(self.plan, self.stem, self.model, self.reader.steps, log_path, self.scrub)
        self.tracker.ended(self.model)
        return ModelOutcome(self.model, steps=self.reader.steps, error=error, wall_time_s=wall_time_s, files=files)

    def _supervise(self, log: IO[str]) -> tuple[str | None, str]:
        """Run the child to its end, its time-out or a cancel. Returns (why it was stopped, how it exited)."""
        spec = ProcessSpec(
            role=f"inference-{self.model}",
            argv=self._argv(),
            env=child_environment(self.ctx.settings, self.key),
            cwd=self.work,
            log_path=Path(log.name),
        )
        deadline = time.monotonic() + self.plan.timeout_s
        # A fork server still starting (seconds of imports) is waited for within the time-out and until a cancel;
        # past either, the child is started by itself, and ended at once below. Its own process group: a time-out
        # kills everything it started.
        process, output = SupervisedProcess.spawn_piped(
            spec,
            self.ctx.children.fork_server,
            give_up=lambda: self.handle.cancelled or time.monotonic() >= deadline,
        )
        pump = threading.Thread(target=pump_output, args=(output, log, self.scrub), daemon=True)
        pump.start()
        stop_reason = None
        try:
            stop_reason = self._wait(process, deadline)
        finally:
            # Whatever happened here (a time-out, a cancel, an error of ours), the child does not outlive it.
            status = process.terminate(grace_s=STOP_GRACE_S)
            pump.join(timeout=OUTPUT_END_WAIT_S)
            if pump.is_alive():  # left to end with the last writer: closing a stream being read waits for the read
                logger.warning(
                    "inference test %s: the output of model %s was still open %g s after its process group ended",
                    self.plan.job_id,
                    self.model,
                    OUTPUT_END_WAIT_S,
                )
        return stop_reason, status.describe() if status else "ended"

    def _wait(self, process: SupervisedProcess, deadline: float) -> str | None:
        # Between waits the records are read and the cancel and time-out checked; the child's end wakes the wait.
        while process.wait(WAIT_INTERVAL_S) is None:
            self.reader.read()
            self.tracker.steps(self.model, len(self.reader.steps))
            if self.handle.cancelled:
                return "cancelled"
            if time.monotonic() >= deadline:
                return "timed_out"
        return None

    def _argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "rlctl.service.inference_tests.child",
            str(self.plan.env_file),
            self.plan.class_name,
            str(self.work / "config.yaml"),
            str(self.work / "records.jsonl"),
        ]


def _scrubber(ctx: AppContext, key: str | None) -> Callable[[str], str]:
    def scrub(text: str) -> str:
        text = ctx.scrub(text)
        return text.replace(key, "***") if key else text

    return scrub


def _model_error(plan: InferencePlan, reader: RecordReader, stop_reason: str | None, exit_text: str) -> str | None:
    done = f"{len(reader.steps)} of {plan.num_steps} steps done"
    if stop_reason == "timed_out":
        return f"timed out after {plan.timeout_s:g} s ({done})"
    if stop_reason == "cancelled":
        return f"cancelled ({done})"
    if reader.ending and reader.ending.get("event") == "error":
        return f"{reader.ending.get('message')} ({done})"
    if not reader.ending:
        return f"the environment process {exit_text} without a result ({done}); see its log"
    return None


def _publish(
    plan: InferencePlan, stem: str, model: str, steps: list[dict[str, Any]], log_path: Path, scrub: Callable[[str], str]
) -> dict[str, str]:
    """Move this model's files into the output directory, each replaced whole."""
    plan.output_dir.mkdir(parents=True, exist_ok=True)
    staged = log_path.with_suffix(".jsonl")
    with staged.open("w", encoding="utf-8") as handle:
        for record in steps:
            line = {"environment": plan.environment, "model": model, **record}
            handle.write(scrub(json.dumps(line, default=str)) + "\n")
    files = {"jsonl": str(plan.output_dir / f"{stem}.jsonl"), "log": str(plan.output_dir / f"{stem}.log")}
    os.replace(staged, files["jsonl"])
    os.replace(log_path, files["log"])
    return files


def _header(plan: InferencePlan, model: str) -> str:
    started = datetime.now(UTC).isoformat(timespec="seconds")
    return (
        f"[inference test] job {plan.job_id} started {started}: environment {plan.environment}, model {model}, "
        f"endpoint {plan.base_url}, {plan.num_steps} steps x {plan.group_size} completions, "
        f"time-out {plan.timeout_s:g} s\n"
    )
