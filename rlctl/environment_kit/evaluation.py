"""A tool environment's evaluation child: `python -m rlctl.environment_kit.evaluation SPEC.json OUT.jsonl`.

The control plane's evaluation of a run of a multi-turn tool environment (docs/EVALUATIONS.md#tool-environments)
runs this in place of `rlctl.trainer.evaluate`, with that module's spec and models (the `local` backend with each
checkpoint's adapter, or Tinker) plus `"tool_env": {"file", "class_name", "config"}` and `"tasks"`: the environment,
built from its file with the run's own environment config, plays its first `tasks` held-out tasks, each
`samples_per_prompt` times per model, by its own episode code (`ToolEnv.episode`, with this model as its sampler)
and is scored by its own rewards (`ToolEnv.score`). A line per episode, a task's episodes of one model together:
`{"model", "prompt_index", "sample", "reward", "turns", "tool_calls", "failed_calls"}`, and the episode's `messages`
when the environment has a `judge_rubric`: the service's judge scores each task's episodes of a model as a group
and adds its score (this child never holds the judge's key).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any

from rlctl.environment_kit.agents import Sampled, Sampler
from rlctl.trainer.backends.base import SamplingRequest
from rlctl.trainer.evaluate import ModelSampler, child_main, evaluated_models


def load_tool_env(spec: dict[str, Any]) -> Any:
    """The run's tool environment, built from its file and the run's own environment config (its server is never
    asked: every episode gets an evaluated model's sampler)."""
    from atroposlib.envs.base import APIServerConfig

    from rlctl.environment_kit.tool_env import ToolEnv

    found = spec["tool_env"]
    loader = importlib.util.spec_from_file_location("rlctl_evaluated_environment", found["file"])
    if loader is None or loader.loader is None:
        raise RuntimeError(f"cannot load {found['file']}")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    cls = getattr(module, found["class_name"])
    if not (isinstance(cls, type) and issubclass(cls, ToolEnv)):
        raise RuntimeError(f"{found['class_name']} is not a ToolEnv")
    fields = cls.env_config_cls.model_fields
    config = cls.env_config_cls(**{k: v for k, v in found["config"].items() if k in fields})
    server = APIServerConfig(model_name=config.tokenizer_name, base_url="http://127.0.0.1:1/v1", api_key="unused")
    return cls(config, [server], slurm=False, testing=False)


def model_sampler(sampler: ModelSampler, temperature: float, seed: int) -> Sampler:
    """An episode's sampler over one evaluated model; its turns are seeded from `seed` in order, the same for every
    model, so the models are compared on the same random numbers."""
    turns = iter(range(seed, seed + 1_000))

    async def sample(input_ids: list[int], max_tokens: int) -> Sampled:
        request = SamplingRequest(
            prompt_tokens=input_ids, n=1, max_new_tokens=max_tokens, temperature=temperature, seed=next(turns)
        )
        completion = sampler.sample(request)[0]
        return Sampled(list(completion.tokens), list(completion.logprobs), completion.finish_reason)

    return sample


def play_all(spec: dict[str, Any], out_path: Path) -> None:
    """Each model plays the environment's held-out tasks (see the module's docstring)."""
    env = load_tool_env(spec)
    tasks = env.held_out_tasks(int(spec["tasks"]))
    models = evaluated_models(spec)
    seed, temperature = int(spec.get("seed") or 0), float(spec["temperature"])
    judged = bool(env.config.judge_rubric)
    with out_path.open("a", encoding="utf-8") as out:
        for model, sampler in models:
            for index, task in enumerate(tasks):
                lines = []
                for number in range(int(spec["samples_per_prompt"])):
                    sample = model_sampler(sampler, temperature, (seed * 1_000_003 + index * 64 + number) * 1_000)
                    episode = asyncio.run(env.episode(task, temperature, "eval", sample=sample))
                    stats = episode.stats
                    lines.append(
                        {
                            "model": model["name"],
                            "prompt_index": index,
                            "sample": number,
                            "reward": env.score(task, episode),
                            "turns": stats.turns,
                            "tool_calls": stats.tool_calls,
                            "failed_calls": stats.failed_calls,
                            **({"messages": episode.messages} if judged else {}),
                        }
                    )
                out.write("".join(json.dumps(line) + "\n" for line in lines))
                out.flush()  # a task's episodes at once: the caller counts lines as progress
            del sampler


def main(argv: list[str] | None = None) -> int:
    return child_main(argv, "rlctl.environment_kit.evaluation", play_all)


if __name__ == "__main__":
    raise SystemExit(main())
