"""A checkpoint's weights as a tar stream (GET /runs/{id}/checkpoints/{step}/archive): the LoRA adapter and its
config, written as it is read, never whole in memory or on disk (docs/RUNS.md#weights-out)."""

from __future__ import annotations

import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

from rlctl.service.errors import InvalidState
from rlctl.service.runs.continuation import checkpoint_of
from rlctl.service.runs.paths import RunPaths

CHUNK_BYTES = 1 << 20
BLOCK = tarfile.BLOCKSIZE
# The optimiser state is the run's own, for a resume; what leaves is the adapter and what describes it.
LEFT_OUT = frozenset({"optimizer.pt"})


def checkpoint_files(paths: RunPaths, step: int) -> tuple[str, list[Path]]:
    """(the archive's top directory name, the files it holds) of the run's local checkpoint of `step`."""
    checkpoint = checkpoint_of(paths, step)
    location = str(checkpoint["path"])
    if "://" in location:
        raise InvalidState(
            f"the checkpoint of step {step} lives on the Tinker service ({location}): download it from there",
            {"run_id": paths.run_id, "step": step, "path": location},
        )
    directory = Path(location).resolve()
    if not directory.is_dir() or not directory.is_relative_to(paths.run_dir.resolve()):
        raise InvalidState(
            f"the checkpoint of step {step} is not in the run's directory any more",
            {"run_id": paths.run_id, "step": step},
        )
    files = sorted(p for p in directory.iterdir() if p.is_file() and not p.is_symlink() and p.name not in LEFT_OUT)
    return f"{paths.run_id}-step_{step}", files


def tar_stream(top: str, files: list[Path]) -> Iterator[bytes]:
    """A ustar archive of `files` under `top/`, one header then the file's chunks at a time."""
    for path in files:
        size = path.stat().st_size
        info = tarfile.TarInfo(f"{top}/{path.name}")
        info.size, info.mode, info.mtime = size, 0o644, int(time.time())
        yield info.tobuf(format=tarfile.USTAR_FORMAT)
        sent = 0
        with path.open("rb") as handle:
            while sent < size and (chunk := handle.read(min(CHUNK_BYTES, size - sent))):
                sent += len(chunk)
                yield chunk
        if sent != size:  # changed under us: an archive with a wrong size would be corrupt, so end it here
            raise OSError(f"{path} changed while it was archived")
        if size % BLOCK:
            yield b"\0" * (BLOCK - size % BLOCK)
    yield b"\0" * (2 * BLOCK)
