"""The `evaluation` job: a child process samples every model on the same prompts (`python -m rlctl.trainer.evaluate`),
then this process scores the completions with the dataset rewards (each model's completions of a prompt as one
group, for the judge) and compares each checkpoint with the base (docs/EVALUATIONS.md). A restarted job samples
again from the first prompt: its files are its own."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from itertools import groupby
from pathlib import Path
from typing import Any

from rlctl.judging.client import CachedJudge
from rlctl.judging.groups import Decided, judge_fresh_group, judged_scores, weighted_scores
from rlctl.service.children import service_child_environment
from rlctl.service.context import AppContext
from rlctl.service.evaluations import stats
from rlctl.service.evaluations.service import BASE, KIND
from rlctl.service.jobs.passes import NO_PROGRESS, Progress, ordered_map
from rlctl.service.jobs.runner import JobCancelled, JobFailed, JobHandle, JobKind
from rlctl.service.rewards.judge import make_judge
from rlctl.service.rewards.scorers import ScorerFailed, environment_scorers
from rlctl.service.rewards.service import plain_rewards
from rlctl.service.runs import datasets as dataset_runs
from rlctl.service.runs.launch import tinker_environment
from rlctl.service.runs.paths import RunPaths
from rlctl.service.settings import REPO_ROOT
from rlctl.supervisor.process import ProcessSpec, SupervisedProcess
from rlctl.supervisor.run import read_tail
from rlctl.trainer.retention import leased
from rlctl.trajectories.judge import DEFAULT_RUBRIC, GROUP_REWARDS
from rlctl.trajectories.records import TrajectoryRecord
from rlctl.trajectories.training import record_of_conversation, record_with_completion

POLL_S = 0.25
STOP_GRACE_S = 5.0


def job_kinds() -> tuple[JobKind, ...]:
    return (JobKind(KIND, run_evaluation, resumable=True),)


def upgraded_params(params: dict[str, Any]) -> dict[str, Any]:
    """An evaluation accepted by an earlier version (queued or interrupted across the upgrade) still runs: its
    models named their local adapter `adapter`, and only local runs were evaluated."""
    models = [{"name": m["name"], "weights": m.get("weights", m.get("adapter"))} for m in params["models"]]
    return {"backend": "local", "protocol": None, "judge": None, **params, "models": models}


def evaluation_dir(ctx: AppContext, evaluation_id: str) -> Path:
    return ctx.settings.data_path / "evaluations" / evaluation_id


def run_evaluation(ctx: AppContext, handle: JobHandle) -> dict[str, Any]:
    """Sample in a child process (restarted from the first prompt after a service restart), then score."""
    params = upgraded_params(handle.params)
    run_dir = RunPaths(ctx.settings.data_path, params["run_id"]).run_dir
    if params.get("tool_env"):  # held-out tasks of the environment, not prompts of the run's dataset
        prompts = [{"group_key": f"task_{index}"} for index in range(params["max_prompts"])]
    else:
        prompts, _total_prompts = dataset_runs.read_prompts(run_dir, params["split"], 0, params["max_prompts"])
    workdir = evaluation_dir(ctx, handle.job_id)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    total = len(params["models"]) * len(prompts) * params["samples_per_prompt"]
    spec = {
        **{k: params[k] for k in ("backend", "base_model", "tokenizer_name", "lora_rank", "protocol", "models")},
        **{k: params[k] for k in ("samples_per_prompt", "max_tokens", "temperature", "seed")},
        "device": "cpu",
        "prompts": [p["messages"] for p in prompts if "messages" in p],
        **({"tool_env": params["tool_env"], "tasks": len(prompts)} if params.get("tool_env") else {}),
    }
    (workdir / "spec.json").write_text(json.dumps(spec))  # no secret: a Tinker key is in the child's environment
    samples = workdir / "samples.jsonl"
    with contextlib.ExitStack() as held:  # the checkpoints it samples stay while it may load them (retention)
        for model in params["models"]:
            if model["weights"] and "://" not in model["weights"]:
                held.enter_context(leased(Path(model["weights"]), f"evaluation-{handle.job_id}"))
        _sample(ctx, handle, workdir, samples, total, tinker_environment(ctx.settings, params["backend"]))
    if params.get("tool_env"):
        result = compare_episodes(ctx, params, prompts, samples, handle)
    else:
        result = score_and_compare(ctx, params, prompts, samples, handle)
    (workdir / "result.json").write_text(json.dumps(result))
    handle.progress(total, total, force=True)
    return result


def _sample(
    ctx: AppContext, handle: JobHandle, workdir: Path, samples: Path, total: int, tinker: dict[str, str]
) -> None:
    env = service_child_environment()
    process = SupervisedProcess.spawn(
        ProcessSpec(
            role="evaluation",
            argv=[sys.executable, "-m", _sampler_module(workdir), str(workdir / "spec.json"), str(samples)],
            env={**env, **tinker, "PYTHONUNBUFFERED": "1"},
            cwd=REPO_ROOT,
            log_path=workdir / "sampler.log",
        ),
        ctx.children.fork_server,
    )
    try:
        while (status := process.poll()) is None:
            handle.check_cancelled()
            handle.progress(_lines(samples), total)
            time.sleep(POLL_S)  # a child's progress is polled, as the run supervisor polls its processes
    except JobCancelled:
        process.terminate(grace_s=STOP_GRACE_S)
        raise
    if not status.clean:
        tail = "\n".join(read_tail(workdir / "sampler.log", 20))
        raise JobFailed(f"the sampler {status.describe()}: {tail}")


def _sampler_module(workdir: Path) -> str:
    """A tool environment's episodes are played by the environment kit's child, completions sampled by the
    trainer's (docs/EVALUATIONS.md#tool-environments)."""
    spec = json.loads((workdir / "spec.json").read_text())
    return "rlctl.environment_kit.evaluation" if spec.get("tool_env") else "rlctl.trainer.evaluate"


def _lines(path: Path) -> int:
    try:
        with path.open("rb") as handle:
            return sum(1 for _ in handle)
    except OSError:
        return 0


Group = tuple[str, int, list[TrajectoryRecord]]  # (model name, prompt index, its completions as records)


def score_and_compare(
    ctx: AppContext,
    params: dict[str, Any],
    prompts: list[dict[str, Any]],
    samples: Path,
    progress: Progress = NO_PROGRESS,
) -> dict[str, Any]:
    """Scores each (model, prompt) group of the samples file, then compares. With the judge or completion reward
    a group goes to the judge as one (`RLCTL_JUDGE_CONCURRENCY` at once); a group it cannot score leaves that
    prompt out for that model, counted in `unscored_prompts`, never 0. Plain rewards score in this thread (an
    environment's scorer is a child process)."""
    answer_field, spec = params["answer_field"], params["rewards"]
    plain_spec = [entry for entry in spec if entry["name"] not in GROUP_REWARDS]
    names = [entry["name"] for entry in spec if entry["name"] in GROUP_REWARDS]
    scorers = environment_scorers(ctx, plain_spec, answer_field)
    judge: CachedJudge | None = None
    try:
        plain = plain_rewards(plain_spec, scorers, answer_field)
        options = params.get("judge") or {}
        if names:
            judge = make_judge(ctx.settings, ctx.db, options.get("model") or ctx.settings.judge_model, ctx.scrub)
            if judge is None:
                raise JobFailed("the judge endpoint is no longer configured: set RLCTL_JUDGE_BASE_URL, evaluate again")
        rubric = options.get("rubric") or DEFAULT_RUBRIC

        def decided(group: Group) -> tuple[Group, list[Decided] | None]:  # a worker thread: the judge's calls
            return group, judge_fresh_group(judge, group[2], names, rubric) if judge is not None else None

        by_model: dict[str, dict[int, list[float]]] = defaultdict(dict)
        unscored: dict[str, set[int]] = defaultdict(set)
        outcomes = ordered_map(decided, _groups(samples, prompts), ctx.settings.judge_concurrency if names else 1)
        try:
            for (model, index, records), outcome in outcomes:
                try:
                    scores = weighted_scores(records, spec, plain, outcome)
                except ScorerFailed as error:
                    raise JobFailed(str(error)) from None
                if scores is None:
                    unscored[model].add(index)
                else:
                    by_model[model][index] = scores
                progress.check_cancelled()
        finally:
            outcomes.close()
    finally:
        for scorer in scorers.values():
            scorer.close()
        if judge is not None:
            judge.close()
    result = _comparison(params, prompts, by_model, unscored)
    if judge is not None:
        result["judge"] = {"model": judge.client.model, **judge.counters.as_dict()}
    return result


EPISODE_STATISTICS = {"tool_calls": "tool_calls_per_episode", "failed_calls": "failed_calls_per_episode"}


def compare_episodes(
    ctx: AppContext,
    params: dict[str, Any],
    prompts: list[dict[str, Any]],
    samples: Path,
    progress: Progress = NO_PROGRESS,
) -> dict[str, Any]:
    """A tool environment's episodes, already scored by its own rewards in the child: compared as completions are,
    with each model's per-episode means of turns, tool calls and failed calls beside its reward. With the
    environment's `judge_rubric`, each model's episodes of a task go to the service's judge as one group (the judge
    the run trained with) and its score times `judge_weight` is added; a group it cannot score leaves that task out
    for that model, counted in `unscored_prompts`, never 0."""
    config = params["tool_env"]["config"]
    rubric, weight = config.get("judge_rubric"), float(config.get("judge_weight", 1.0))
    judge: CachedJudge | None = None
    if rubric:
        model = (config.get("judge") or {}).get("model") or ctx.settings.judge_model
        judge = make_judge(ctx.settings, ctx.db, model, ctx.scrub)
        if judge is None:
            raise JobFailed("the judge endpoint is no longer configured: set RLCTL_JUDGE_BASE_URL, evaluate again")

    def scored(group: LineGroup) -> tuple[LineGroup, list[float] | None]:  # a worker thread: the judge's calls
        own = [float(episode["reward"]) for episode in group[2]]
        if judge is None:
            return group, own
        records = [record_of_conversation(episode["messages"]) for episode in group[2]]
        return group, judged_scores(judge, records, rubric, own, weight)

    by_model: dict[str, dict[int, list[float]]] = defaultdict(dict)
    unscored: dict[str, set[int]] = defaultdict(set)
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    outcomes = ordered_map(scored, _line_groups(samples), ctx.settings.judge_concurrency if judge else 1)
    try:
        for (model, index, episodes), rewards in outcomes:
            for episode in episodes:
                for key in ("turns", "tool_calls", "failed_calls", "episodes"):
                    totals[model][key] += episode.get(key, 1)
            if rewards is None:
                unscored[model].add(index)
            else:
                by_model[model][index] = rewards
            progress.check_cancelled()
    finally:
        outcomes.close()
        if judge is not None:
            judge.close()
    result = _comparison(params, prompts, by_model, unscored)
    for entry in result["models"]:
        own = totals.get(entry["name"])
        count = own["episodes"] if own else 0
        entry["turns_per_episode"] = own["turns"] / count if own else None
        for key, name in EPISODE_STATISTICS.items():
            entry[name] = own[key] / count if own else None
    if judge is not None:
        result["judge"] = {"model": judge.client.model, **judge.counters.as_dict()}
    return result


LineGroup = tuple[str, int, list[dict[str, Any]]]  # (model name, prompt or task index, its lines)


def _line_groups(samples: Path) -> Iterator[LineGroup]:
    """The samples file's groups in file order: a child writes a prompt's samples (a task's episodes) of one model
    together."""
    with samples.open(encoding="utf-8") as lines:
        parsed = (json.loads(line) for line in lines)
        for (model, index), group in groupby(parsed, key=lambda line: (line["model"], line["prompt_index"])):
            yield model, index, list(group)


def _groups(samples: Path, prompts: list[dict[str, Any]]) -> Iterator[Group]:
    """Each (model, prompt) group of completions as records."""
    for model, index, lines in _line_groups(samples):
        prompt = prompts[index]
        records = [record_with_completion(prompt["messages"], s["text"], prompt.get("metadata")) for s in lines]
        yield model, index, records


def _comparison(
    params: dict[str, Any],
    prompts: list[dict[str, Any]],
    by_model: dict[str, dict[int, list[float]]],
    unscored: dict[str, set[int]],
) -> dict[str, Any]:
    means = {name: stats.prompt_means(rewards) for name, rewards in by_model.items()}
    base = means.get(BASE) or {}
    models = []
    for model in params["models"]:
        name = model["name"]
        own = means.get(name) or {}
        entry: dict[str, Any] = {
            "name": name,
            "weights": model["weights"],
            "mean_reward": sum(own.values()) / len(own) if own else None,
            "samples": sum(len(v) for v in by_model.get(name, {}).values()),
            "unscored_prompts": len(unscored.get(name, ())),
            "difference": None,
            "interval": None,
            "win_rate": None,
        }
        if name != BASE and set(own) & set(base):
            found = stats.compare(base, own, seed=params["seed"])
            entry.update(
                difference=found.mean_difference,
                interval=list(found.interval),
                win_rate=found.win_rate,
                wins=found.wins,
                ties=found.ties,
                losses=found.losses,
            )
        models.append(entry)
    per_prompt = [
        {
            "prompt_index": index,
            "group_key": prompt["group_key"],
            "rewards": {name: means[name][index] for name in means if index in means[name]},
            "unscored": [m["name"] for m in params["models"] if index in unscored.get(m["name"], ())],
        }
        for index, prompt in enumerate(prompts)
    ]
    return {"models": models, "prompts": per_prompt}
