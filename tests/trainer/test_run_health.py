"""Run health (rlctl/trainer/health.py): the best checkpoint by the run's metric, and collapse detection."""

from __future__ import annotations

import pytest

from rlctl.trainer.health import (
    COMPLETION_METRIC,
    EMPTY_COMPLETIONS,
    REWARD_DROP,
    HealthRules,
    RunHealth,
    best_checkpoint,
)

RULES = HealthRules(metric="reward/mean", collapse_drop=0.5, collapse_steps=3)


def feed(health: RunHealth, rewards: list[float], completion_tokens: float = 4.0, start: int = 1) -> list:
    found = []
    for offset, reward in enumerate(rewards):
        step = start + offset
        collapse = health.observe(step, {"reward/mean": reward, COMPLETION_METRIC: completion_tokens})
        if collapse is not None:
            found.append(collapse)
    return found


def test_a_held_drop_is_a_collapse_flagged_once_with_the_step_where_it_began() -> None:
    health = RunHealth(RULES)
    # climbs to 0.77, holds, then falls to 0.0 from step 8 (as the echo run that collapsed did)
    found = feed(health, [0.2, 0.5, 0.77, 0.77, 0.78, 0.76, 0.77, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert len(found) == 1
    collapse = found[0]
    assert collapse.reason == REWARD_DROP and collapse.step == 8 and collapse.detected_at == 10
    assert collapse.best == pytest.approx((0.77 + 0.77 + 0.78) / 3)  # the best mean of 3 steps in a row
    assert collapse.value == 0.0
    assert "since step 8" in collapse.describe()
    assert health.collapse == collapse


def test_noise_and_a_short_dip_are_not_a_collapse() -> None:
    health = RunHealth(RULES)
    assert feed(health, [0.6, 0.7, 0.65, 0.2, 0.1, 0.7, 0.68, 0.3, 0.72, 0.66]) == []
    assert health.collapse is None


def test_empty_completions_are_a_collapse_even_when_the_reward_holds() -> None:
    health = RunHealth(RULES)
    feed(health, [0.5, 0.5, 0.5])
    found = feed(health, [0.5, 0.5, 0.5], completion_tokens=1.0, start=4)
    assert [(c.reason, c.step, c.detected_at) for c in found] == [(EMPTY_COMPLETIONS, 4, 6)]


def test_the_state_survives_a_resume() -> None:
    health = RunHealth(RULES)
    feed(health, [0.8, 0.8, 0.8, 0.0])
    resumed = RunHealth(RULES, health.snapshot())
    found = feed(resumed, [0.0, 0.0], start=5)
    assert [(c.step, c.detected_at) for c in found] == [(4, 6)]


def test_checkpoints_are_ranked_by_the_metric_since_the_one_before() -> None:
    health = RunHealth(RULES)
    feed(health, [0.2, 0.4])
    first = health.checkpoint_value()
    feed(health, [0.8, 0.9], start=3)
    second = health.checkpoint_value()
    feed(health, [0.1, 0.0], start=5)
    third = health.checkpoint_value()
    assert (first, second, third) == (pytest.approx(0.3), pytest.approx(0.85), pytest.approx(0.05))
    checkpoints = [
        {"step": 2, "path": "a", "weights": "a", "value": first},
        {"step": 4, "path": "b", "weights": "b", "value": second},
        {"step": 6, "path": "c", "weights": "c", "value": third},
    ]
    assert best_checkpoint(checkpoints)["step"] == 4
    assert best_checkpoint([{"step": 1, "path": "x", "weights": "x"}]) is None  # checkpoints of an older trainer
