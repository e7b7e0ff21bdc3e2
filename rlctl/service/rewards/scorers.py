"""An environment's own scorer as a reward function, run in a child process (the API process never imports
environment code: docs/ENVIRONMENTS.md#scorers).

An environment file offers a scorer when it defines a top-level `score_completion(completion, gold)`; it may also
define `gold_answer(solution)` (e.g. GSM8K's "#### N") and `normalize_number(text)` to turn a record's expected
answer into the form `score_completion` compares with. The child (`python -m rlctl.service.rewards.scorer_child FILE`)
answers one JSON line per record; it runs with the secrets removed from its environment.
"""

from __future__ import annotations

import ast
import contextlib
import json
import queue
import sys
import threading
from pathlib import Path
from typing import Any

from rlctl.service.children import ChildRunner
from rlctl.service.context import AppContext
from rlctl.service.environments.catalog import EnvironmentCatalog, child_process_environment
from rlctl.service.errors import NotFound
from rlctl.service.jobs.runner import JobFailed
from rlctl.service.pysource import parse_module
from rlctl.service.settings import REPO_ROOT, SECRET_ENV_NAMES
from rlctl.trajectories.records import TrajectoryRecord

SCORER_FUNCTION = "score_completion"
RECORD_TIMEOUT_S = 30.0


class ScorerFailed(RuntimeError):
    """The child could not start, answered an error, or did not answer in time."""


def environment_scorers(ctx: AppContext, spec: list[dict[str, Any]], answer_field: str) -> dict[str, ChildScorer]:
    """A started scorer for each reward of `spec` that names an environment with one; a job fails when one cannot
    start. The caller closes them."""
    scorers: dict[str, ChildScorer] = {}
    try:
        for entry in spec:
            name = entry["name"]
            if has_scorer(ctx, name):
                path = EnvironmentCatalog.of(ctx).get(name).file_path
                scorers[name] = ChildScorer(ctx.children, path, answer_field, ctx.settings.schema_timeout_s)
    except ScorerFailed as error:
        for scorer in scorers.values():
            scorer.close()
        raise JobFailed(str(error)) from None
    return scorers


def scorer_environments(ctx: AppContext) -> list[str]:
    environments, _ = EnvironmentCatalog.of(ctx).discover()
    return sorted(env.name for env in environments if defines_scorer(env.file_path))


def has_scorer(ctx: AppContext, name: str) -> bool:
    try:
        return defines_scorer(EnvironmentCatalog.of(ctx).get(name).file_path)
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
    """`EnvironmentScorer` (rlctl/trajectories/rewards.py) backed by a child process; close it when done."""

    def __init__(self, children: ChildRunner, file_path: Path, answer_field: str, start_timeout_s: float) -> None:
        self.answer_field = answer_field
        try:  # forked from the fork server where it can: the environment's imports are mostly done there
            self._child = children.open(
                [sys.executable, "-m", "rlctl.service.rewards.scorer_child", str(file_path)],
                env=child_process_environment(set(SECRET_ENV_NAMES)),
                cwd=REPO_ROOT,
            )
        except (ChildProcessError, OSError) as error:
            raise ScorerFailed(f"the scorer of {file_path.stem} could not start: {error}") from None
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
        try:
            self._child.stdin.write(json.dumps({"completion": completion, "answer": answer}) + "\n")
            self._child.stdin.flush()
        except OSError as error:
            raise ScorerFailed(f"the scorer process is gone: {self._stderr_tail()}") from error
        answer_line = self._next_answer(RECORD_TIMEOUT_S)
        if "score" not in answer_line:
            raise ScorerFailed(f"the scorer failed on a record: {answer_line.get('error')}")
        return float(answer_line["score"])

    def close(self) -> None:
        self._child.close(grace_s=5.0)

    def _read_answers(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # ValueError: closed under us by close()
            for line in self._child.stdout:
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
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):  # the child writes objects only: anything else is not its answer
            return {"error": f"unreadable answer {line[:200]!r}"}
        return answer

    def _stderr_tail(self) -> str:
        try:
            self._child.stderr.seek(0)
            lines = self._child.stderr.read().decode("utf-8", errors="replace").strip().splitlines()
        except (OSError, ValueError):
            return "no output"
        return " | ".join(lines[-5:]) or "no output"
