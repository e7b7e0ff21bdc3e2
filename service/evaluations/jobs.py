"""The `evaluation` job: a child process samples every model on the same prompts (`python -m trainer.evaluate`),
then this process scores the completions with the dataset rewards and compares each checkpoint with the base
(docs/EVALUATIONS.md). A restarted job samples again from the first prompt: its files are its own."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from service.context import AppContext
from service.datasets.jobs import environment_scorers, with_answer_field
from service.evaluations import stats
from service.evaluations.service import BASE, KIND
from service.jobs.runner import JobCancelled, JobFailed, JobHandle, JobKind
from service.runs import datasets as dataset_runs
from service.runs.paths import RunPaths
from service.settings import REPO_ROOT, SECRET_ENV_NAMES
from supervisor.process import ProcessSpec, SupervisedProcess
from supervisor.run import read_tail
from trajectories.rewards import build_rewards, score_record
from trajectories.training import record_with_completion

POLL_S = 0.25
STOP_GRACE_S = 5.0


def job_kinds() -> tuple[JobKind, ...]:
    return (JobKind(KIND, run_evaluation, resumable=True),)


def evaluation_dir(ctx: AppContext, evaluation_id: str) -> Path:
    return ctx.settings.data_path / "evaluations" / evaluation_id


def run_evaluation(ctx: AppContext, handle: JobHandle) -> dict[str, Any]:
    """Sample in a child process (restarted from the first prompt after a service restart), then score."""
    params = handle.params
    run_dir = RunPaths(ctx.settings.data_path, params["run_id"]).run_dir
    prompts, _total_prompts = dataset_runs.read_prompts(run_dir, params["split"], 0, params["max_prompts"])
    workdir = evaluation_dir(ctx, handle.job_id)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    total = len(params["models"]) * len(prompts) * params["samples_per_prompt"]
    spec = {
        **{k: params[k] for k in ("base_model", "tokenizer_name", "lora_rank", "models")},
        **{k: params[k] for k in ("samples_per_prompt", "max_tokens", "temperature", "seed")},
        "device": "cpu",
        "prompts": [p["messages"] for p in prompts],
    }
    (workdir / "spec.json").write_text(json.dumps(spec))
    samples = workdir / "samples.jsonl"
    _sample(ctx, handle, workdir, samples, total)
    result = _score_and_compare(ctx, params, prompts, samples)
    (workdir / "result.json").write_text(json.dumps(result))
    handle.progress(total, total, force=True)
    return result


def _sample(ctx: AppContext, handle: JobHandle, workdir: Path, samples: Path, total: int) -> None:
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV_NAMES and not k.startswith("RLCTL_")}
    process = SupervisedProcess.spawn(
        ProcessSpec(
            role="evaluation",
            argv=[sys.executable, "-m", "trainer.evaluate", str(workdir / "spec.json"), str(samples)],
            env={**env, "PYTHONUNBUFFERED": "1"},
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


def _lines(path: Path) -> int:
    try:
        with path.open("rb") as handle:
            return sum(1 for _ in handle)
    except OSError:
        return 0


def _score_and_compare(
    ctx: AppContext, params: dict[str, Any], prompts: list[dict[str, Any]], samples: Path
) -> dict[str, Any]:
    answer_field = params["answer_field"]
    scorers = environment_scorers(ctx, params["rewards"], answer_field)
    try:
        rewards = [with_answer_field(r, answer_field) for r in build_rewards(params["rewards"], scorers)]
        by_model: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        with samples.open(encoding="utf-8") as lines:
            for line in lines:
                sample = json.loads(line)
                prompt = prompts[sample["prompt_index"]]
                record = record_with_completion(prompt["messages"], sample["text"], prompt.get("metadata"))
                by_model[sample["model"]][sample["prompt_index"]].append(score_record(record, rewards).reward)
    finally:
        for scorer in scorers.values():
            scorer.close()
    return _comparison(params, prompts, by_model)


def _comparison(
    params: dict[str, Any], prompts: list[dict[str, Any]], by_model: dict[str, dict[int, list[float]]]
) -> dict[str, Any]:
    means = {name: stats.prompt_means(rewards) for name, rewards in by_model.items()}
    base = means.get(BASE) or {}
    models = []
    for model in params["models"]:
        name = model["name"]
        own = means.get(name) or {}
        entry: dict[str, Any] = {
            "name": name,
            "weights": model["adapter"],
            "mean_reward": sum(own.values()) / len(own) if own else 0.0,
            "samples": sum(len(v) for v in by_model.get(name, {}).values()),
            "difference": None,
            "interval": None,
            "win_rate": None,
        }
        if name != BASE and own and base:
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
        }
        for index, prompt in enumerate(prompts)
    ]
    return {"models": models, "prompts": per_prompt}
