"""The local backend's training pass against the machine's limit: a bare forward/backward of the same model, adapter
and batch.

    .venv/bin/python benchmarks/train_step_limit.py [--groups 4] [--group-size 8] [--prompt-tokens 24]
        [--completion-tokens 8] [--repeats 15] [--threads 1]

One process, the tiny model with the local backend's LoRA adapter, torch at `--threads` intra-op threads (1: what
the trainer gives training on two cores). A batch as a single-turn step trains it: `--groups` × `--group-size`
sequences of a prompt and a completion, advantages on the completion tokens. Measured alternately, each
`--repeats` times, the median shown:

- **ours**: `LocalBackend.forward_backward` as the trainer calls it on nine steps in ten (micro-batches, the clipped
  PPO objective, the step's statistics);
- **ours + KL metric**: the same on the tenth step, where `kl/reference` adds its reference pass (a forward of the
  batch with the adapter off; every step with a KL penalty);
- **bare**: one padded forward of the same model and adapter on the same batch, the log-probabilities of the
  targets, `-(logprob × advantage).sum()`, backward: what any trainer must at least do.

Printed: the times, their ratios to bare (issue 40's goal for ours: at most 1.1) and the mean ratio over a cycle of
`KL_METRIC_EVERY` steps. The load average is printed: a busy machine slows all alike.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.rollout_sampling import local_backend  # noqa: E402 - after the repository is on the path
from rlctl.trainer.backends.local import KL_METRIC_EVERY, LocalBackend  # noqa: E402
from rlctl.trainer.grpo import TrainingDatum  # noqa: E402
from rlctl.trainer.tiny_model import init_tiny_model  # noqa: E402


def batch(rows: int, prompt_tokens: int, completion_tokens: int, vocabulary: int, seed: int) -> list[TrainingDatum]:
    rng = random.Random(seed)
    data = []
    for row in range(rows):
        tokens = [rng.randrange(vocabulary) for _ in range(prompt_tokens + completion_tokens)]
        advantage = 1.0 if row % 2 else -1.0
        completion = [False] * (prompt_tokens - 1) + [True] * completion_tokens
        data.append(
            TrainingDatum(
                input_tokens=tokens[:-1],
                target_tokens=tokens[1:],
                advantages=[advantage if done else 0.0 for done in completion],
                completion_mask=completion,
                sampler_logprobs=[-5.0] * len(completion),
            )
        )
    return data


def ours(backend: LocalBackend, data: list[TrainingDatum], reference_metric: bool = False) -> float:
    started = time.perf_counter()
    backend.forward_backward(data, reference_metric=reference_metric)
    seconds = time.perf_counter() - started
    backend.discard_gradients()
    return seconds


def bare(model: torch.nn.Module, data: list[TrainingDatum]) -> float:
    """One padded forward and backward of the batch (all rows the same length here: no padding)."""
    inputs = torch.tensor([d.input_tokens for d in data])
    targets = torch.tensor([d.target_tokens for d in data])
    advantages = torch.tensor([d.advantages for d in data])
    started = time.perf_counter()
    logits = model(input_ids=inputs).logits
    logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    (-(logprobs * advantages).sum()).backward()
    seconds = time.perf_counter() - started
    model.zero_grad(set_to_none=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=24)
    parser.add_argument("--completion-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="rlctl-train-step-") as work:
        root = Path(work)
        backend = local_backend(init_tiny_model(root / "tiny-qwen3"), root / "run")
        try:
            torch.set_num_threads(args.threads)
            rows = args.groups * args.group_size
            vocabulary = int(backend.model.config.vocab_size)
            data = batch(rows, args.prompt_tokens, args.completion_tokens, vocabulary, seed=0)
            print(
                f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f}; {rows} sequences of "
                f"{args.prompt_tokens} + {args.completion_tokens} tokens",
                flush=True,
            )
            ours(backend, data, reference_metric=True), bare(backend.model, data)  # warm-up of both
            times: dict[str, list[float]] = {"ours": [], "kl": [], "bare": []}
            for _ in range(args.repeats):  # alternated: all see the same neighbours
                times["ours"].append(ours(backend, data))
                times["kl"].append(ours(backend, data, reference_metric=True))
                times["bare"].append(bare(backend.model, data))
            ours_s, kl_s, bare_s = (statistics.median(times[name]) for name in ("ours", "kl", "bare"))
            mean_s = ((KL_METRIC_EVERY - 1) * ours_s + kl_s) / KL_METRIC_EVERY
            print(
                f"forward/backward: ours {ours_s * 1e3:.1f} ms, with the KL metric {kl_s * 1e3:.1f} ms, bare "
                f"{bare_s * 1e3:.1f} ms; ours / bare {ours_s / bare_s:.2f} (goal <= 1.1), with the KL metric "
                f"{kl_s / bare_s:.2f}, mean over {KL_METRIC_EVERY} steps {mean_s / bare_s:.2f}"
            )
        finally:
            backend.close()


if __name__ == "__main__":
    main()
