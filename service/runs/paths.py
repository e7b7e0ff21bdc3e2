"""Where a run's files live under the data directory (see docs/ARCHITECTURE.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROLES = ("api", "trainer", "env")


@dataclass(frozen=True)
class RunPaths:
    data_dir: Path
    run_id: str

    @property
    def run_dir(self) -> Path:
        return self.data_dir / "runs" / self.run_id

    @property
    def config(self) -> Path:
        return self.run_dir / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    @property
    def env_metrics(self) -> Path:
        return self.run_dir / "env_metrics.jsonl"

    @property
    def trainer_state(self) -> Path:
        return self.run_dir / "trainer_state.json"

    def log(self, role: str) -> Path:
        return self.data_dir / "logs" / "rl_training" / f"{role}_{self.run_id}.log"

    def logs(self) -> dict[str, str]:
        return {role: str(self.log(role)) for role in ROLES}

    def read_trainer_state(self) -> dict[str, Any] | None:
        try:
            state = json.loads(self.trainer_state.read_text())
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) else None
