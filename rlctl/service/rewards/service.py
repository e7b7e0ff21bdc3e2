"""Reward operations that dataset scoring, online dataset runs and evaluations share: the check of a request's
rewards before anything is submitted, and the per-record rewards a scoring pass builds from them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlctl.service.context import AppContext
from rlctl.service.errors import ValidationFailed
from rlctl.service.rewards.errors import UnknownReward
from rlctl.service.rewards.schemas import RewardSpec
from rlctl.service.rewards.scorers import has_scorer, scorer_environments
from rlctl.trajectories.judge import GROUP_REWARDS
from rlctl.trajectories.rewards import (
    BUILTIN_REWARDS,
    CorrectnessReward,
    EnvironmentScorer,
    WeightedReward,
    build_rewards,
)


def check_rewards(ctx: AppContext, rewards: list[RewardSpec]) -> None:
    """Each reward once, and each one known: built in, a group reward (judge, completion: every caller scores
    whole groups, a dataset's, an online run's or an evaluation's), or an environment that offers a scorer."""
    names = [reward.name for reward in rewards]  # a rule over the items, which a JSON schema cannot state
    if len(set(names)) != len(names):
        raise ValidationFailed("each reward function may appear once", {"rewards": names})
    known = [*BUILTIN_REWARDS, *GROUP_REWARDS]
    for reward in rewards:
        if reward.name not in known and not has_scorer(ctx, reward.name):
            raise UnknownReward(
                f"unknown reward function {reward.name!r}",
                {"name": reward.name, "available": [*known, *scorer_environments(ctx)]},
            )


def plain_rewards(
    spec: list[dict[str, Any]], scorers: Mapping[str, EnvironmentScorer], answer_field: str
) -> dict[str, WeightedReward]:
    """The rewards of `spec` that score one record alone (no group reward), by name; correctness reads the
    expected answer from `answer_field`."""
    return {reward.function.name: _with_answer_field(reward, answer_field) for reward in build_rewards(spec, scorers)}


def _with_answer_field(reward: WeightedReward, answer_field: str) -> WeightedReward:
    if isinstance(reward.function, CorrectnessReward):
        return WeightedReward(CorrectnessReward(answer_key=answer_field), reward.weight)
    return reward
