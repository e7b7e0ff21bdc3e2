"""A checkpoint's archive (GET /runs/{id}/checkpoints/{step}/archive), built from real files: what it holds, what it
leaves out, and the checkpoints it refuses."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from rlctl.service.errors import CheckpointNotFound, InvalidState
from rlctl.service.runs.archive import CHUNK_BYTES, checkpoint_files, tar_stream
from rlctl.service.runs.paths import RunPaths


@pytest.fixture
def paths(tmp_path: Path) -> RunPaths:
    paths = RunPaths(tmp_path / "var", "run1")
    step = paths.run_dir / "checkpoints" / "step_4"
    step.mkdir(parents=True)
    (step / "adapter_model.safetensors").write_bytes(os.urandom(CHUNK_BYTES * 2 + 777))  # several chunks, padded
    (step / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16}))
    (step / "optimizer.pt").write_bytes(b"the run's own")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    checkpoints = [
        {"step": 4, "path": str(step), "weights": str(step)},
        {"step": 5, "path": "tinker://model/weights/step_5", "weights": "tinker://model/sampler_weights/step_5"},
        {"step": 6, "path": str(outside), "weights": str(outside)},
    ]
    paths.trainer_state.write_text(json.dumps({"checkpoints": checkpoints}))
    return paths


def test_the_archive_holds_the_adapter_and_its_config(paths: RunPaths) -> None:
    top, files = checkpoint_files(paths, 4)
    data = b"".join(tar_stream(top, files))
    assert len(data) % tarfile.RECORDSIZE % tarfile.BLOCKSIZE == 0
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        names = archive.getnames()
        assert names == ["run1-step_4/adapter_config.json", "run1-step_4/adapter_model.safetensors"]
        source = paths.run_dir / "checkpoints" / "step_4"
        for member in archive.getmembers():
            extracted = archive.extractfile(member)
            assert extracted is not None
            assert extracted.read() == (source / Path(member.name).name).read_bytes()


@pytest.mark.parametrize(
    ("step", "error", "code"),
    [
        (5, InvalidState, "INVALID_STATE"),
        (6, InvalidState, "INVALID_STATE"),
        (7, CheckpointNotFound, "CHECKPOINT_NOT_FOUND"),
    ],
)
def test_what_cannot_be_archived_is_refused(paths: RunPaths, step: int, error: type, code: str) -> None:
    """A checkpoint on Tinker, one outside the run's directory (a state file that lies), a step without one."""
    with pytest.raises(error) as refused:
        checkpoint_files(paths, step)
    assert refused.value.code == code
