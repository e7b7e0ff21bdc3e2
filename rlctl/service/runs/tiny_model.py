"""The local backend's default base model, built once per data directory in a child process.

Building it imports torch and transformers (seconds of CPU, and hundreds of MiB the service would keep for good),
so the service never does it itself: `python -m rlctl.trainer.tiny_model DIR` does, at start-up in the background
(docs/RUNS.md#start-up-work) or before a run's first process. Callers wait for one build; a finished one is seen
by its marker file.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from rlctl.service.children import ChildRunner
from rlctl.service.context import Component
from rlctl.service.settings import REPO_ROOT
from rlctl.trainer.tiny_model import COMPLETE_MARKER

BUILD_TIMEOUT_S = 600.0


class TinyModelBuilder(Component):
    def __init__(self, directory: Path, children: ChildRunner, environment: Callable[[], Mapping[str, str]]) -> None:
        self.directory = directory
        self._children = children
        self._environment = environment
        self._lock = threading.Lock()

    def built(self) -> bool:
        return (self.directory / COMPLETE_MARKER).exists()

    def ensure(self) -> Path:
        """The model's directory, once a complete model is there; RuntimeError naming the reason otherwise."""
        if self.built():
            return self.directory
        with self._lock:  # one build at a time; the others wait for it, then find it built
            if self.built():
                return self.directory
            completed = self._children.run(
                [sys.executable, "-m", "rlctl.trainer.tiny_model", str(self.directory)],
                env=self._environment(),
                cwd=REPO_ROOT,
                timeout_s=BUILD_TIMEOUT_S,
            )
            if completed.returncode != 0 and self._children.closed:
                raise ChildProcessError("the service stopped while the tiny model was being built")
            if completed.returncode != 0 or not self.built():
                tail = " | ".join(completed.stderr.decode("utf-8", errors="replace").strip().splitlines()[-5:])
                raise RuntimeError(f"building the tiny model in {self.directory} failed: {tail or 'no output'}")
        return self.directory
