"""Runs that train on a trajectory dataset (docs/RUNS.md#training-on-a-dataset): the checks made before a run is
recorded, and the files its environment reads, written into the run directory so that the run never depends on
the dataset's files again (the dataset may be deleted while it trains).

```
runs/{id}/dataset/train.jsonl     offline: GRPO groups (export lines) to train on; online: prompts to sample
runs/{id}/dataset/held_out.jsonl  prompts (and, offline, their groups) kept out of training, for evaluation
runs/{id}/dataset/split.json      counts and the reasons records were left out
```
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.service.context import AppContext
from rlctl.service.datasets.errors import DatasetNotFound
from rlctl.service.datasets.service import dataset_store
from rlctl.service.db.models import Dataset
from rlctl.service.db.rows import load_row
from rlctl.service.environments.catalog import EnvironmentCatalog
from rlctl.service.environments.schemas import DATASET_OFFLINE, DATASET_ONLINE
from rlctl.service.errors import FieldLocked, ValidationFailed
from rlctl.service.rewards.errors import JudgeNotConfigured
from rlctl.service.rewards.grouping import record_at, sorted_group_keys
from rlctl.service.rewards.judge import judge_endpoint, judge_options
from rlctl.service.rewards.schemas import RewardSpec
from rlctl.service.rewards.service import check_rewards
from rlctl.service.runs.schemas import DatasetMode, DatasetSource
from rlctl.service.settings import BUILTIN_ENVIRONMENTS_DIR, Backend
from rlctl.trajectories.grpo import GroupIssue, GrpoExportStats, GrpoGroup, grpo_groups
from rlctl.trajectories.judge import GROUP_REWARDS
from rlctl.trajectories.records import TrajectoryRecord, record_from_dict
from rlctl.trajectories.rewards import BUILTIN_REWARDS
from rlctl.trajectories.training import has_assistant_turn, prompt_messages

# The shipped environment of each mode (environments/dataset_*.py).
DATASET_ENVIRONMENTS = {
    DatasetMode.OFFLINE: DATASET_OFFLINE,
    DatasetMode.ONLINE: DATASET_ONLINE,
    DatasetMode.SFT: DATASET_OFFLINE,  # the stored completions, trained supervised (docs/RUNS.md#supervised-warm-up)
}
STORED = (DatasetMode.OFFLINE, DatasetMode.SFT)  # the modes that train on the stored completions
SFT_TRAINER = {"loss_fn": "cross_entropy", "advantage_normalization": "none"}  # an sft run's, over any edit
TRAIN, HELD_OUT = "train", "held_out"
SPLITS = (TRAIN, HELD_OUT)


class DatasetNotTrainable(ValidationFailed):
    """The dataset cannot train a run in the asked mode; `details.reason` says why."""

    code = "DATASET_NOT_TRAINABLE"


@dataclass
class DatasetPlan:
    """What was written for a run and what the run's configuration derives from it."""

    dataset_id: str
    mode: DatasetMode
    counts: dict[str, int] = field(default_factory=dict)
    issues: dict[str, int] = field(default_factory=dict)
    total_steps: int | None = None  # offline: the steps the epochs take

    def as_dict(self) -> dict[str, Any]:
        return {
            "dataset_id": self.dataset_id,
            "mode": self.mode.value,
            "counts": self.counts,
            "issues": self.issues,
            "total_steps": self.total_steps,
        }


def dataset_dir(run_dir: Path) -> Path:
    return run_dir / "dataset"


def split_path(run_dir: Path, split: str) -> Path:
    return dataset_dir(run_dir) / f"{split}.jsonl"


def held_out_keys(keys: list[str], share: float, seed: int) -> set[str]:
    """round(share × prompts) prompts, chosen by a seeded hash of their key: the same dataset, share and seed
    always hold out the same prompts, and at least one when the share is above zero and two prompts exist."""
    if share <= 0 or len(keys) < 2:
        return set()
    count = min(len(keys) - 1, max(1, round(share * len(keys))))
    ranked = sorted(keys, key=lambda key: hashlib.sha256(f"{seed}:{key}".encode()).hexdigest())
    return set(ranked[:count])


def prepare(ctx: AppContext, source: DatasetSource, env_values: dict[str, Any], run_dir: Path) -> DatasetPlan:
    """Check the dataset and write the run's split; raise before anything is recorded when it cannot train."""
    with ctx.db.session() as session:
        stats = load_row(session, Dataset, source.id, DatasetNotFound).stats or {}
    if source.mode == DatasetMode.ONLINE:
        if not source.rewards:
            raise ValidationFailed(
                "an online dataset run scores the policy's completions: name its rewards",
                {"field": "dataset.rewards"},
            )
        check_rewards(ctx, source.rewards)
        check_online_judge(ctx, source)
    if source.mode in STORED and not (stats.get("rewards") or {}).get("count"):
        raise DatasetNotTrainable(
            f"dataset {source.id} is not scored: score it first (POST /datasets/{source.id}/score)",
            {"dataset_id": source.id, "reason": "not_scored"},
        )
    target = dataset_dir(run_dir)
    target.mkdir(parents=True, exist_ok=True)
    if source.mode in STORED:
        plan = _write_offline(ctx, source, env_values, target)
    else:
        plan = _write_online(ctx, source, env_values, target)
    split_file(run_dir).write_text(json.dumps(plan.as_dict(), indent=2))
    return plan


def check_sft(source: DatasetSource, backend: Backend, edits: dict[str, Any]) -> None:
    """An sft run's loss is the local backend's cross-entropy, and it chooses its loss and advantages itself
    (docs/RUNS.md#supervised-warm-up)."""
    if source.mode != DatasetMode.SFT:
        return
    for name in SFT_TRAINER:
        if name in edits:
            raise FieldLocked(
                f"{name} is set by an sft run ({SFT_TRAINER[name]})",
                {"field": name, "locked_value": SFT_TRAINER[name]},
            )
    if backend != Backend.LOCAL:
        raise ValidationFailed(
            f"an sft run trains with the local backend only: the {backend.value} backend has no cross_entropy loss "
            "in rlctl; start it with backend 'local'",
            {"field": "backend", "value": backend.value, "allowed": [Backend.LOCAL.value]},
        )


def uses_judge(source: DatasetSource) -> bool:
    """An online run whose rewards need the judge: `judge`, or `completion` (a fresh completion carries no
    outcome of its source, so the judge decides it)."""
    return source.mode == DatasetMode.ONLINE and any(r.name in GROUP_REWARDS for r in source.rewards)


def check_online_judge(ctx: AppContext, source: DatasetSource) -> None:
    """The judge is configured, its options are asked for only with a reward that uses it, and no written
    environment's code runs beside its key (the environment process imports each scorer's file)."""
    if not uses_judge(source):
        if source.judge is not None:
            raise ValidationFailed(
                "dataset.judge applies to the judge and completion rewards only", {"field": "dataset.judge"}
            )
        return
    if judge_endpoint(ctx.settings) is None:
        raise JudgeNotConfigured(
            "the judge and completion rewards need a judge endpoint: set RLCTL_JUDGE_BASE_URL (or OPENROUTER_API_KEY)",
            {"rewards": [r.name for r in source.rewards if r.name in GROUP_REWARDS]},
        )
    for reward in source.rewards:
        if reward.name in GROUP_REWARDS or reward.name in BUILTIN_REWARDS:
            continue
        file = EnvironmentCatalog.of(ctx).get(reward.name).file_path.resolve()
        if not file.is_relative_to(BUILTIN_ENVIRONMENTS_DIR):
            raise ValidationFailed(
                f"the judge cannot run beside the scorer of {reward.name!r}: an online run's environment process "
                "holds the judge's key and imports each scorer's file, and only shipped environments are trusted "
                "with it; score with the judge alone, or with built-in rewards and shipped scorers",
                {"field": "dataset.rewards", "reward": reward.name, "reason": "judge_beside_written_scorer"},
            )


def _write_offline(ctx: AppContext, source: DatasetSource, values: dict[str, Any], target: Path) -> DatasetPlan:
    group_size, batch_size = int(values["group_size"]), int(values["batch_size"])
    plan = DatasetPlan(source.id, source.mode)
    stats = GrpoExportStats()
    everything = target / "groups.jsonl"
    keys: list[str] = []
    sizes: dict[str, int] = {}
    with everything.open("w", encoding="utf-8") as out:
        for outcome in _groups(ctx, source):
            stats.add(outcome)
            if isinstance(outcome, GroupIssue):
                continue
            trained = [r for r in outcome.records if has_assistant_turn(r)]
            if len(trained) < len(outcome.records):
                plan.issues["no_assistant_turn"] = plan.issues.get("no_assistant_turn", 0) + 1
                continue
            keys.append(outcome.key)
            sizes[outcome.key] = len(outcome.records)
            out.write(json.dumps(outcome.as_dict(), ensure_ascii=False) + "\n")
    plan.issues.update(stats.as_dict()["issues"])
    if not keys:
        reason = "no_assistant_turn" if plan.issues.get("no_assistant_turn") else "groups_too_small"
        message = {
            "no_assistant_turn": "no record has an assistant turn to train on",
            "groups_too_small": "no prompt has two or more scored records: GRPO compares completions of one prompt",
        }[reason]
        raise DatasetNotTrainable(
            f"dataset {source.id} cannot train offline: {message}",
            {"dataset_id": source.id, "reason": reason, "issues": plan.issues},
        )
    held = held_out_keys(keys, source.held_out, int(values.get("seed") or 0))
    usable = [key for key in keys if key not in held and sizes[key] >= group_size]
    _split(everything, target, held)
    epochs = int(values.get("epochs") or 1)
    plan.total_steps = len(usable) * epochs * group_size // batch_size
    plan.counts = {
        "groups": len(keys),
        "train_groups": len(keys) - len(held),
        "held_out_groups": len(held),
        "trainable_groups": len(usable),
        "smaller_than_group_size": len(keys) - len(held) - len(usable),
    }
    if plan.total_steps < 1:
        raise DatasetNotTrainable(
            f"dataset {source.id} has {len(usable)} training groups of at least group_size ({group_size}) "
            f"records: {epochs} epoch(s) of them do not fill one batch of {batch_size}",
            {"dataset_id": source.id, "reason": "too_few_groups", **plan.counts},
        )
    return plan


def _write_online(ctx: AppContext, source: DatasetSource, values: dict[str, Any], target: Path) -> DatasetPlan:
    plan = DatasetPlan(source.id, source.mode)
    everything = target / "prompts.jsonl"
    keys = []
    with everything.open("w", encoding="utf-8") as out:
        for key, record in _first_record_per_prompt(ctx, source):
            messages = prompt_messages(record)
            if not any(m["role"] == "user" for m in messages):
                plan.issues["no_prompt"] = plan.issues.get("no_prompt", 0) + 1
                continue
            keys.append(key)
            line = {"group_key": key, "messages": messages, "metadata": record.metadata}
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
    if not keys:
        raise DatasetNotTrainable(
            f"dataset {source.id} has no prompt (a user turn before the first assistant turn)",
            {"dataset_id": source.id, "reason": "no_prompt"},
        )
    held = held_out_keys(keys, source.held_out, int(values.get("seed") or 0))
    _split(everything, target, held)
    plan.counts = {"prompts": len(keys), "train_prompts": len(keys) - len(held), "held_out_prompts": len(held)}
    return plan


def _groups(ctx: AppContext, source: DatasetSource) -> Iterator[GrpoGroup | GroupIssue]:
    return grpo_groups(_sorted_records(ctx, source), metadata_key=source.group_by, min_group_size=2)


def _first_record_per_prompt(ctx: AppContext, source: DatasetSource) -> Iterator[tuple[str, TrajectoryRecord]]:
    previous = None
    for key, record in _sorted_records(ctx, source):
        if key != previous:
            previous = key
            yield key, record


def _sorted_records(ctx: AppContext, source: DatasetSource) -> Iterator[tuple[str, TrajectoryRecord]]:
    store = dataset_store(ctx)
    files = store.files(source.id)
    scratch = store.staging(f"run-split-{os.getpid()}-{id(source)}")
    try:
        pairs, _unkeyed = sorted_group_keys(files.records, source.group_by, scratch.directory)
        with files.records.open("rb") as records:
            for key, offset in pairs:
                yield key, record_at(records, offset)
    finally:
        store.discard(scratch)


def _split(everything: Path, target: Path, held: set[str]) -> None:
    """train.jsonl and held_out.jsonl from the whole file, line by line, in key order."""
    with (
        everything.open(encoding="utf-8") as lines,
        split_path(target.parent, TRAIN).open("w", encoding="utf-8") as train,
        split_path(target.parent, HELD_OUT).open("w", encoding="utf-8") as held_out,
    ):
        for line in lines:
            (held_out if json.loads(line)["group_key"] in held else train).write(line)
    everything.unlink()


def read_prompts(run_dir: Path, split: str, offset: int, limit: int) -> tuple[list[dict[str, Any]], int]:
    """A page of a split's prompts (messages before the first assistant turn, metadata) and the split's size."""
    path = split_path(run_dir, split)
    if not path.exists():
        return [], 0
    page, total = [], 0
    with path.open(encoding="utf-8") as lines:
        for index, line in enumerate(lines):
            total += 1
            if offset <= index < offset + limit:
                page.append(_prompt_of(json.loads(line)))
    return page, total


def _prompt_of(line: dict[str, Any]) -> dict[str, Any]:
    if "messages" in line:  # online prompts
        return {"group_key": line["group_key"], "messages": line["messages"], "metadata": line.get("metadata") or {}}
    first = record_from_dict(_record_fields(line["trajectories"][0]))
    return {
        "group_key": line["group_key"],
        "messages": prompt_messages(first),
        "metadata": first.metadata,
        "records": line["size"],
    }


def _record_fields(trajectory: dict[str, Any]) -> dict[str, Any]:
    """A GRPO export trajectory is a stored record plus its advantage."""
    return {k: v for k, v in trajectory.items() if k != "advantage"}


def managed_values(ctx: AppContext, source: DatasetSource, run_dir: Path) -> dict[str, Any]:
    """The dataset environment's managed fields: its files in the run directory, the request's rewards (an
    environment's scorer by its file, which the online environment imports)."""
    train, held_out = str(split_path(run_dir, TRAIN)), str(split_path(run_dir, HELD_OUT))
    if source.mode in STORED:
        top_n = (source.top_n or 1) if source.mode == DatasetMode.SFT else None
        return {"groups_path": train, "held_out_path": held_out, "sft_top_n": top_n}
    return {
        "prompts_path": train,
        "held_out_path": held_out,
        "rewards": [_reward_entry(ctx, reward) for reward in source.rewards],
        "answer_field": source.answer_field,
        "dataset_judge": _judge_entry(ctx, source) if uses_judge(source) else None,
    }


def _judge_entry(ctx: AppContext, source: DatasetSource) -> dict[str, Any]:
    chosen = source.judge
    return judge_options(ctx.settings, chosen.model if chosen else None, chosen.rubric if chosen else None)


def split_file(run_dir: Path) -> Path:
    """Where a dataset run's split is written (read_plan reads it)."""
    return dataset_dir(run_dir) / "split.json"


def read_plan(run_dir: Path) -> dict[str, Any] | None:
    try:
        plan: dict[str, Any] = json.loads(split_file(run_dir).read_text())
        return plan
    except (OSError, ValueError):
        return None


def _reward_entry(ctx: AppContext, reward: RewardSpec) -> dict[str, Any]:
    entry: dict[str, Any] = reward.model_dump()
    if reward.name not in BUILTIN_REWARDS and reward.name not in GROUP_REWARDS:
        entry["file"] = str(EnvironmentCatalog.of(ctx).get(reward.name).file_path)
    return entry
