"""Wall time of an inference test with its models run together, against each model alone and one after another.

    .venv/bin/python benchmarks/inference_tests.py [--environment gsm8k] [--steps 3] [--group-size 16]
        [--max-new-tokens 64] [--repeats 2] [--added-latency-s 0] [--endpoint-threads -1]

The endpoint is the trainer's inference server on the tiny local model, on loopback, answering to three model names,
sampling with the intra-op threads a run's trainer gives its sampler (half of torch's default,
`rlctl.trainer.loop.split_cpu_threads`: one on 2 cores, leaving the other to the models' processes);
`--endpoint-threads N` sets N instead (0: torch's default, every core). Each mode runs the same test through the
service layer (one child
process per model, the environment's own `process` mode). Printed: the wall time of each run (job start to end),
per-model latency, and the ratios together / slowest alone (the goal: at most 1.2) and sequential / together.
`--added-latency-s` puts a loopback front server before the inference server that delays every request, as a remote
endpoint's round trip would (the tiny model itself answers in milliseconds, so without it the runs are bound by this
machine's CPU, not by waiting). Nothing is downloaded: the tiny model is built locally, GSM8K problems come from the
excerpt in tests/data/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlctl.service.app import register_job_kinds  # noqa: E402
from rlctl.service.db import migrate  # noqa: E402
from rlctl.service.inference_tests.schemas import CreateInferenceTestRequest  # noqa: E402
from rlctl.service.inference_tests.service import get_inference_test, start_inference_test  # noqa: E402
from rlctl.service.jobs.runner import JobRunner  # noqa: E402
from rlctl.service.settings import Settings  # noqa: E402
from rlctl.service.startup import build_app_context  # noqa: E402
from rlctl.trainer.loop import split_cpu_threads  # noqa: E402
from rlctl.trainer.tiny_model import init_tiny_model  # noqa: E402
from tests.conftest import TEST_DATA  # noqa: E402
from tests.support.endpoints import fault_endpoint, tiny_model_endpoint  # noqa: E402

MODELS = ["bench/model-a", "bench/model-b", "bench/model-c"]


def run_once(
    root: Path, label: str, concurrency: int, endpoint: str, model_dir: Path, args: Any, models: list[str] = MODELS
) -> dict[str, Any]:
    data_dir = root / label
    settings = Settings(
        _env_file=None,
        data_dir=data_dir,
        tokenizer_name=str(model_dir),
        gsm8k_path=TEST_DATA / "gsm8k",
        inference_test_concurrency=concurrency,
    )
    ctx = build_app_context(settings)
    jobs = JobRunner(ctx, workers=1)
    ctx.provide(jobs)
    register_job_kinds(jobs)
    migrate.upgrade(ctx.db)
    jobs.open()
    try:
        config = {"max_new_tokens": args.max_new_tokens} if args.environment == "gsm8k" else {}
        request = CreateInferenceTestRequest(
            environment=args.environment,
            num_steps=args.steps,
            group_size=args.group_size,
            models=models,
            base_url=endpoint,
            config=config,
            timeout_s=3600,
        )
        test_id = start_inference_test(ctx, request).id
        jobs.wait(test_id, timeout=7200)
        test = get_inference_test(ctx, test_id).model_dump()
    finally:
        jobs.close()
        ctx.db.dispose()
    if test["status"] != "succeeded" or test["result"]["summary"]["models_succeeded"] != len(models):
        raise SystemExit(f"{label}: the test did not succeed: {test['error'] or test['result']}")
    wall_s = (test["finished_at"] - test["started_at"]).total_seconds()
    latencies = {r["model"]: r["latency"] for r in test["result"]["models_tested"]}
    completions = sum(r["total_completions"] for r in test["result"]["models_tested"])
    print(f"{label:>22}: {wall_s:7.2f} s wall, {completions} completions", flush=True)
    for model, latency in latencies.items():
        print(f"{'':>24}{model}: p50 {latency['p50_s']:.3f} s, p95 {latency['p95_s']:.3f} s per completion")
    return {"wall_s": wall_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--environment", default="gsm8k", choices=["gsm8k", "echo"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64, help="gsm8k's completion length")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--added-latency-s", type=float, default=0.0, help="delay added to every request")
    parser.add_argument(
        "--endpoint-threads", type=int, default=-1, help="the endpoint's torch threads (-1: a run's; 0: torch's)"
    )
    args = parser.parse_args()
    if args.endpoint_threads < 0:
        split_cpu_threads()  # the endpoint samples in this process; the models' processes are forked apart
    elif args.endpoint_threads > 0:
        torch.set_num_threads(args.endpoint_threads)

    with tempfile.TemporaryDirectory(prefix="rlctl-bench-inference-") as tmp:
        root = Path(tmp)
        model_dir = init_tiny_model(root / "tiny-qwen3", seed=0)
        with (
            tiny_model_endpoint(model_dir, root / "endpoint", MODELS) as model_endpoint,
            fault_endpoint(model_endpoint, args.added_latency_s) as delayed_endpoint,
        ):
            endpoint = delayed_endpoint if args.added_latency_s else model_endpoint
            print(
                f"{args.environment}: {len(MODELS)} models x {args.steps} steps x {args.group_size} completions "
                f"on the tiny model at {endpoint} ({torch.get_num_threads()} torch threads), "
                f"{args.added_latency_s:g} s added per request",
                flush=True,
            )
            sequential, concurrent, slowest_alone = [], [], []
            for repeat in range(args.repeats):
                alone = [
                    run_once(root, f"alone-{model.rsplit('-', 1)[-1]}-{repeat}", 1, endpoint, model_dir, args, [model])
                    for model in MODELS
                ]
                slowest_alone.append(max(run["wall_s"] for run in alone))
                concurrent.append(run_once(root, f"together-{repeat}", 3, endpoint, model_dir, args)["wall_s"])
                sequential.append(run_once(root, f"sequential-{repeat}", 1, endpoint, model_dir, args)["wall_s"])
    seq, con, alone_s = statistics.median(sequential), statistics.median(concurrent), statistics.median(slowest_alone)
    print(
        f"median wall time: slowest model alone {alone_s:.2f} s, together {con:.2f} s, sequential {seq:.2f} s; "
        f"together / slowest alone {con / alone_s:.2f}x (goal <= 1.2), sequential / together {seq / con:.2f}x"
    )
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
