"""What an inference test reports: per-model results and the summary. Pure logic, no I/O.

A completion is correct when its score is above 0 (docs/INFERENCE_TESTS.md#result). Latency is per completion: each gets
the duration of the HTTP request that returned it (one request may return all `n` of a group).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlctl.service.inference_tests.schemas import InferenceTestSummary, Latency, ModelResult, StepResult


@dataclass
class ModelOutcome:
    """What one model's run produced: its step records (as the child wrote them) and why it stopped, if early."""

    model: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    wall_time_s: float = 0.0
    files: dict[str, str] = field(default_factory=dict)


_FILE_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:")
MAX_STEM_CHARS = 200  # file names have 255 bytes at most, and the stem gets a suffix


def result_file_stem(environment: str, model: str) -> str:
    """`test_{env}_{model}` with `/` in the model id written `_` and any other character outside letters, digits
    and `.-:` (an `_` included) percent-encoded, so two model ids never share a file; a long one is cut and
    ends with a hash of the whole id (docs/INFERENCE_TESTS.md#files)."""
    encoded = "".join(
        "_" if char == "/" else char if char in _FILE_SAFE else "".join(f"%{b:02X}" for b in char.encode())
        for char in model
    )
    stem = f"test_{environment}_{encoded}"
    if len(stem) > MAX_STEM_CHARS:
        stem = f"{stem[: MAX_STEM_CHARS - 17]}-{hashlib.sha256(model.encode()).hexdigest()[:16]}"
    return stem


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_summary(latencies: Sequence[float]) -> Latency:
    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 4)

    return Latency(
        p50_s=rounded(percentile(latencies, 50)),
        p95_s=rounded(percentile(latencies, 95)),
        mean_s=rounded(sum(latencies) / len(latencies)) if latencies else None,
        completions_timed=len(latencies),
    )


def step_result(record: dict[str, Any]) -> StepResult:
    """One step as the child wrote it (free-form JSON: its `step`, `scores`, `latencies_s`), summed up."""
    scores = [float(s) for s in record.get("scores", [])]
    return StepResult(
        step=record["step"], completions=len(scores), correct=sum(1 for s in scores if s > 0), scores=scores
    )


def model_result(outcome: ModelOutcome) -> ModelResult:
    steps = [step_result(record) for record in outcome.steps]
    total = sum(s.completions for s in steps)
    correct = sum(s.correct for s in steps)
    with_correct = sum(1 for s in steps if s.correct > 0)
    latencies = [float(x) for record in outcome.steps for x in record.get("latencies_s", [])]
    error = outcome.error
    if error is None and total == 0:
        error = "no completion was scored: the environment produced no group"
    return ModelResult(
        model=outcome.model,
        status="failed" if error else "succeeded",
        steps=steps,
        steps_tested=len(steps),
        total_completions=total,
        correct_completions=correct,
        accuracy=_ratio(correct, total),
        steps_with_correct=with_correct,
        step_success_rate=_ratio(with_correct, len(steps)),
        latency=latency_summary(latencies),
        error=error,
        wall_time_s=round(outcome.wall_time_s, 3),
        files=outcome.files,
    )


def summarize(results: Iterable[ModelResult], steps_requested: int, output_directory: str) -> InferenceTestSummary:
    """The verdict: the environment works when at least one model's completions were all produced and scored."""
    results = list(results)
    succeeded = [r for r in results if r.status == "succeeded"]
    best = max(succeeded, key=lambda r: r.accuracy, default=None)  # the first of equals, in request order
    return InferenceTestSummary(
        steps_requested=steps_requested,
        models_tested=len(results),
        models_succeeded=len(succeeded),
        best_model=best.model if best else None,
        avg_accuracy=round(sum(r.accuracy for r in succeeded) / len(succeeded), 4) if succeeded else None,
        environment_working=bool(succeeded),
        output_directory=output_directory,
    )


def progress_done(steps_done: dict[str, int], ended: set[str], steps_requested: int) -> int:
    """Steps accounted for: those completed, plus the rest of every model that has ended (early or not)."""
    return sum(steps_requested if model in ended else min(done, steps_requested) for model, done in steps_done.items())


def _ratio(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0
