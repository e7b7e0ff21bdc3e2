"""The local backend's tiny model, built once per test session and linked into the data directory of each service
a test starts (docs/TESTING.md#real-parts-in-this-process-where-a-socket-is-not-the-point).

A service without one builds it in a child process before its first run: about 10 s of CPU that dozens of
run tests would each pay again for the same 372 KiB of files. Tests of the build itself start without it.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

from rlctl.trainer.tiny_model import COMPLETE_MARKER, default_tiny_model_dir, init_tiny_model

_lock = threading.Lock()
_root: Path | None = None


def keep_session_models_in(directory: Path) -> None:
    """Where this session's model is built, at first use (the session's temporary directory)."""
    global _root
    _root = directory


def session_tiny_model() -> Path:
    if _root is None:
        raise RuntimeError("keep_session_models_in() was not called (tests/conftest.py does it)")
    model = _root / "tiny-qwen3"
    with _lock:
        if not (model / COMPLETE_MARKER).exists():
            init_tiny_model(model, seed=0)
    return model


def seed_tiny_model(data_dir: Path) -> Path:
    """The data directory with the session's tiny model where its service looks for it (hard links: the model's
    files are only ever read)."""
    target = default_tiny_model_dir(data_dir)
    if not (target / COMPLETE_MARKER).exists():
        shutil.copytree(session_tiny_model(), target, copy_function=os.link, dirs_exist_ok=True)
    return data_dir
