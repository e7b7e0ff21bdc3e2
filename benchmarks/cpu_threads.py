"""One training forward and backward pass of the tiny model on the CPU, with torch using 1 thread and all of them.

    .venv/bin/python benchmarks/cpu_threads.py [--reps 8] [--batch 16] [--tokens 20]

Why the trainer gives training and sampling half the cores each (`rlctl.trainer.loop.split_cpu_threads`, one thread
each on 2 cores): on a shared machine, an operator split over several threads waits at its end for the slowest
one, and a thread that lost its core makes every operator wait. Printed: the median and worst pass time with each
thread count, alternated (1, all, 1, all) so both see the same load, their ratio, and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlctl.trainer.tiny_model import init_tiny_model  # noqa: E402


def pass_times(model: torch.nn.Module, ids: torch.Tensor, reps: int) -> list[float]:
    def one_pass() -> None:
        model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()

    one_pass()  # warm-up
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        one_pass()
        times.append(time.perf_counter() - started)
    return times


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=20)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    all_threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as workdir:
        model = AutoModelForCausalLM.from_pretrained(str(init_tiny_model(Path(workdir) / "tiny", seed=0)))
    ids = torch.randint(0, min(1000, model.config.vocab_size), (args.batch, args.tokens))
    figures: dict[int, list[float]] = {1: [], all_threads: []}
    for threads in (1, all_threads, 1, all_threads):
        torch.set_num_threads(threads)
        figures[threads] += pass_times(model, ids, args.reps)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {args.batch} x {args.tokens} tokens")
    for threads, times in figures.items():
        median, worst = statistics.median(times) * 1000, max(times) * 1000
        print(f"  {threads} thread(s): median {median:6.0f} ms, worst {worst:6.0f} ms")
    ratio = statistics.median(figures[all_threads]) / statistics.median(figures[1])
    print(f"  {all_threads} threads / 1 thread: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
