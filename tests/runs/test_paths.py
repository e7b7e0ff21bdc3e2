"""A run's trainer state, read back as the trainer replaces it (rlctl/trainer/outputs.py: a temp file, a rename)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rlctl.service.runs.paths import RunPaths


def _replace(path: Path, state: object) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(state))
    os.replace(temporary, path)


def test_each_new_version_of_the_trainer_state_is_read(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path, "run1")
    assert paths.read_trainer_state() is None  # none written yet
    paths.run_dir.mkdir(parents=True)
    _replace(paths.trainer_state, {"step": 1})
    assert paths.read_trainer_state() == {"step": 1}
    assert paths.read_trainer_state() is paths.read_trainer_state()  # parsed once while it is unchanged
    _replace(paths.trainer_state, {"step": 2})  # the same size: a new file all the same
    assert paths.read_trainer_state() == {"step": 2}
    paths.trainer_state.write_text('{"step": 3, "status": "completed"}')  # rewritten in place, longer
    assert paths.read_trainer_state() == {"step": 3, "status": "completed"}


def test_a_partial_or_foreign_state_reads_as_none(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path, "run2")
    paths.run_dir.mkdir(parents=True)
    paths.trainer_state.write_text('{"step": ')
    assert paths.read_trainer_state() is None
    _replace(paths.trainer_state, [1, 2])
    assert paths.read_trainer_state() is None
    paths.trainer_state.unlink()
    assert paths.read_trainer_state() is None
