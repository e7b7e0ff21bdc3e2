"""The judge of the group rewards (dataset scoring, evaluations, an online dataset run): where it is (settings) and
its cache by content in the database. The client, the cache logic and the group decision are `rlctl/judging/`'s, shared
with the online dataset environment."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import IntegrityError

from rlctl.judging.client import CachedJudge, JudgeClient
from rlctl.service.db.engine import Database
from rlctl.service.db.models import JudgeCacheEntry
from rlctl.service.settings import Settings
from rlctl.trajectories.judge import JudgeVerdict


def judge_endpoint(settings: Settings) -> tuple[str, str] | None:
    """(base URL, key) of the configured judge, or None. `RLCTL_JUDGE_BASE_URL` gets `RLCTL_JUDGE_API_KEY` (or
    the placeholder `no-key`); only without one does the judge default to OpenRouter, with OPENROUTER_API_KEY:
    each key goes to its own host and nowhere else."""
    if settings.judge_base_url:
        key = settings.judge_api_key
        return settings.judge_base_url, key.get_secret_value() if key else "no-key"
    if settings.openrouter_api_key:
        return settings.openrouter_base_url, settings.openrouter_api_key.get_secret_value()
    return None


def judge_options(settings: Settings, model: str | None = None, rubric: str | None = None) -> dict[str, Any]:
    """What a run's environment process needs to ask the configured judge (written in its config): never the key,
    which reaches that process in its environment only (rlctl/service/runs/launch.py) and is written nowhere."""
    endpoint = judge_endpoint(settings)
    assert endpoint is not None  # checked before the run is recorded
    return {
        "base_url": endpoint[0],
        "model": model or settings.judge_model,
        "rubric": rubric,
        "max_retries": settings.judge_max_retries,
        "timeout_s": settings.judge_timeout_s,
    }


class DatabaseVerdictCache:
    """The judge's verdicts in the `judge_cache` table, so a dataset scored again asks nothing it asked before."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def get(self, key: str) -> list[JudgeVerdict] | None:
        with self._db.read() as session:
            entry = session.get(JudgeCacheEntry, key)
            if entry is None:
                return None
            return [JudgeVerdict(float(v["score"]), str(v["reason"])) for v in entry.verdicts]

    def put(self, key: str, model: str, verdicts: list[JudgeVerdict]) -> None:
        try:
            with self._db.session() as session:
                session.add(JudgeCacheEntry(key=key, model=model, verdicts=[v.as_dict() for v in verdicts]))
        except IntegrityError:
            pass  # another thread judged the same group at the same time: its verdicts are kept


def make_judge(settings: Settings, database: Database, model: str, scrub: Callable[[str], str]) -> CachedJudge | None:
    endpoint = judge_endpoint(settings)
    if endpoint is None:
        return None
    base_url, key = endpoint
    client = JudgeClient(
        base_url, key, model, scrub, max_retries=settings.judge_max_retries, timeout_s=settings.judge_timeout_s
    )
    return CachedJudge(client, DatabaseVerdictCache(database))
