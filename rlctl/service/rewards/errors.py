"""Errors of rewards (stable codes; one error body, see rlctl/service/errors.py)."""

from __future__ import annotations

from rlctl.service.errors import Conflict, NotFound


class UnknownReward(NotFound):
    code = "REWARD_NOT_FOUND"


class JudgeNotConfigured(Conflict):
    """The `judge` reward was asked for, but the server has no judge endpoint configured."""

    code = "JUDGE_NOT_CONFIGURED"
