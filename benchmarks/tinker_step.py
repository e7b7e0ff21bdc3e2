"""Step time of the `tinker` backend against a Tinker-protocol server with network latency.

    .venv/bin/python benchmarks/tinker_step.py [--steps 20] [--latency-ms 50]

The server is the loopback stand-in of the tests (tests/trainer/tinker_loopback.py) with `--latency-ms` added to
every request; the client is the real `tinker` SDK through rlctl's backend. A step is forward_backward, optim_step,
then publishing the weights for sampling. Measured in the same run, steps alternating:
- one call at a time, each waiting for the one before (the base backend's `train_step`: rlctl before pipelining);
- pipelined (the tinker backend's `train_step`): all three sent, then their results awaited, as tinker-cookbook
  sends forward_backward and optim_step before waiting.
Prints each one's median and mean step time and their ratio.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlctl.supervisor.ports import free_ports  # noqa: E402
from rlctl.trainer.backends.base import TrainingBackend  # noqa: E402
from rlctl.trainer.backends.tinker_backend import TinkerBackend  # noqa: E402
from rlctl.trainer.config import parse_config  # noqa: E402
from rlctl.trainer.grpo import TrainingDatum, prepare_batch  # noqa: E402
from rlctl.trainer.tiny_model import init_tiny_model  # noqa: E402
from tests.trainer.tinker_loopback import LoopbackServer, LoopbackTinker  # noqa: E402

GROUP_SIZE, GROUPS = 8, 4


def scored_groups(rng: random.Random) -> list[dict]:
    groups = []
    for _ in range(GROUPS):
        prompt = [1] + [rng.randrange(5, 100) for _ in range(8)]
        completions = [[rng.randrange(5, 100) for _ in range(8)] for _ in range(GROUP_SIZE)]
        groups.append(
            {
                "tokens": [prompt + c for c in completions],
                "masks": [[-100] * len(prompt) + c for c in completions],
                "scores": [rng.random() for _ in range(GROUP_SIZE)],
                "inference_logprobs": [[1.0] * len(prompt) + [-rng.uniform(1, 6) for _ in c] for c in completions],
            }
        )
    return groups


def timed(step: Callable[[], object]) -> float:
    started = time.perf_counter()
    step()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="measured steps of each kind")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="rlctl-bench-"))
    model_dir = init_tiny_model(workdir / "tiny-qwen3")  # for its tokenizer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    service = LoopbackTinker(
        vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id, latency_s=args.latency_ms / 1000
    )
    with LoopbackServer(service, free_ports(1)[0]) as server:
        os.environ.update(TINKER_BASE_URL=server.url, TINKER_API_KEY="tml-loopback")
        config = parse_config(
            {
                "env": {"rollout_server_url": "http://127.0.0.1:1", "tokenizer_name": str(model_dir)},
                "tinker": {
                    "backend": "tinker",
                    "base_model": "Qwen/Qwen3-8B",
                    "run_dir": str(workdir / "run"),
                    "inference_port": free_ports(1)[0],
                    "learning_rate": 0.01,
                },
            }
        )
        backend = TinkerBackend(config)
        try:
            backend.publish_weights(0)
            data: list[TrainingDatum] = prepare_batch(scored_groups(random.Random(0)), 1024).data
            sequential: list[float] = []
            pipelined: list[float] = []
            for step in range(1, 2 * (args.warmup + args.steps) + 1, 2):
                one_by_one = timed(lambda s=step: TrainingBackend.train_step(backend, data, 0.01, s))
                overlapped = timed(lambda s=step: backend.train_step(data, 0.01, s + 1))
                if step > 2 * args.warmup:
                    sequential.append(one_by_one)
                    pipelined.append(overlapped)
        finally:
            backend.close()

    print(
        f"tinker backend step (forward_backward + optim_step + publish) against the loopback Tinker server, "
        f"{args.latency_ms:.0f} ms added per request, {len(data)} datums, {args.steps} steps of each after "
        f"{args.warmup} warm-up, alternating"
    )
    for label, times in (("one call at a time", sequential), ("pipelined", pipelined)):
        median_ms, mean_ms = statistics.median(times) * 1000, statistics.mean(times) * 1000
        print(f"  {label:<20} median {median_ms:7.1f} ms   mean {mean_ms:7.1f} ms")
    ratio = statistics.median(pipelined) / statistics.median(sequential)
    print(f"pipelined / one call at a time (median): {ratio:.2f}")


if __name__ == "__main__":
    main()
