"""The comparison of an evaluation (docs/EVALUATIONS.md#the-comparison): per-prompt mean rewards of each model,
the mean difference to the base with a paired bootstrap interval over prompts, and the win rate. Pure: no I/O."""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Comparison:
    mean_difference: float
    interval: tuple[float, float]
    win_rate: float  # share of prompts where the model's mean reward beats the base's (ties count half)
    wins: int
    ties: int
    losses: int


def prompt_means(rewards: Mapping[int, Sequence[float]]) -> dict[int, float]:
    """Prompt index → mean reward of its samples (prompts without samples are left out)."""
    return {index: statistics.fmean(values) for index, values in rewards.items() if values}


def compare(base: Mapping[int, float], model: Mapping[int, float], seed: int = 0) -> Comparison:
    """Paired over the prompts both models answered: the difference of means, its percentile bootstrap interval
    (prompts resampled with replacement, `BOOTSTRAP_RESAMPLES` times, seeded), and wins, ties and losses."""
    prompts = sorted(set(base) & set(model))
    if not prompts:
        raise ValueError("no prompt was answered by both models")
    differences = [model[p] - base[p] for p in prompts]
    generator = random.Random(seed)
    means = sorted(
        statistics.fmean(generator.choices(differences, k=len(differences))) for _ in range(BOOTSTRAP_RESAMPLES)
    )
    tail = (1 - CONFIDENCE) / 2
    low = means[int(tail * BOOTSTRAP_RESAMPLES)]
    high = means[min(BOOTSTRAP_RESAMPLES - 1, int((1 - tail) * BOOTSTRAP_RESAMPLES))]
    wins = sum(d > 0 for d in differences)
    ties = sum(d == 0 for d in differences)
    return Comparison(
        mean_difference=statistics.fmean(differences),
        interval=(low, high),
        win_rate=(wins + ties / 2) / len(differences),
        wins=wins,
        ties=ties,
        losses=len(differences) - wins - ties,
    )
