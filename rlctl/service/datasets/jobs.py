"""Background jobs of datasets: filter, compress and score make a derived dataset from the parent's record
stream; export-grpo writes a grouped export. Each reads the parent one record at a time.

Resuming after a service restart: a derived dataset is written under the job's own staging directory and its id
is fixed when the job is submitted, so a resumed job either finds its committed output (and just records it) or
starts again from the first record. Nothing partial is ever visible.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from rlctl.service.context import AppContext
from rlctl.service.datasets.builder import DatasetBuilder, insert_dataset_row
from rlctl.service.datasets.schemas import DatasetOut, DerivedDatasetResult
from rlctl.service.datasets.service import dataset_stats, dataset_store, get_dataset, summary_endpoint
from rlctl.service.datasets.store import iter_lines
from rlctl.service.datasets.summary_client import OpenAICompatibleSummarizer
from rlctl.service.datasets.tokenizers import LockedCounter, MemoCounter, load_counter
from rlctl.service.errors import NotFound
from rlctl.service.jobs.passes import ordered_map
from rlctl.service.jobs.runner import JobFailed, JobHandle, JobKind
from rlctl.service.rewards.group_rewards import GroupRewards
from rlctl.service.rewards.grouping import record_at, records_with_offsets, sorted_group_keys
from rlctl.service.rewards.judge import make_judge
from rlctl.service.rewards.scorers import ScorerFailed, environment_scorers
from rlctl.service.rewards.service import plain_rewards
from rlctl.trajectories.compression import CompressionConfig, CompressionStats, compress_record
from rlctl.trajectories.filters import FilterCriteria, FilterReport, drop_reasons
from rlctl.trajectories.grpo import NO_PROMPT, GroupIssue, GrpoExportStats, GrpoGroup, grpo_groups
from rlctl.trajectories.judge import GROUP_REWARDS, JUDGE_REWARD
from rlctl.trajectories.records import TrajectoryRecord, record_from_dict
from rlctl.trajectories.rewards import DecidedReward, Unscored, WeightedReward, scored
from rlctl.trajectories.summarizers import ExtractiveSummarizer, Summarizer

T = TypeVar("T")
MAX_REPORTED_ISSUES = 100


def job_kinds() -> tuple[JobKind, ...]:
    return (
        JobKind("dataset_filter", run_dataset_filter, resumable=True),
        JobKind("dataset_compress", run_dataset_compress, resumable=True),
        JobKind("dataset_score", run_dataset_score, resumable=True),
        JobKind("dataset_export_grpo", run_dataset_export_grpo, resumable=True),
    )


# --- the shared pass over a parent dataset ---


@dataclass
class Derivation:
    ctx: AppContext
    handle: JobHandle
    operation: str

    @property
    def params(self) -> dict[str, Any]:
        return self.handle.params

    def finished_output(self) -> DerivedDatasetResult | None:
        """The output of an earlier attempt of this job, if it got as far as committing it."""
        output_id = self.params["output_id"]
        try:
            return _result(get_dataset(self.ctx, output_id))
        except NotFound:
            pass
        meta = dataset_store(self.ctx).files(output_id).meta
        if meta.is_file():
            row = insert_dataset_row(self.ctx.db.session, json.loads(meta.read_text(encoding="utf-8")))
            return _result(DatasetOut.model_validate(row))
        return None

    def parent(self) -> DatasetOut:
        try:
            return get_dataset(self.ctx, self.params["dataset_id"])
        except NotFound:
            raise JobFailed(f"dataset {self.params['dataset_id']} was deleted before the job could read it") from None

    def records(self) -> Iterator[TrajectoryRecord]:
        path = dataset_store(self.ctx).files(self.params["dataset_id"]).records
        for line in iter_lines(path):
            yield record_from_dict(json.loads(line))

    def builder(self, counter: Any, stats: dict[str, Any] | None = None) -> DatasetBuilder:
        return DatasetBuilder(dataset_store(self.ctx), self.handle.job_id, counter, stats)

    def finish(self, builder: DatasetBuilder, parent: DatasetOut, report: dict[str, Any]) -> DerivedDatasetResult:
        parameters = {k: v for k, v in self.params.items() if k not in ("dataset_id", "output_id", "name")}
        row = builder.finish(
            self.ctx.db.session,
            self.params["output_id"],
            name=self.params["name"],
            operation=self.operation,
            parent_id=parent.id,
            parameters=parameters,
            source_format=parent.source_format,
            report=report,
        )
        return _result(DatasetOut.model_validate(row))

    def run(
        self,
        builder: DatasetBuilder,
        total: int,
        outcomes: Iterable[T],
        accept: Callable[[T, DatasetBuilder], None],
    ) -> None:
        """Feeds each outcome to `accept` in record order, with progress and cancellation between records."""
        try:
            for done, outcome in enumerate(outcomes, start=1):
                accept(outcome, builder)
                self.handle.progress(done, total)
                self.handle.check_cancelled()
        except BaseException:
            builder.abort()
            raise
        self.handle.progress(total, total, force=True)


def _result(dataset: DatasetOut) -> DerivedDatasetResult:
    return DerivedDatasetResult(
        dataset_id=dataset.id, name=dataset.name, record_count=dataset.record_count, report=dataset.report
    )


# --- filter ---


def run_dataset_filter(ctx: AppContext, handle: JobHandle) -> DerivedDatasetResult:
    job = Derivation(ctx, handle, "filter")
    if (done := job.finished_output()) is not None:
        return done
    parent, params = job.parent(), handle.params
    allowed = params.get("allowed_tools")
    criteria = FilterCriteria(
        drop_without_reasoning=bool(params.get("drop_without_reasoning")),
        drop_incomplete=bool(params.get("drop_incomplete")),
        drop_hallucinated_tools=bool(params.get("drop_hallucinated_tools")),
        allowed_tools=frozenset(allowed) if allowed is not None else None,
        min_tokens=params.get("min_tokens"),
        max_tokens=params.get("max_tokens"),
    )
    counter = MemoCounter(load_counter(ctx.settings, params["tokenizer"]))
    builder = job.builder(counter)
    report = FilterReport()

    def accept(record: TrajectoryRecord, out: DatasetBuilder) -> None:
        reasons = drop_reasons(record, criteria, counter)
        report.add(reasons)
        if reasons:
            counter.forget()
        else:
            out.add(record)

    job.run(builder, parent.record_count, job.records(), accept)
    return job.finish(builder, parent, {**report.as_dict(), "tokenizer": counter.name})


# --- compress ---


def run_dataset_compress(ctx: AppContext, handle: JobHandle) -> DerivedDatasetResult:
    job = Derivation(ctx, handle, "compress")
    if (done := job.finished_output()) is not None:
        return done
    parent, params = job.parent(), handle.params
    config = CompressionConfig(
        target_max_tokens=params["target_max_tokens"],
        summary_target_tokens=params["summary_target_tokens"],
        protect_first_system=params["protect_first_system"],
        protect_first_human=params["protect_first_human"],
        protect_first_gpt=params["protect_first_gpt"],
        protect_first_tool=params["protect_first_tool"],
        protect_last_n_turns=params["protect_last_n_turns"],
    )
    base_counter = load_counter(ctx.settings, params["tokenizer"])
    summarizer, workers = _summarizer(ctx, params["summarizer"])
    # One thread: the builder's memo also serves compression's counts, so statistics cost no second count.
    # Several (a remote summariser): they share one locked tokenizer, and the builder counts again.
    counter = MemoCounter(base_counter) if workers == 1 else LockedCounter(base_counter)
    builder = job.builder(counter)
    aggregate = CompressionStats()

    def compress(record: TrajectoryRecord) -> Any:
        return compress_record(record, counter, summarizer, config)

    def accept(result: Any, out: DatasetBuilder) -> None:
        aggregate.add(result.metrics)
        out.add_metrics({"index": out.count, **result.metrics.as_dict()})
        out.add(result.record)

    outcomes = ordered_map(compress, job.records(), workers)
    try:
        job.run(builder, parent.record_count, outcomes, accept)
    finally:
        outcomes.close()
    report = {**aggregate.as_dict(), "summarizer": summarizer.name, "tokenizer": counter.name}
    return job.finish(builder, parent, report)


def _summarizer(ctx: AppContext, choice: str) -> tuple[Summarizer, int]:
    endpoint = summary_endpoint(ctx)
    if choice != "model":
        return ExtractiveSummarizer(), 1
    if endpoint is None:
        raise JobFailed("the summariser endpoint is no longer configured; compress again with summarizer=extractive")
    base_url, key = endpoint
    settings = ctx.settings
    summarizer = OpenAICompatibleSummarizer(
        base_url=base_url,
        api_key=key,
        model=settings.summary_model,
        max_retries=settings.summary_max_retries,
        timeout_s=settings.summary_timeout_s,
    )
    return summarizer, settings.summary_concurrency


# --- score ---


def run_dataset_score(ctx: AppContext, handle: JobHandle) -> DerivedDatasetResult:
    job = Derivation(ctx, handle, "score")
    if (done := job.finished_output()) is not None:
        return done
    parent, params = job.parent(), handle.params
    answer_field = params.get("answer_field", "answer")
    spec: list[dict[str, Any]] = params["rewards"]
    plain_spec = [entry for entry in spec if entry["name"] not in GROUP_REWARDS]
    scorers = environment_scorers(ctx, plain_spec, answer_field)
    group: GroupRewards | None = None
    try:
        plain = plain_rewards(plain_spec, scorers, answer_field)
        if len(plain) < len(spec):
            group = _group_rewards(ctx, job, spec, plain)
        parent_stats = dataset_stats(ctx, parent.id).stats
        builder = job.builder(load_counter(ctx.settings, "approx"), stats=parent_stats)
        missing = {"answer_missing": 0}
        unscored: dict[str, int] = {}

        def accept(item: tuple[int, TrajectoryRecord], out: DatasetBuilder) -> None:
            offset, record = item
            if answer_field not in record.metadata:
                missing["answer_missing"] += 1
            decided = group.for_record(offset, record) if group is not None else None
            weighted = [
                plain[entry["name"]]
                if entry["name"] in plain
                else WeightedReward(
                    DecidedReward(
                        entry["name"],
                        decided.values.get(entry["name"]) if decided else None,
                        decided.why.get(entry["name"], "unscored") if decided else "unscored",
                    ),
                    float(entry.get("weight", 1.0)),
                )
                for entry in spec
            ]
            try:
                out.add(scored(record, weighted, decided.reasons if decided else None))
            except Unscored as outcome:  # kept, unscored and counted: never a silent 0
                key = f"{outcome.reward}:{outcome.reason}"
                unscored[key] = unscored.get(key, 0) + 1
                out.add(replace(record, reward=None, reward_breakdown=None, reward_reasons=None))
            except ScorerFailed as error:
                raise JobFailed(str(error)) from None

        records = records_with_offsets(dataset_store(ctx).files(parent.id).records)
        job.run(builder, parent.record_count, records, accept)
    finally:
        for scorer in scorers.values():
            scorer.close()
        if group is not None:
            group.close()
    weights = {entry["name"]: float(entry.get("weight", 1.0)) for entry in spec}
    report = {"rewards": builder.rewards.as_dict(), "weights": weights, "answer_field": answer_field, **missing}
    report["unscored"] = sum(unscored.values())
    report["unscored_by_reason"] = unscored
    if group is not None:
        report.update(group.report())
    return job.finish(builder, parent, report)


def _group_rewards(
    ctx: AppContext, job: Derivation, spec: list[dict[str, Any]], plain: dict[str, WeightedReward]
) -> GroupRewards:
    """Decides the group rewards (judge, completion) for every record before the scoring pass."""
    params = job.params
    options = params.get("judge") or {}
    names = [entry["name"] for entry in spec if entry["name"] in GROUP_REWARDS]
    judge = make_judge(ctx.settings, ctx.db, options.get("model") or ctx.settings.judge_model, ctx.scrub)
    if judge is None and JUDGE_REWARD in names:
        raise JobFailed("the judge endpoint is no longer configured: set RLCTL_JUDGE_BASE_URL and score again")
    reference_name = options.get("calibrate_with") or next(
        (name for name in ("correctness", "source_reward") if name in plain), None
    )
    reference = (reference_name, plain[reference_name].function) if reference_name in plain else None
    group = GroupRewards(names, judge, options.get("rubric"), reference if JUDGE_REWARD in names else None)
    store = dataset_store(ctx)
    scratch = store.staging(f"{job.handle.job_id}-groups")
    try:
        records = store.files(params["dataset_id"]).records
        group.decide_file(
            records, options.get("group_by"), scratch.directory, ctx.settings.judge_concurrency, job.handle
        )
    except BaseException:
        group.close()
        raise
    finally:
        store.discard(scratch)
    return group


# --- GRPO export ---


def run_dataset_export_grpo(ctx: AppContext, handle: JobHandle) -> dict[str, Any]:
    """Groups by prompt with an on-disk sort: memory holds one sort run of keys and one group of records."""
    params = handle.params
    dataset_id = params["dataset_id"]
    try:
        dataset = get_dataset(ctx, dataset_id)
    except NotFound:
        raise JobFailed(f"dataset {dataset_id} was deleted before the export could read it") from None
    store = dataset_store(ctx)
    files, export_id = store.files(dataset_id), handle.job_id
    scratch = store.staging(export_id)  # swept at start-up unless this job is still to resume
    staging = scratch.directory / "export.jsonl"
    stats, examples = GrpoExportStats(), []
    try:
        sorted_pairs, unkeyed = sorted_group_keys(files.records, params.get("group_by"), scratch.directory, handle)
        if unkeyed:
            issue = GroupIssue(None, NO_PROMPT, unkeyed, "records without a prompt cannot be grouped")
            stats.add(issue)
            examples.append(_issue_dict(issue))
        with files.records.open("rb") as records, staging.open("w", encoding="utf-8") as out:
            keyed = ((key, record_at(records, offset)) for key, offset in sorted_pairs)
            outcomes = grpo_groups(
                keyed,
                metadata_key=params.get("group_by"),
                normalize_by_std=bool(params.get("normalize_by_std")),
                min_group_size=int(params.get("min_group_size", 2)),
                drop_zero_variance=bool(params.get("drop_zero_variance")),
            )
            for outcome in outcomes:
                stats.add(outcome)
                if isinstance(outcome, GrpoGroup):
                    out.write(json.dumps(outcome.as_dict(), ensure_ascii=False) + "\n")
                elif len(examples) < MAX_REPORTED_ISSUES:
                    examples.append(_issue_dict(outcome))
                handle.check_cancelled()
            out.flush()
            os.fsync(out.fileno())
        final = files.export(export_id)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, final)
    finally:
        store.discard(scratch)
    handle.progress(dataset.record_count, dataset.record_count, force=True)
    return {
        "dataset_id": dataset_id,
        "export_id": export_id,
        **stats.as_dict(),
        "issue_examples": examples,
        "download": f"/datasets/{dataset_id}/exports/{export_id}",
    }


def _issue_dict(issue: GroupIssue) -> dict[str, Any]:
    return {"group_key": issue.key, "reason": issue.reason, "size": issue.size, "detail": issue.detail}
