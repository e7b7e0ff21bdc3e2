"""Failure budgets: a run whose sampling or training calls keep failing ends with a typed reason, promptly,
instead of waiting for the stall detector (docs/TRAINER.md#failure-budgets).

Pure logic: a budget counts consecutive failures of one kind of call; any success refills it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

SAMPLING_FAILED = "sampling_failed"
TRAINING_FAILED = "training_failed"
COLLAPSED = "collapsed"  # stop_on_collapse ended the run (rlctl/trainer/health.py)
UNSUPPORTED_BATCH = "unsupported_batch"  # a group carries a field the trainer cannot honour (rlctl/trainer/grpo.py)


class TrainingHalted(RuntimeError):
    """The trainer ends the run for a reason of its own; `kind` is the run's failure kind."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class BudgetExhausted(TrainingHalted):
    """Too many consecutive failures of one kind of call."""


@dataclass(frozen=True)
class BudgetState:
    consecutive: int
    total: int
    last_error: str | None


class FailureBudget:
    """`limit` consecutive failures exhaust it; thread-safe (the inference server samples on many threads)."""

    def __init__(self, kind: str, limit: int, what: str) -> None:
        if limit < 1:
            raise ValueError(f"a failure budget needs a limit of at least 1, got {limit}")
        self.kind = kind
        self.limit = limit
        self.what = what  # "sampling calls", "training steps": for the message
        self._lock = threading.Lock()
        self._consecutive = 0
        self._total = 0
        self._last_error: str | None = None

    def success(self) -> None:
        with self._lock:
            self._consecutive = 0

    def failure(self, error: BaseException | str) -> None:
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        with self._lock:
            self._consecutive += 1
            self._total += 1
            self._last_error = text

    def state(self) -> BudgetState:
        with self._lock:
            return BudgetState(self._consecutive, self._total, self._last_error)

    def check(self) -> None:
        """Raise BudgetExhausted once `limit` consecutive failures have happened."""
        state = self.state()
        if state.consecutive >= self.limit:
            raise BudgetExhausted(
                self.kind,
                f"{state.consecutive} consecutive {self.what} failed (budget {self.limit}); "
                f"the last error: {state.last_error}",
            )
