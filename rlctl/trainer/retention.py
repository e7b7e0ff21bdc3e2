"""Which local checkpoints a run keeps (docs/TRAINER.md#retention): the newest `keep_last_n`, the best, the pinned
ones, and any in use. Pins and leases are files, so the trainer, the service and `rlctl model serve` share them
without talking: `pinned_checkpoints.json` in the run directory (the service writes it), and a lease file per user
in a checkpoint's `.leases/` (an evaluation or a server holds it while it may still load that checkpoint)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

PINNED_FILE = "pinned_checkpoints.json"
LEASES_DIR = ".leases"


def to_delete(steps: Iterable[int], keep_last_n: int, keep: set[int]) -> list[int]:
    """The steps to delete: all but the newest `keep_last_n` and those in `keep` (best, pinned, in use)."""
    ordered = sorted(set(steps))
    newest = set(ordered[-keep_last_n:]) if keep_last_n > 0 else set()
    return [step for step in ordered if step not in newest and step not in keep]


def pinned_steps(run_dir: Path) -> set[int]:
    try:
        value = json.loads((run_dir / PINNED_FILE).read_text())
    except (OSError, ValueError):
        return set()
    return {int(step) for step in value.get("steps", []) if isinstance(step, int)} if isinstance(value, dict) else set()


def write_pinned(run_dir: Path, steps: set[int]) -> None:
    temporary = run_dir / f".{PINNED_FILE}.tmp"
    temporary.write_text(json.dumps({"steps": sorted(steps)}))
    os.replace(temporary, run_dir / PINNED_FILE)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def in_use(directory: Path) -> bool:
    """A live holder's lease is in the checkpoint's `.leases/` (a lease is named `{pid}-{holder}`; one whose process
    is gone no longer holds it)."""
    leases = directory / LEASES_DIR
    if not leases.is_dir():
        return False
    for lease in leases.iterdir():
        pid = lease.name.split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            return True
    return False


@contextlib.contextmanager
def leased(directory: Path, holder: str) -> Iterator[None]:
    """Hold `directory` (a local checkpoint) against retention while the block runs."""
    lease = directory / LEASES_DIR / f"{os.getpid()}-{holder}"
    try:
        lease.parent.mkdir(exist_ok=True)
        lease.touch()
    except OSError:  # not a checkpoint directory of ours (a read-only copy, a hub id): nothing to hold
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            lease.unlink()


def prune(run_dir: Path, checkpoints: list[dict[str, Any]], keep_last_n: int, best_step: int | None) -> list[int]:
    """Delete the local checkpoints retention does not keep; returns their steps (the caller drops them from its
    list). A checkpoint directory outside `run_dir` is never touched."""
    keep = pinned_steps(run_dir) | ({best_step} if best_step is not None else set())
    by_step = {entry["step"]: Path(entry["path"]) for entry in checkpoints if "://" not in str(entry["path"])}
    keep |= {step for step, directory in by_step.items() if in_use(directory)}
    deleted = []
    for step in to_delete(by_step, keep_last_n, keep):
        directory = by_step[step].resolve()
        if directory.is_relative_to(run_dir.resolve()):
            shutil.rmtree(directory, ignore_errors=True)
            deleted.append(step)
    return deleted
