"""A tool environment's run scored by the service's judge (docs/TOOL_ENVIRONMENTS.md#judge): the managed `judge`
written in its config when the run sets `judge_rubric`, after the checks that refuse it."""

from __future__ import annotations

from typing import Any

from rlctl.service.context import AppContext
from rlctl.service.environments.service import RunConfigPlan
from rlctl.service.errors import ValidationFailed
from rlctl.service.rewards.errors import JudgeNotConfigured
from rlctl.service.rewards.judge import judge_endpoint, judge_options
from rlctl.service.settings import BUILTIN_ENVIRONMENTS_DIR


def managed_judge(ctx: AppContext, plan: RunConfigPlan) -> dict[str, Any]:
    """`{"judge": ...}` (the service's judge: URL, model, retries; never its key) for a run of an environment with
    the `judge` and `judge_rubric` fields (a ToolEnv) whose rubric is set, else nothing. Refused without a judge
    endpoint, and for an environment not shipped with rlctl: its process holds the judge's key, and only shipped
    code is trusted with it (as with an online dataset run's scorers)."""
    names = {field.name for field in plan.schema.fields}
    if not ({"judge", "judge_rubric"} <= names and plan.values().get("judge_rubric")):
        return {}
    if judge_endpoint(ctx.settings) is None:
        raise JudgeNotConfigured(
            "judge_rubric needs a judge endpoint: set RLCTL_JUDGE_BASE_URL (or OPENROUTER_API_KEY)",
            {"field": "judge_rubric"},
        )
    if not plan.environment.file_path.resolve().is_relative_to(BUILTIN_ENVIRONMENTS_DIR):
        raise ValidationFailed(
            f"the judge cannot score {plan.environment.name!r}: a judged environment's process holds the judge's "
            "key, and only the environments shipped with rlctl are trusted with it",
            {"field": "judge_rubric", "reason": "judge_beside_written_environment"},
        )
    return {"judge": judge_options(ctx.settings)}
