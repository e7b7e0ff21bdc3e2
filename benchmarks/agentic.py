"""Online multi-turn tool training on the tiny model: `run-api`, the trainer (local backend) and
`environments/tool_lookup.py` (a pure-Python tool) or, with `--environment file_lookup`, `environments/file_lookup.py`
(the collections' sandboxed `read_file`, one kept sandbox per episode), real processes wired by one run YAML, as
tests/trainer/test_agentic_pipeline.py runs them.

    .venv/bin/python benchmarks/agentic.py [--environment tool_lookup|file_lookup] [--steps 24] [--group-size 8]
        [--batch-size 32] [--calls 50]

Printed: the reward curve (mean reward per step, and first quarter → last quarter); tool calls, failed calls and
turns per episode (the environment's `agent/...` metrics); rollout turns per second (replies sampled over the wall
time the trainer waited for batches); the share of the run's wall time spent training (the trainer's step time)
against waiting for rollouts, and inside the rollouts the share of episode time spent sampling against running
tools; then one tool call in-process (`lookup`, a Python function) against the same answer from the sandboxed
shell (`terminal`, bubblewrap), per call, measured in this process (the baseline: the in-process call): in the
episode's kept sandbox (`SandboxTools`, as a tool environment runs it) and in a sandbox started for the call
alone; and what one sandboxed call per episode would be of an episode's wall time, against the run's sampling time
per episode (issue 40's goal: at most 10 %).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from environments import file_lookup, tool_lookup  # noqa: E402 - after the repository is on the path
from environments.tool_lookup import lookup_tool  # noqa: E402
from rlctl.environment_kit.tool_env import EpisodeToolbox, SandboxTools  # noqa: E402
from rlctl.sandbox.bubblewrap import find_sandbox  # noqa: E402
from rlctl.trainer.tiny_model import init_tiny_model  # noqa: E402
from tests.support.live import free_port  # noqa: E402
from tests.trainer.pipeline import (  # noqa: E402
    env_metrics_of,
    metrics_environment,
    processes,
    start_api,
    start_environment,
    start_trainer,
    step_metrics,
    wait_http,
    write_run_yaml,
)

PRIMERS = {"tool_lookup": tool_lookup.prime_model, "file_lookup": file_lookup.prime_model}


def run(
    work: Path, environment: str, steps: int, group_size: int, batch_size: int
) -> tuple[list[dict], list[dict], float]:
    """The run's step records, the environment's metric records, and its wall time from the first step's start."""
    tiny = init_tiny_model(work / "tiny-qwen3")
    started = time.perf_counter()
    primed = PRIMERS[environment](output=work / f"tiny-qwen3-{environment}", base=tiny)
    print(f"priming: {time.perf_counter() - started:.1f} s")
    api_port, inference_port = free_port(), free_port()
    run_dir = work / "run"
    config = write_run_yaml(
        run_dir,
        model_dir=primed,
        api_port=api_port,
        inference_port=inference_port,
        total_steps=steps,
        group_size=group_size,
        batch_size=batch_size,
        env={
            "max_token_length": 1024,
            "max_turns": 3,
            "eval_items": 0,
            "steps_per_eval": 100000,
            "seed": 0,
            "max_batches_offpolicy": 1,
        },
        tinker={"save_checkpoint_interval": 100000, "learning_rate": 5e-3, "max_token_trainer_length": 1536},
    )
    served = metrics_environment(work / "var", run_dir)
    with processes() as start:
        start_api(start, run_dir, api_port, served)
        trainer = start_trainer(start, config, served)
        wait_http(f"http://127.0.0.1:{inference_port}/health", trainer, 180)
        start_environment(start, f"{environment}.py", config, served)
        started = time.perf_counter()
        if trainer.wait(3600) != 0:
            raise SystemExit(f"the trainer failed:\n{trainer.log_tail()}")
        wall = time.perf_counter() - started
    return step_metrics(run_dir), env_metrics_of(run_dir), wall


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def report_run(records: list[dict], logged: list[dict], wall: float, batch_size: int) -> float:
    """Prints the run's figures; returns the mean sampling time of an episode."""
    rewards = [record["metrics"]["reward/mean"] for record in records]
    print("reward per step: " + " ".join(f"{value:.2f}" for value in rewards))
    quarter = max(1, len(rewards) // 4)
    first, last = mean(rewards[:quarter]), mean(rewards[-quarter:])
    print(f"reward first quarter {first:.3f} → last quarter {last:.3f} ({last - first:+.3f})")
    agent = [metrics for metrics in logged if "agent/turns_per_episode" in metrics]
    for name in ("tool_calls_per_episode", "failed_calls_per_episode", "turns_per_episode", "truncated_share"):
        values = [metrics[f"agent/{name}"] for metrics in agent]
        if values:
            print(f"{name}: first log {values[0]:.2f}, last {values[-1]:.2f}, mean {mean(values):.2f}")
    training = sum(record["metrics"]["time/step_s"] for record in records)
    waiting = sum(record["metrics"]["time/wait_for_batch_s"] for record in records)
    turns = mean([metrics["agent/turns_per_episode"] for metrics in agent]) * batch_size * len(records)
    print(f"run wall time {wall:.1f} s for {len(records)} steps ({wall / max(1, len(records)):.2f} s a step)")
    print(
        f"rollout turns per second: {turns / waiting if waiting else 0.0:.1f} "
        f"({turns:.0f} turns, {waiting:.1f} s waited)"
    )
    print(f"share of wall time: training {training / wall:.1%}, waiting for rollouts {waiting / wall:.1%}")
    sampling = sum(metrics["agent/sampling_s_per_episode"] for metrics in agent)
    tools = sum(metrics["agent/tool_s_per_episode"] for metrics in agent)
    if sampling + tools > 0:
        episode_s = sampling + tools
        print(f"inside episodes: sampling {sampling / episode_s:.2%}, tool execution {tools / episode_s:.3%}")
    return sampling / len(agent) if agent else 0.0


def report_tool_calls(calls: int, sampling_s: float) -> None:
    in_process = lookup_tool("code", "7")
    started = time.perf_counter()
    for _ in range(calls):
        asyncio.run(in_process({"key": "code"}))
    python_s = (time.perf_counter() - started) / calls
    print(f"tool call in-process (lookup): {python_s * 1e3:.3f} ms (baseline)")
    found = find_sandbox("bwrap", 65534)
    if isinstance(found, str):
        print(f"sandboxed tool call: not measured ({found})")
        return
    rounds = max(1, calls // 5)
    with tempfile.TemporaryDirectory() as scratch:
        kept_s = asyncio.run(_sandboxed_calls(Path(scratch), rounds, kept=True))
        fresh_s = asyncio.run(_sandboxed_calls(Path(scratch), rounds, kept=False))
    print(f"tool call sandboxed (terminal `echo 7`), the episode's kept sandbox: {kept_s * 1e3:.1f} ms")
    print(f"  a sandbox started for the call alone: {fresh_s * 1e3:.1f} ms ({fresh_s / kept_s:.2f}× kept)")
    if sampling_s:
        share = kept_s / (sampling_s + kept_s)
        print(f"  one kept-sandbox call in an episode of {sampling_s:.3f} s sampling: {share:.1%} of its wall time")


async def _sandboxed_calls(scratch: Path, rounds: int, kept: bool) -> float:
    """Seconds per `terminal` call: `rounds` calls in one episode's sandbox, or each in a new one (made and ended
    around the call)."""
    tools = SandboxTools(names=("terminal",))
    started = time.perf_counter()
    toolbox = None
    for index in range(rounds):
        if toolbox is None or not kept:
            if toolbox is not None:
                await toolbox.close()
            toolbox = EpisodeToolbox(tools, scratch / f"episode-{index}")
        await toolbox.bound()["terminal"]({"command": "echo 7"})
    if toolbox is not None:
        await toolbox.close()
    return (time.perf_counter() - started) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--environment", choices=sorted(PRIMERS), default="tool_lookup")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--calls", type=int, default=50, help="tool calls timed in-process (a fifth sandboxed)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlctl-agentic-") as work:
        records, logged, wall = run(Path(work), args.environment, args.steps, args.group_size, args.batch_size)
        sampling_s = report_run(records, logged, wall, args.batch_size)
    report_tool_calls(args.calls, sampling_s)


if __name__ == "__main__":
    main()
