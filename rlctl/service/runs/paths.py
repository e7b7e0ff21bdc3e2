"""Where a run's files live under the data directory (see docs/ARCHITECTURE.md)."""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROLES = ("api", "trainer", "env")
STATES_KEPT = 256  # trainer states kept parsed (a run's record reads its run's on every request)


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
        return Path(self._log_name(role))

    def logs(self) -> dict[str, str]:
        # joined as text: a run's record lists them on every read, and three Path joins were a tenth of its own time
        return {role: self._log_name(role) for role in ROLES}

    def _log_name(self, role: str) -> str:
        return os.path.join(self.data_dir, "logs", "rl_training", f"{role}_{self.run_id}.log")

    def read_trainer_state(self) -> dict[str, Any] | None:
        """The trainer's state, or None where it has written none (or none whole). Shared between callers:
        read it, never change it."""
        return _trainer_states.read(self.trainer_state)


class _ParsedFiles:
    """JSON files parsed once per version. The trainer replaces its state file by a rename, so a new version is
    a new inode: a stat (a microsecond or two) tells whether the parsed one is current, where reading and
    parsing the file again cost a run's record a twentieth of its time."""

    def __init__(self, kept: int) -> None:
        self._kept = kept
        self._parsed: OrderedDict[Path, tuple[tuple[int, int, int], dict[str, Any]]] = OrderedDict()

    def read(self, path: Path) -> dict[str, Any] | None:
        try:
            version = _version(path)
            kept = self._parsed.get(path)
            if kept is not None and kept[0] == version:
                return kept[1]
            state = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return None
        if not isinstance(state, dict):
            return None
        self._parsed[path] = (version, state)
        self._parsed.move_to_end(path)  # the least recently parsed go first
        while len(self._parsed) > self._kept:
            self._parsed.popitem(last=False)
        return state


_trainer_states = _ParsedFiles(STATES_KEPT)


def file_version(path: Path) -> tuple[int, int, int] | None:
    """A file's version (inode, modification time, size), None where there is none: a file replaced by a rename
    (as the trainer writes its state) or rewritten has a new one."""
    try:
        return _version(path)
    except OSError:
        return None


def _version(path: Path) -> tuple[int, int, int]:
    stat = os.stat(path)
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)
