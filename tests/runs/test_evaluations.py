"""The evaluation's statistics (the proof that a trained checkpoint beats its base is tests/runs/test_collected_loop.py:
docs/EVALUATIONS.md#the-proof-in-the-test-suite)."""

from __future__ import annotations

from rlctl.service.evaluations.stats import compare, prompt_means


def test_bootstrap_comparison_is_paired_by_prompt() -> None:
    base = prompt_means({0: [0.0, 0.2], 1: [0.5], 2: [0.1, 0.1]})
    better = prompt_means({0: [0.6, 0.6], 1: [0.9], 2: [0.4, 0.2], 3: [1.0]})  # prompt 3: base never answered
    found = compare(base, better, seed=1)
    assert round(found.mean_difference, 6) == round((0.5 + 0.4 + 0.2) / 3, 6)
    assert 0 < found.interval[0] <= found.mean_difference <= found.interval[1]
    assert (found.wins, found.ties, found.losses, found.win_rate) == (3, 0, 0, 1.0)
    same = compare(base, base)
    assert (same.mean_difference, same.interval, same.win_rate) == (0.0, (0.0, 0.0), 0.5)
