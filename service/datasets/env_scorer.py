"""An environment's own scorer as a reward function, run in a child process (the API process never imports
environment code: docs/ENVIRONMENTS.md#scorers).

An environment file offers a scorer when it defines a top-level `score_completion(completion, gold)`; it may also
define `gold_answer(solution)` (e.g. GSM8K's "#### N") and `normalize_number(text)` to turn a record's expected
answer into the form `score_completion` compares with. The child (`python -m service.datasets.scorer_child FILE`)
answers one JSON line per record; it runs with the secrets removed from its environment.
"""

from __future__ import annotations

import ast
import json
import queue
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

from service.context import AppContext
from service.environments.catalog import child_process_environment
from service.errors import NotFound
from service.pysource import parse_module
from service.settings import REPO_ROOT, SECRET_ENV_NAMES
from trajectories.records import TrajectoryRecord

SCORER_FUNCTION = "score_completion"
RECORD_TIMEOUT_S = 30.0


class ScorerFailed(RuntimeError):
    """The child could not start, answered an error, or did not answer in time."""


def scorer_environments(ctx: AppContext) -> list[str]:
    environments, _ = ctx.catalog.discover()
    return sorted(env.name for env in environments if defines_scorer(env.file_path))


def has_scorer(ctx: AppContext, name: str) -> bool:
    try:
        return defines_scorer(ctx.catalog.get(name).file_path)
    except NotFound:
        return False


def defines_scorer(path: Path) -> bool:
    """Read without importing: does the file define a top-level score_completion function?"""
    try:
        tree = parse_module(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return False
    return any(isinstance(node, ast.FunctionDef) and node.name == SCORER_FUNCTION for node in tree.body)


class ChildScorer:
    """`EnvironmentScorer` (trajectories/rewards.py) backed by a child process; close it when done."""

    def __init__(self, file_path: Path, answer_field: str, start_timeout_s: float) -> None:
        self.answer_field = answer_field
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the child
        self._process = subprocess.Popen(
            [sys.executable, "-m", "service.datasets.scorer_child", str(file_path)],
            cwd=REPO_ROOT,
            env=child_process_environment(set(SECRET_ENV_NAMES)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            encoding="utf-8",
            start_new_session=True,
        )
        self._answers: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_answers, name="scorer-reader", daemon=True).start()
        ready = self._next_answer(start_timeout_s)
        if not ready.get("ready"):
            self.close()
            raise ScorerFailed(f"the scorer of {file_path.stem} could not start: {ready.get('error')}")

    def score(self, record: TrajectoryRecord) -> float:
        completion = next((turn.value for turn in reversed(record.turns) if turn.role == "gpt"), "")
        answer = record.metadata.get(self.answer_field)
        if answer is None:
            return 0.0
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(json.dumps({"completion": completion, "answer": answer}) + "\n")
            self._process.stdin.flush()
        except OSError as error:
            raise ScorerFailed(f"the scorer process is gone: {self._stderr_tail()}") from error
        answer_line = self._next_answer(RECORD_TIMEOUT_S)
        if "score" not in answer_line:
            raise ScorerFailed(f"the scorer failed on a record: {answer_line.get('error')}")
        return float(answer_line["score"])

    def close(self) -> None:
        if self._process.poll() is None:
            try:
                if self._process.stdin:
                    self._process.stdin.close()
                self._process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait(timeout=5)
        self._stderr.close()

    def _read_answers(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._answers.put(line)
        self._answers.put(None)

    def _next_answer(self, timeout_s: float) -> dict[str, Any]:
        try:
            line = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            raise ScorerFailed(f"the scorer did not answer within {timeout_s:g} s") from None
        if line is None:
            raise ScorerFailed(f"the scorer process exited: {self._stderr_tail()}")
        try:
            return json.loads(line)
        except ValueError:
            return {"error": f"unreadable answer {line[:200]!r}"}

    def _stderr_tail(self) -> str:
        try:
            self._stderr.seek(0)
            lines = self._stderr.read().decode("utf-8", errors="replace").strip().splitlines()
        except (OSError, ValueError):
            return "no output"
        return " | ".join(lines[-5:]) or "no output"
