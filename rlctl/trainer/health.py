"""Run health: the best checkpoint by the run's metric, and collapse detection (docs/TRAINER.md#run-health).

Pure logic, fed one step's metrics at a time; its state is plain data kept in trainer_state.json, so a resumed
trainer goes on where it was.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

COMPLETION_METRIC = "completion/mean_tokens"
# A completion of at most this many tokens on average is empty: nothing but an end-of-sequence token.
EMPTY_COMPLETION_TOKENS = 1.0
REWARD_DROP = "reward_drop"
EMPTY_COMPLETIONS = "empty_completions"


@dataclass(frozen=True)
class HealthRules:
    metric: str = "reward/mean"  # higher is better; a trainer metric (metrics.jsonl)
    collapse_drop: float = 0.5  # a fall below best - drop * |best| ...
    collapse_steps: int = 5  # ... that holds this many steps in a row is a collapse
    stop_on_collapse: bool = False


@dataclass
class Collapse:
    step: int  # the first step of the run of bad steps: where the collapse began
    detected_at: int
    reason: str  # reward_drop | empty_completions
    metric: str
    best: float | None
    value: float | None

    def describe(self) -> str:
        if self.reason == EMPTY_COMPLETIONS:
            return f"completions empty since step {self.step} (detected at step {self.detected_at})"
        return (
            f"{self.metric} collapsed from its best {self.best:.4g} to {self.value:.4g} since step {self.step} "
            f"(detected at step {self.detected_at})"
        )


@dataclass
class HealthState:
    best: float | None = None  # the best mean of `metric` over `collapse_steps` consecutive steps
    recent: list[float] = field(default_factory=list)  # the last `collapse_steps` values, for that mean
    low_since: int | None = None  # first step of the current run of steps below the collapse threshold
    low_steps: int = 0
    empty_since: int | None = None
    empty_steps: int = 0
    window: list[float] = field(default_factory=list)  # values since the last checkpoint
    collapse: dict[str, Any] | None = None


class RunHealth:
    def __init__(self, rules: HealthRules, saved: dict[str, Any] | None = None) -> None:
        self.rules = rules
        known = set(HealthState.__dataclass_fields__)
        self.state = HealthState(**{k: v for k, v in (saved or {}).items() if k in known})

    def snapshot(self) -> dict[str, Any]:
        return asdict(self.state)

    @property
    def collapse(self) -> Collapse | None:
        return Collapse(**self.state.collapse) if self.state.collapse else None

    def observe(self, step: int, metrics: dict[str, float]) -> Collapse | None:
        """Take one step's metrics; the collapse when this step is the one that shows it, else None."""
        value = metrics.get(self.rules.metric)
        if value is not None:
            self._track(step, float(value))
        completion = metrics.get(COMPLETION_METRIC)
        if completion is not None:
            self._track_empty(step, float(completion))
        if self.state.collapse is not None:
            return None  # flagged once, with the step where it began
        found = self._detect(step, value)
        if found is not None:
            self.state.collapse = asdict(found)
        return found

    def checkpoint_value(self) -> float | None:
        """The metric's mean over the steps since the last checkpoint: the value a checkpoint is ranked by."""
        window = self.state.window
        self.state.window = []
        return sum(window) / len(window) if window else None

    def _track(self, step: int, value: float) -> None:
        state, steps = self.state, self.rules.collapse_steps
        state.window.append(value)
        recent = deque(state.recent, maxlen=steps)
        recent.append(value)
        state.recent = list(recent)
        if len(recent) == steps:
            mean = sum(recent) / steps
            state.best = mean if state.best is None else max(state.best, mean)
        if state.best is not None and value < state.best - self.rules.collapse_drop * abs(state.best):
            state.low_since = state.low_since if state.low_since is not None else step
            state.low_steps += 1
        else:
            state.low_since, state.low_steps = None, 0

    def _track_empty(self, step: int, completion_tokens: float) -> None:
        state = self.state
        if completion_tokens <= EMPTY_COMPLETION_TOKENS:
            state.empty_since = state.empty_since if state.empty_since is not None else step
            state.empty_steps += 1
        else:
            state.empty_since, state.empty_steps = None, 0

    def _detect(self, step: int, value: float | None) -> Collapse | None:
        state, steps, metric = self.state, self.rules.collapse_steps, self.rules.metric
        if state.empty_steps >= steps and state.empty_since is not None:
            return Collapse(state.empty_since, step, EMPTY_COMPLETIONS, metric, state.best, value)
        if state.low_steps >= steps and state.low_since is not None and state.best not in (None, 0.0):
            return Collapse(state.low_since, step, REWARD_DROP, metric, state.best, value)
        return None


def best_checkpoint(checkpoints: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The checkpoint with the highest value (ties: the earlier one); None when none has a value."""
    ranked = [entry for entry in checkpoints if isinstance(entry.get("value"), int | float)]
    if not ranked:
        return None
    return max(ranked, key=lambda entry: (entry["value"], -entry["step"]))
