"""The whole dataset loop on the tiny model, through a real `rlctl serve`: collect → score → train offline →
evaluate, with an online run on the same prompts beside it.

    .venv/bin/python benchmarks/dataset_loop.py [--prompts 16] [--samples 8] [--epochs 3] [--eval-samples 8]

The base model is served (`rlctl model serve`, a process) and answers each echo prompt `--samples` times through
POST /collections; the collection is scored with the `echo` reward, a quarter of the prompts are held out, an
offline run trains on the rest, and an evaluation samples the base and the trained checkpoint on the held-out
prompts. Printed: the wall time of each phase and of the whole loop (collect to evaluated); the trainer's
`throughput/tokens_per_s` (trained input tokens over step time, mean over steps) of the offline run next to an
online run's (same group and batch sizes, same prompts), measured in the same service (the baseline: an online
step trains on tokens it sampled, an offline step on stored ones), with each run's mean step breakdown; the
evaluation's wall time for prompts × samples × 2 models and the margin it found (the checkpoint's mean reward
minus the base's, with its 95 % interval).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlctl.trainer.tiny_model import init_tiny_model  # noqa: E402
from tests.support.served_model import echo_collection, served_model  # noqa: E402 - after the repository is on the path


def _datasets_benchmark() -> Any:
    """benchmarks/datasets.py, for its service start and job wait (loaded by path: `datasets` is also a package)."""
    spec = importlib.util.spec_from_file_location("benchmark_datasets", Path(__file__).with_name("datasets.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


_BENCH = _datasets_benchmark()
run_job, start_service, stop_service = _BENCH.run_job, _BENCH.start_service, _BENCH.stop_service


STEP_PARTS = ("time/datum_build_s", "time/forward_backward_s", "time/optimizer_s", "time/publish_s")


def wait_for(client: httpx.Client, path: str, done: set[str]) -> dict[str, Any]:
    while True:
        current = client.get(path).json()
        if current["status"] in done:
            return current
        time.sleep(0.5)


def wait_run(client: httpx.Client, run_id: str) -> dict[str, Any]:
    run = wait_for(client, f"/runs/{run_id}", {"completed", "failed", "stopped"})
    if run["status"] != "completed":
        raise RuntimeError(f"run {run_id} {run['status']}: {run.get('failure')}")
    return run


def step_profile(client: httpx.Client, run_id: str) -> dict[str, float]:
    """Mean over the run's steps of its throughput, trained tokens per batch, and each part of the step time."""
    names = ["throughput/tokens_per_s", "batch/trained_tokens", "time/step_s", *STEP_PARTS]
    series = client.get(f"/runs/{run_id}/metrics", params={"name": names}).json()["metrics"]
    return {name: statistics.fmean(value for _, value in series[name]) for name in names if series.get(name)}


def timed(label: str, times: dict[str, float], action: Any) -> Any:
    started = time.monotonic()
    result = action()
    times[label] = time.monotonic() - started
    return result


def collect(client: httpx.Client, base_url: str, model_dir: Path, prompts: int, samples: int) -> str:
    body = echo_collection(base_url, model_dir, prompts, samples)
    created = client.post("/collections", json=body)
    created.raise_for_status()
    collection = wait_for(client, f"/collections/{created.json()['id']}", {"completed", "failed"})
    if collection["status"] != "completed":
        raise RuntimeError(f"collection failed: {collection['error']}")
    return str(collection["dataset_id"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8, help="collected answers per prompt: the group size")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--eval-samples", type=int, default=8)
    args = parser.parse_args()
    os.environ["RLCTL_LOCAL_TOTAL_STEPS"] = "6"  # the online run's steps
    times: dict[str, float] = {}
    sizes = {"group_size": args.samples, "batch_size": 2 * args.samples}
    with tempfile.TemporaryDirectory() as workdir:
        data_dir = Path(workdir) / "var"
        model_dir = init_tiny_model(data_dir / "models" / "tiny-qwen3", seed=0)  # the local runs' base model
        service = start_service(data_dir)
        try:
            with (
                served_model(str(model_dir), timeout=300) as base_url,
                httpx.Client(base_url=service.base_url, timeout=120) as client,
            ):
                loop_started = time.monotonic()
                collected = timed(
                    "collect", times, lambda: collect(client, base_url, model_dir, args.prompts, args.samples)
                )
                scored = timed(
                    "score",
                    times,
                    lambda: run_job(
                        client, client.post(f"/datasets/{collected}/score", json={"rewards": [{"name": "echo"}]})
                    ),
                )["dataset_id"]
                body = {"dataset": {"id": scored, "held_out": 0.25}, "backend": "local"}
                offline = client.post("/runs", json={**body, "config": {**sizes, "epochs": args.epochs}}).json()
                timed("train offline", times, lambda: wait_run(client, offline["id"]))
                request = {
                    "run_id": offline["id"],
                    "rewards": [{"name": "echo"}],
                    "samples_per_prompt": args.eval_samples,
                    "max_tokens": 8,
                }
                evaluation = client.post("/evaluations", json=request).json()
                result = timed(
                    "evaluate",
                    times,
                    lambda: wait_for(client, f"/evaluations/{evaluation['id']}", {"succeeded", "failed", "cancelled"}),
                )
                times["whole loop"] = time.monotonic() - loop_started
            online_body = {
                "dataset": {"id": scored, "mode": "online", "held_out": 0.25, "rewards": [{"name": "echo"}]},
                "backend": "local",
            }
            with httpx.Client(base_url=service.base_url, timeout=120) as client:
                online = client.post("/runs", json={**online_body, "config": {**sizes, "max_tokens": 8}}).json()
                timed("train online (6 steps)", times, lambda: wait_run(client, online["id"]))
                profiles = {
                    "offline": step_profile(client, offline["id"]),
                    "online": step_profile(client, online["id"]),
                }
        finally:
            stop_service(service)
    print_figures(args, times, offline, profiles, result)
    return 0


def print_figures(
    args: argparse.Namespace,
    times: dict[str, float],
    offline: dict[str, Any],
    profiles: dict[str, dict[str, float]],
    result: dict[str, Any],
) -> None:
    held_out = len(result["prompts"] or [])
    print(f"prompts {args.prompts} (held out {held_out}), {args.samples} collected answers each, epochs {args.epochs}")
    for label, seconds in times.items():
        print(f"  {label:<24} {seconds:8.1f} s")
    offline_tps, online_tps = (profiles[mode]["throughput/tokens_per_s"] for mode in ("offline", "online"))
    print(
        f"  offline steps: {offline['total_steps']}; trained tokens/s offline {offline_tps:,.0f}, "
        f"online {online_tps:,.0f} (ratio {offline_tps / online_tps:.2f})"
    )
    for mode, profile in profiles.items():
        parts = ", ".join(f"{name.split('/')[1]} {profile.get(name, 0.0):.3f}" for name in STEP_PARTS)
        print(
            f"  {mode:<8} mean step {profile.get('time/step_s', 0.0):.3f} s ({parts}); "
            f"trained tokens per batch {profile.get('batch/trained_tokens', 0.0):,.0f}"
        )
    if result["status"] == "succeeded":
        base, trained = result["models"][0], result["models"][1]
        print(
            f"  evaluation: {held_out} prompts x {args.eval_samples} samples x 2 models in {times['evaluate']:.1f} s; "
            f"base {base['mean_reward']:.3f}, {trained['name']} {trained['mean_reward']:.3f}, "
            f"difference {trained['difference']:+.3f} [{trained['interval'][0]:+.3f}, {trained['interval'][1]:+.3f}], "
            f"win rate {trained['win_rate']:.2f}"
        )
    else:
        print(f"  evaluation {result['status']}: {result['error']}")


if __name__ == "__main__":
    raise SystemExit(main())
