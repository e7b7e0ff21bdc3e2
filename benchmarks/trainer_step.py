"""Step-time breakdown of the trainer on the local backend with the tiny model.

    .venv/bin/python benchmarks/trainer_step.py [--steps 30] [--warmup 3] [--device cpu]

Each step: rollouts are sampled from the current weights (the environment's part, timed apart) and posted to
a real `run-api`; then the trainer's part is timed phase by phase: waiting for the batch (`GET /batch`),
datum build, forward/backward, optimiser, weight publish. Publishing shares the model in-process with the
inference server, so it must stay a small fraction of a step (under 10%); the ratio is printed.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlctl.supervisor.ports import free_ports  # noqa: E402
from rlctl.trainer.atropos import AtroposClient, Registration  # noqa: E402
from rlctl.trainer.backends.base import SamplingRequest, TrainingBackend  # noqa: E402
from rlctl.trainer.backends.local import LocalBackend  # noqa: E402
from rlctl.trainer.config import parse_config  # noqa: E402
from rlctl.trainer.loop import StepTimings, train_on_batch  # noqa: E402
from rlctl.trainer.tiny_model import init_tiny_model  # noqa: E402

PHASES = ("wait_for_batch_s", "datum_build_s", "forward_backward_s", "optimizer_s", "publish_s")


def start_api(port: int) -> subprocess.Popen:
    run_api = Path(sys.executable).parent / "run-api"
    process = subprocess.Popen(
        [str(run_api), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/status", timeout=1).raise_for_status()
            return process
        except httpx.HTTPError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("run-api did not start") from None
            time.sleep(0.1)


def stop_api(process: subprocess.Popen) -> None:
    for signum, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, signum)
            process.wait(timeout=wait_s)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def echo_groups(backend: TrainingBackend, rng: random.Random, groups: int, group_size: int, new_tokens: int):
    """Rollouts as the echo environment makes them: digits asked for, share of digits as the score."""
    tokenizer = backend.tokenizer
    batch = []
    for _ in range(groups):
        target = "".join(rng.choice("0123456789") for _ in range(4))
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Echo: {target}"}], tokenize=False, add_generation_prompt=True
        )
        prompt = tokenizer.encode(text, add_special_tokens=False)
        completions = backend.sample(SamplingRequest(prompt, n=group_size, max_new_tokens=new_tokens))
        batch.append(
            {
                "tokens": [prompt + c.tokens for c in completions],
                "masks": [[-100] * len(prompt) + c.tokens for c in completions],
                "scores": [sum(tokenizer.decode([t]).isdigit() for t in c.tokens) / new_tokens for c in completions],
                "inference_logprobs": [[1.0] * len(prompt) + c.logprobs for c in completions],
            }
        )
    return batch


@dataclass
class StepFigures:
    """Per-step timings of the measured steps (after warm-up), and the rollout sampling time of each step."""

    timings: list[StepTimings]
    rollout_s: list[float]
    rewards: list[float]

    def mean_s(self, phase: str) -> float:
        return statistics.mean(getattr(t, phase) for t in self.timings)

    @property
    def step_s(self) -> float:
        return sum(self.mean_s(phase) for phase in PHASES)


def run_steps(backend: TrainingBackend, args: argparse.Namespace, workdir: Path) -> StepFigures:
    """Warm-up plus measured GRPO steps of `backend` against a real `run-api`, rollouts sampled from it."""
    api_port = free_ports(1)[0]
    api_url = f"http://127.0.0.1:{api_port}"
    batch_size = args.groups * args.group_size
    api = start_api(api_port)
    figures = StepFigures([], [], [])
    backend.publish_weights(0)  # as the trainer does at start: a remote backend samples only published weights
    try:
        client = AtroposClient(api_url)
        client.register(Registration("bench", "bench", batch_size, 4096, str(workdir), 1000, 0, args.steps))
        rng = random.Random(0)
        for step in range(1, args.warmup + args.steps + 1):
            started = time.perf_counter()
            for group in echo_groups(backend, rng, args.groups, args.group_size, args.new_tokens):
                httpx.post(f"{api_url}/scored_data", json=group).raise_for_status()
            rollout_s = time.perf_counter() - started
            timings = StepTimings()
            started = time.perf_counter()
            groups = None
            while not groups:
                groups = client.get_batch()
            timings.wait_for_batch_s = time.perf_counter() - started
            report = train_on_batch(backend, groups, step, args.learning_rate, 1024, timings)
            figures.rewards.append(report.metrics["reward/mean"])
            if step > args.warmup:
                figures.timings.append(timings)
                figures.rollout_s.append(rollout_s)
    finally:
        stop_api(api)
    return figures


def add_step_arguments(parser: argparse.ArgumentParser, steps: int, warmup: int = 3) -> None:
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=1e-2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(parser, steps=30)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="rlctl-bench-"))
    model_dir = init_tiny_model(workdir / "tiny-qwen3")
    config = parse_config(
        {
            "env": {"rollout_server_url": "http://127.0.0.1:1"},
            "tinker": {
                "base_model": str(model_dir),
                "run_dir": str(workdir / "run"),
                "inference_port": free_ports(1)[0],
                "device": args.device,
                "learning_rate": args.learning_rate,
            },
        }
    )
    figures = run_steps(LocalBackend(config), args, workdir)

    print(
        "trainer step breakdown, local backend, tiny Qwen3 (2 layers, 64 wide), "
        f"LoRA rank {config.lora_rank} on attention+MLP+lm_head, {args.groups} groups x {args.group_size} "
        f"rollouts x {args.new_tokens} new tokens, {args.steps} steps after {args.warmup} warm-up, "
        f"torch threads {torch.get_num_threads()}"
    )
    means = {phase: figures.mean_s(phase) for phase in PHASES}
    total = figures.step_s
    for phase in PHASES:
        print(f"  {phase.removesuffix('_s'):<20} {means[phase] * 1000:8.2f} ms  {means[phase] / total:6.1%}")
    compute = total - means["wait_for_batch_s"]
    print(f"  {'step total':<20} {total * 1000:8.2f} ms")
    print(f"steps/s (trainer, incl. waiting for the batch): {1 / total:.2f}")
    print(f"steps/s (trainer compute only): {1 / compute:.2f}")
    rollout_ms = statistics.mean(figures.rollout_s) * 1000
    print(f"rollout sampling per step (environment side, not in the step): {rollout_ms:.1f} ms")
    ratio = means["publish_s"] / total
    verdict = "OK" if ratio < 0.10 else "TOO SLOW"
    print(f"publish / step time: {ratio:.2%} ({verdict}: must stay under 10%, no base-model reload)")
    quarter = max(1, len(figures.rewards) // 4)
    first, last = statistics.mean(figures.rewards[:quarter]), statistics.mean(figures.rewards[-quarter:])
    print(f"mean reward first quarter {first:.3f}, last quarter {last:.3f}")


if __name__ == "__main__":
    main()
