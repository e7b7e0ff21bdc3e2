"""A streaming distribution summary (min / mean / percentiles / max) in bounded memory.

Values are kept exactly up to ``exact_limit``; past that they move into logarithmic buckets whose percentile
estimates are within ``relative_accuracy`` of a true value (the DDSketch idea), so a dataset of any size costs
at most a few thousand counters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class DistributionSummary:
    relative_accuracy: float = 0.01
    exact_limit: int = 10_000
    count: int = 0
    total: float = 0.0
    minimum: float | None = None
    maximum: float | None = None
    _exact: list[float] | None = field(default_factory=list)
    _buckets: dict[int, int] = field(default_factory=dict)
    _zeros: int = 0

    @property
    def _gamma(self) -> float:
        return (1 + self.relative_accuracy) / (1 - self.relative_accuracy)

    def add(self, value: float) -> None:
        if value < 0:
            raise ValueError("only non-negative values are summarised")
        self.count += 1
        self.total += value
        self.minimum = value if self.minimum is None else min(self.minimum, value)
        self.maximum = value if self.maximum is None else max(self.maximum, value)
        if self._exact is not None:
            self._exact.append(value)
            if len(self._exact) > self.exact_limit:
                self._move_to_buckets()
        else:
            self._bucket(value)

    def merge(self, other: DistributionSummary) -> None:
        """Adds another summary's values (e.g. from a parallel worker)."""
        if other._exact is not None:
            for value in other._exact:
                self.add(value)
            return
        if self._exact is not None:
            self._move_to_buckets()
        self.count += other.count
        self.total += other.total
        for bound in (other.minimum, other.maximum):
            if bound is not None:
                self.minimum = bound if self.minimum is None else min(self.minimum, bound)
                self.maximum = bound if self.maximum is None else max(self.maximum, bound)
        self._zeros += other._zeros
        for index, hits in other._buckets.items():
            self._buckets[index] = self._buckets.get(index, 0) + hits

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def percentile(self, percent: float) -> float | None:
        """The value at ``percent`` (0–100): linear interpolation while exact, a bucket estimate after."""
        if not self.count:
            return None
        if self._exact is not None:
            return _interpolated(sorted(self._exact), percent)
        rank = percent / 100 * (self.count - 1)
        seen = self._zeros
        if rank < seen:
            return 0.0
        for index in sorted(self._buckets):
            seen += self._buckets[index]
            if rank < seen:
                estimate = 2 * self._gamma**index / (self._gamma + 1)
                return min(max(estimate, self.minimum or 0.0), self.maximum or 0.0)
        return self.maximum

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "count": self.count,
            "min": self.minimum,
            "mean": self.mean,
            "p50": self.percentile(50),
            "p95": self.percentile(95),
            "max": self.maximum,
        }

    def _move_to_buckets(self) -> None:
        values, self._exact = self._exact or [], None
        for value in values:
            self._bucket(value)

    def _bucket(self, value: float) -> None:
        if value == 0:
            self._zeros += 1
            return
        index = math.ceil(math.log(value, self._gamma))
        self._buckets[index] = self._buckets.get(index, 0) + 1


def _interpolated(ordered: list[float], percent: float) -> float:
    position = percent / 100 * (len(ordered) - 1)
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)
