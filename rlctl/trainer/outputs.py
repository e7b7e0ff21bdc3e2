"""What the trainer leaves in the run directory for the control plane: metrics.jsonl and trainer_state.json,
plus an optional mirror of the metrics to Weights & Biases (docs/TRAINER.md#outputs has the contracts)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlctl.trainer.backends.base import Checkpoint

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
STATE_FILE = "trainer_state.json"


class MetricsWriter:
    """Appends whole JSON lines and flushes each one, so a reader never sees a torn line except the last."""

    def __init__(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / METRICS_FILE
        self._file = self.path.open("a", encoding="utf-8")

    def _append(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self._append({"step": step, "time": time.time(), "metrics": metrics})

    def waiting_for_rollouts(self, step: int, waited_s: float) -> None:
        self._append(
            {
                "event": "waiting_for_rollouts",
                "time": time.time(),
                "waited_s": round(waited_s, 3),
                "step": step,
            }
        )

    def event(self, step: int, name: str, **fields: Any) -> None:
        self._append({"event": name, "time": time.time(), "step": step, **fields})

    def warning(self, step: int, record: dict[str, Any]) -> None:
        self._append({"event": "warning", "time": time.time(), "step": step, **record})

    def close(self) -> None:
        self._file.close()


@dataclass
class TrainerState:
    step: int = 0
    total_steps: int = 0
    status: str = "running"  # running | completed | stopped | failed
    backend: str = ""
    base_model: str | None = None
    wandb_run_name: str | None = None
    wandb_url: str | None = None
    wandb_run_id: str | None = None
    weights: str | None = None
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    waiting_for_rollouts_s: float | None = None
    warnings: list[dict[str, Any]] = field(default_factory=list)  # BackendWarning records, each once per run
    error: str | None = None
    failure_kind: str | None = None  # the kind the trainer failed with (docs/RUNS.md#failure-kinds), else None
    best_checkpoint: dict[str, Any] | None = None  # the checkpoint with the best value of the run's metric
    collapse: dict[str, Any] | None = None  # set once a collapse is detected (rlctl/trainer/health.py)
    health: dict[str, Any] | None = None  # RunHealth's state, for a resume
    updated_at: float = 0.0

    def last_checkpoint(self) -> Checkpoint | None:
        if not self.checkpoints:
            return None
        record = max(self.checkpoints, key=lambda entry: entry["step"])
        return Checkpoint(step=record["step"], path=record["path"], weights=record.get("weights", record["path"]))

    def add_warning(self, record: dict[str, Any]) -> bool:
        """Keep `record` unless the same (code, parameter) is already listed; True when it is new."""
        key = (record["code"], record.get("parameter"))
        if any((entry.get("code"), entry.get("parameter")) == key for entry in self.warnings):
            return False
        self.warnings.append(record)
        return True

    def add_checkpoint(self, checkpoint: Checkpoint, value: float | None = None) -> None:
        """`value`: the run's metric over the steps since the checkpoint before (ranks the checkpoints)."""
        self.checkpoints = [entry for entry in self.checkpoints if entry["step"] != checkpoint.step]
        self.checkpoints.append({**checkpoint.as_record(), "value": value})
        self.weights = checkpoint.weights


class TrainerStateStore:
    """trainer_state.json, rewritten atomically (temp file + rename)."""

    def __init__(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / STATE_FILE

    def load(self) -> TrainerState:
        if not self.path.exists():
            return TrainerState()
        data = json.loads(self.path.read_text())
        known = {name for name in TrainerState.__dataclass_fields__}
        return TrainerState(**{key: value for key, value in data.items() if key in known})

    def save(self, state: TrainerState) -> None:
        state.updated_at = time.time()
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        temporary.write_text(json.dumps(asdict(state), indent=2))
        os.replace(temporary, self.path)


def wandb_configured() -> bool:
    return bool(os.environ.get("WANDB_API_KEY")) or os.environ.get("WANDB_MODE") == "offline"


WANDB_FINISH_TIMEOUT_S = 30.0


class WandbMirror:
    """Logs each step's metrics to W&B when it is configured; W&B never blocks or fails training.

    When W&B cannot start online (unreachable, key rejected, init time-out), the mirror starts offline in the run
    directory, and `offline_reason` says why (a run warning); when it cannot start at all, there is no mirror.
    """

    def __init__(self, run: Any | None, offline_reason: str | None = None, offline_dir: Path | None = None) -> None:
        self._run = run
        self.offline_reason = offline_reason
        self.offline_dir = offline_dir
        self.log_error: str | None = None  # the first failed `log`, for a run warning

    @classmethod
    def start(
        cls, project: str, name: str, group: str, run_dir: Path, config: dict[str, Any], resume_id: str | None
    ) -> WandbMirror:
        if not wandb_configured():
            return cls(None)
        arguments: dict[str, Any] = {
            "project": project,
            "name": name,
            "group": group,
            "dir": str(run_dir),
            "config": config,
            "id": resume_id,
            "resume": "allow" if resume_id else None,
        }
        try:
            import wandb
        except ImportError as error:
            log.warning("W&B is configured but cannot be imported (%s); continuing without it", error)
            return cls(None, f"W&B cannot be imported ({error})")
        try:
            return cls(wandb.init(**arguments))
        except Exception as error:  # W&B is a mirror; metrics.jsonl stays the record
            reason = f"W&B could not start online ({type(error).__name__}: {error})"
        log.warning("%s; logging offline in %s", reason, run_dir / "wandb")
        try:
            return cls(wandb.init(**arguments, mode="offline"), reason, run_dir / "wandb")
        except Exception as error:
            log.warning("W&B could not start offline either (%s); continuing without it", error)
            return cls(None, f"{reason}; offline too ({type(error).__name__})")

    def log_warning(self) -> dict[str, Any] | None:
        """The run warning for W&B failing mid-run (training goes on; metrics.jsonl has every step)."""
        if self.log_error is None:
            return None
        message = f"W&B failed to log ({self.log_error}); training goes on and the run's metrics are complete"
        return {"code": "wandb_log_failed", "parameter": None, "message": message}

    def warning(self) -> dict[str, Any] | None:
        """The run warning for a mirror that fell back to offline (or to nothing)."""
        if self.offline_reason is None:
            return None
        where = f"; offline files in {self.offline_dir} (sync with `wandb sync {self.offline_dir}/offline-run-*`)"
        return {
            "code": "wandb_offline",
            "parameter": None,
            "message": self.offline_reason + (where if self.offline_dir else "") + "; the run's metrics are complete",
        }

    @property
    def run_name(self) -> str | None:
        return self._run.name if self._run is not None else None

    @property
    def run_url(self) -> str | None:
        if self._run is None or self.offline_dir is not None:
            return None
        return getattr(self._run, "url", None)

    @property
    def run_id(self) -> str | None:
        return self._run.id if self._run is not None else None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self._run is None:
            return
        try:
            self._run.log(metrics, step=step)
        except Exception as error:
            log.warning("W&B log failed at step %d: %s", step, error)
            self.log_error = self.log_error or f"step {step}: {type(error).__name__}: {error}"

    def finish(self, exit_code: int = 0, timeout_s: float = WANDB_FINISH_TIMEOUT_S) -> None:
        """Finish the W&B run, waiting at most `timeout_s`: an upload stuck on an outage never holds the exit."""
        if self._run is None:
            return
        run = self._run

        def finish() -> None:
            try:
                run.finish(exit_code=exit_code)
            except Exception as error:
                log.warning("W&B finish failed: %s", error)

        thread = threading.Thread(target=finish, name="wandb-finish", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning("W&B did not finish within %.0f s; leaving its upload behind", timeout_s)
