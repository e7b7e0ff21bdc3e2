"""The dataset loop on the tiny model, through a real `rlctl serve`: score → train offline → evaluate, with an online
run on the same prompts beside it.

    .venv/bin/python benchmarks/dataset_loop.py [--prompts 24] [--epochs 4] [--samples 4]

Echo prompts with four stored replies each (the digits themselves, half of them, a quarter, none) are uploaded and
scored with the `echo` reward; a quarter of the prompts are held out. Printed: the wall time of each phase and of
the whole loop; the trainer's `throughput/tokens_per_s` (trained input tokens over step time, mean over steps) of
the offline run next to the online run's, measured in the same service (the baseline: an online step also samples,
an offline step only trains); the evaluation's wall time for prompts × samples × 2 models and the margin it found
(the checkpoint's mean reward minus the base's, with its 95 % interval).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


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


def echo_records(prompts: int) -> str:
    lines = []
    for p in range(prompts):
        digits = f"{(7919 * (p + 3)) % 10000:04d}"
        for reply in (digits, digits[:2] + "ab", "a" + digits[2:] + "c", "wxyz"):
            turns = [{"from": "human", "value": f"Echo: {digits}"}, {"from": "gpt", "value": reply}]
            lines.append(json.dumps({"conversations": turns, "answer": digits}))
    return "\n".join(lines) + "\n"


def wait_run(client: httpx.Client, run_id: str) -> dict[str, Any]:
    while True:
        run = client.get(f"/runs/{run_id}").json()
        if run["status"] in ("completed", "failed", "stopped"):
            if run["status"] != "completed":
                raise RuntimeError(f"run {run_id} {run['status']}: {run.get('failure')}")
            return run
        time.sleep(0.5)


def throughput(client: httpx.Client, run_id: str) -> float:
    series = client.get(f"/runs/{run_id}/metrics", params={"name": "throughput/tokens_per_s"}).json()["metrics"]
    return statistics.fmean(value for _, value in series["throughput/tokens_per_s"])


def timed(label: str, times: dict[str, float], action: Any) -> Any:
    started = time.monotonic()
    result = action()
    times[label] = time.monotonic() - started
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    args = parser.parse_args()
    os.environ["RLCTL_LOCAL_TOTAL_STEPS"] = "6"  # the online run's steps
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as workdir:
        service = start_service(Path(workdir) / "var")
        try:
            with httpx.Client(base_url=service.base_url, timeout=120) as client:
                loop_started = time.monotonic()
                uploaded = timed(
                    "upload",
                    times,
                    lambda: client.post("/datasets", params={"name": "echo"}, content=echo_records(args.prompts)),
                ).json()
                scored = timed(
                    "score",
                    times,
                    lambda: run_job(
                        client, client.post(f"/datasets/{uploaded['id']}/score", json={"rewards": [{"name": "echo"}]})
                    ),
                )["dataset_id"]
                body = {"dataset": {"id": scored, "held_out": 0.25}, "backend": "local"}
                offline = client.post(
                    "/runs", json={**body, "config": {"group_size": 4, "batch_size": 16, "epochs": args.epochs}}
                ).json()
                timed("train offline", times, lambda: wait_run(client, offline["id"]))
                request = {
                    "run_id": offline["id"],
                    "rewards": [{"name": "echo"}],
                    "samples_per_prompt": args.samples,
                    "max_tokens": 8,
                }
                evaluation = client.post("/evaluations", json=request).json()

                def finished() -> dict[str, Any]:
                    while True:
                        current = client.get(f"/evaluations/{evaluation['id']}").json()
                        if current["status"] in ("succeeded", "failed", "cancelled"):
                            return current
                        time.sleep(0.5)

                result = timed("evaluate", times, finished)
                times["whole loop"] = time.monotonic() - loop_started
                online_body = {
                    "dataset": {"id": scored, "mode": "online", "held_out": 0.25, "rewards": [{"name": "echo"}]},
                    "backend": "local",
                }
                online = client.post(
                    "/runs", json={**online_body, "config": {"group_size": 4, "batch_size": 16, "max_tokens": 8}}
                ).json()
                timed("train online (6 steps)", times, lambda: wait_run(client, online["id"]))
                offline_tps, online_tps = throughput(client, offline["id"]), throughput(client, online["id"])
        finally:
            stop_service(service)
    held_out = len(result["prompts"] or [])
    print(f"prompts {args.prompts} (held out {held_out}), 4 stored replies each, epochs {args.epochs}")
    for label, seconds in times.items():
        print(f"  {label:<24} {seconds:8.1f} s")
    print(
        f"  offline steps: {offline['total_steps']}; trained tokens/s offline {offline_tps:,.0f}, "
        f"online {online_tps:,.0f} (ratio {offline_tps / online_tps:.2f})"
    )
    if result["status"] == "succeeded":
        base, trained = result["models"][0], result["models"][1]
        print(
            f"  evaluation: {held_out} prompts x {args.samples} samples x 2 models; base {base['mean_reward']:.3f}, "
            f"{trained['name']} {trained['mean_reward']:.3f}, difference {trained['difference']:+.3f} "
            f"[{trained['interval'][0]:+.3f}, {trained['interval'][1]:+.3f}], win rate {trained['win_rate']:.2f}"
        )
    else:
        print(f"  evaluation {result['status']}: {result['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
