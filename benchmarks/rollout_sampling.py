"""Sampling on the local backend against the machine's limit: a bare `generate()` of the same model, batch and tokens.

    .venv/bin/python benchmarks/rollout_sampling.py [--group-size 8] [--groups 6] [--new-tokens 48] [--threads 1]

Two measurements, one process, torch at `--threads` intra-op threads (1: what the trainer gives its sampler on two
cores), each against a baseline measured in the same run:

- **Single-turn group**: the local backend's sampler (`LocalBackend.sample`, the inference server's path without
  HTTP) answers one request of n = `--group-size` rows of `--new-tokens` tokens (every row runs to its limit: the
  end tokens are not stop tokens here), against transformers' `generate()` of the same model and LoRA adapter (a
  copy of the backend's, as its sampler holds one) on the same prompt repeated `--group-size` times,
  `min_new_tokens` = `max_new_tokens`, sampling, transformers' own KV cache.
- **Multi-turn tool group**: `tool_lookup`'s episodes (the primed tiny model) played as a run plays them: a group of
  `--group-size` episodes of one task at once (`run_group`), each turn one request to the same sampler from a
  thread of its own, as the inference server's calls arrive; the sampler batches what is waiting. Its wall time is
  compared with the sum, turn by turn, of one `generate()` of the episodes still playing at that turn (their
  prompts left-padded), as many new tokens as the longest reply of that turn, forced. The baseline is thus the
  same rows and at least the same tokens in lock-step, which is what a group costs at best. Measured twice: as a
  run samples (a group's episodes share one `coalesced` sampler: their common first turn is one request of n rows),
  and with every turn of every episode its own request (the baseline of that fast path).

Printed: each median time, tokens per second, and the ratio bare / ours (issue 40's goals: ≥ 0.8 for a multi-turn
group; ≥ 0.91, i.e. at most 1.1× the bare time, for a single-turn group). `--groups` repeats each measurement and
reports the median. The load average is printed: a busy machine slows both sides alike, the ratio holds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from environments import tool_lookup  # noqa: E402 - after the repository is on the path
from rlctl.environment_kit.agents import MASKED, Sampled, coalesced, run_group  # noqa: E402
from rlctl.environment_kit.evaluation import load_tool_env  # noqa: E402
from rlctl.trainer.backends.base import SamplingRequest  # noqa: E402
from rlctl.trainer.backends.local import LocalBackend  # noqa: E402
from rlctl.trainer.backends.sampler import sampler_copy  # noqa: E402
from rlctl.trainer.config import parse_config  # noqa: E402
from rlctl.trainer.tiny_model import init_tiny_model  # noqa: E402


def local_backend(model: Path, run_dir: Path) -> LocalBackend:
    config = parse_config(
        {
            "env": {"rollout_server_url": "http://127.0.0.1:1"},
            "tinker": {
                "base_model": str(model),
                "run_dir": str(run_dir),
                "inference_port": 1,  # never served: the sampler is called directly
                "device": "cpu",
                "max_token_trainer_length": 2048,
            },
        }
    )
    return LocalBackend(config)


def bare_generate(model: Any, prompts: list[list[int]], new_tokens: int, pad_id: int) -> float:
    """Seconds for one batched `generate()` of `prompts` (left-padded), exactly `new_tokens` new tokens each."""
    width = max(len(prompt) for prompt in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    started = time.perf_counter()
    with torch.no_grad():
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=pad_id,
        )
    return time.perf_counter() - started


def single_turn(
    backend: LocalBackend, model: Any, prompt: list[int], rows: int, new_tokens: int
) -> tuple[float, float]:
    """(ours, bare) seconds for one group of `rows` completions of `new_tokens` tokens of `prompt`."""
    request = SamplingRequest(prompt, n=rows, max_new_tokens=new_tokens, temperature=1.0)
    started = time.perf_counter()
    completions = backend.sample(request)
    ours = time.perf_counter() - started
    produced = min(len(c.tokens) for c in completions)
    bare = bare_generate(model, [prompt] * rows, produced, backend.tokenizer.pad_token_id or 0)
    return ours, bare


def group_sampler(backend: LocalBackend, coalesce: bool) -> Any:
    """A group's sampler over the backend as a run's is (`coalesced`: the common first turn goes out as one request
    of n rows; without `coalesce`, every turn of every episode its own request), each request off the event loop
    (as the inference server's calls arrive on threads of their own)."""

    async def sample_n(input_ids: list[int], max_tokens: int, n: int) -> list[Sampled]:
        request = SamplingRequest(list(input_ids), n=n, max_new_tokens=max_tokens, temperature=1.0)
        completions = await asyncio.to_thread(backend.sample, request)
        return [Sampled(list(c.tokens), list(c.logprobs), c.finish_reason) for c in completions]

    async def alone(input_ids: list[int], max_tokens: int) -> Sampled:
        return (await sample_n(input_ids, max_tokens, 1))[0]

    return coalesced(sample_n) if coalesce else alone


def turns_of(episode: Any) -> list[tuple[list[int], int]]:
    """(prompt tokens, reply length) of each of the episode's turns: a reply is a run of trained tokens."""
    turns: list[tuple[list[int], int]] = []
    start = None
    for index, mask in enumerate([*episode.masks, MASKED]):
        if mask != MASKED and start is None:
            start = index
        elif mask == MASKED and start is not None:
            turns.append((episode.tokens[:start], index - start))
            start = None
    return turns


def multi_turn(
    env: Any, backend: LocalBackend, model: Any, task: Any, rows: int, coalesce: bool = True
) -> tuple[float, float, int, float]:
    """(ours, bare, sampled tokens, tool seconds) for one group of `rows` episodes of `task`."""
    sample = group_sampler(backend, coalesce)
    started = time.perf_counter()
    episodes = asyncio.run(run_group([env.episode(task, 1.0, sample=sample) for _ in range(rows)]))
    ours = time.perf_counter() - started
    pad = backend.tokenizer.pad_token_id or 0
    by_turn: dict[int, list[tuple[list[int], int]]] = {}
    for episode in episodes:
        for number, turn in enumerate(turns_of(episode)):
            by_turn.setdefault(number, []).append(turn)
    bare = sum(
        bare_generate(model, [prompt for prompt, _ in these], max(length for _, length in these), pad)
        for these in by_turn.values()
    )
    tools = sum(episode.stats.tool_s for episode in episodes) / rows
    sampled = sum(length for these in by_turn.values() for _, length in these)
    return ours, bare, sampled, tools


def report(name: str, ours: list[float], bare: list[float], tokens: float) -> None:
    ours_s, bare_s = statistics.median(ours), statistics.median(bare)
    print(
        f"{name}: ours {ours_s * 1e3:.0f} ms ({tokens / ours_s:.0f} tokens/s), bare generate() {bare_s * 1e3:.0f} ms "
        f"({tokens / bare_s:.0f} tokens/s); bare / ours {bare_s / ours_s:.2f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups", type=int, default=6, help="repeats of each measurement (the median is shown)")
    parser.add_argument("--new-tokens", type=int, default=48, help="tokens of each single-turn completion")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="rlctl-rollout-sampling-") as work:
        root = Path(work)
        tiny = init_tiny_model(root / "tiny-qwen3")
        primed = tool_lookup.prime_model(output=root / "tiny-qwen3-tool_lookup", base=tiny)
        torch.set_num_threads(args.threads)  # priming sets its own
        backend = local_backend(primed, root / "run")
        model = sampler_copy(backend.model)  # the same model and LoRA adapter, its own copy of the adapter
        try:
            text = backend.tokenizer.apply_chat_template(
                [{"role": "user", "content": "Count from one to twenty in words."}],
                tokenize=False,
                add_generation_prompt=True,
            )
            prompt = backend.tokenizer.encode(text, add_special_tokens=False)
            stop_ids = backend.stop_token_ids
            backend.stop_token_ids = frozenset()  # every row runs to its limit, as the bare side is forced to
            single_turn(backend, model, prompt, args.group_size, 4)  # warm-up of both
            singles = [
                single_turn(backend, model, prompt, args.group_size, args.new_tokens) for _ in range(args.groups)
            ]
            report(
                f"single-turn group ({args.group_size} × {args.new_tokens} tokens, prompt {len(prompt)})",
                [o for o, _ in singles],
                [b for _, b in singles],
                args.group_size * args.new_tokens,
            )
            backend.stop_token_ids = stop_ids
            config = {"tokenizer_name": str(primed), "max_token_length": 1024, "max_turns": 3}
            file = Path(tool_lookup.__file__)
            env = load_tool_env({"tool_env": {"file": str(file), "class_name": "ToolLookupEnv", "config": config}})
            for coalesce in (True, False):
                rng = random.Random(0)  # the same tasks both ways
                groups = [
                    multi_turn(env, backend, model, env.next_task(rng), args.group_size, coalesce)
                    for _ in range(args.groups)
                ]
                tokens = statistics.median(sampled for _, _, sampled, _ in groups)
                how = "first turn as one request of n rows" if coalesce else "every turn its own request"
                report(
                    f"multi-turn tool group ({args.group_size} episodes of tool_lookup, {how}, {tokens:.0f} tokens)",
                    [o for o, _, _, _ in groups],
                    [b for _, b, _, _ in groups],
                    tokens,
                )
            tool_s = statistics.median(t for _, _, _, t in groups)
            print(f"  tool execution per episode {tool_s * 1e3:.2f} ms (in-process `lookup`)")
        finally:
            backend.close()


if __name__ == "__main__":
    main()
