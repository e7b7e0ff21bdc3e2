"""Sampling beside training on the local backend, with the sampler on a thread and in a process of its own.

    .venv/bin/python benchmarks/sampler_overlap.py [--seconds 6] [--rounds 2]

One process, the tiny model, torch at one thread (as the trainer sets it on 2 cores). Four callers keep
sampling groups (8 completions of 8 tokens, as the echo environment asks); the main thread trains steps of 32
completions (forward/backward, optimiser, publish). For each sampler (`tinker.sampler`: thread, then process,
alternated `--rounds` times so both see the same neighbours), printed: groups/s sampling alone, steps/s training
alone, both while together, and the `overlap`: together's share of each alone, summed (1.0: they take turns,
as on one interpreter lock; 2.0: neither slows the other, the most two cores allow). Also the CPU seconds
(trainer and sampler processes) per group and per step alone: the process sampler's cost in messages.

A machine whose cores are busy with other work cannot show the overlap (there is no idle core to take): the load
average is printed; read the overlap on a quiet machine, the CPU per group and per step anywhere.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlctl.trainer.backends.base import SamplingRequest  # noqa: E402
from rlctl.trainer.backends.local import LocalBackend  # noqa: E402
from rlctl.trainer.backends.sampler_process import ProcessSampler  # noqa: E402
from rlctl.trainer.config import parse_config  # noqa: E402
from rlctl.trainer.grpo import build_datum  # noqa: E402
from rlctl.trainer.tiny_model import init_tiny_model  # noqa: E402

CALLERS = 4
GROUP = SamplingRequest(prompt_tokens=[], n=8, max_new_tokens=8)


def backend_for(model_dir: Path, run_dir: Path, sampler: str) -> LocalBackend:
    tinker = {"backend": "local", "base_model": str(model_dir), "run_dir": str(run_dir), "inference_port": 1}
    tinker |= {"device": "cpu", "sampler": sampler}
    return LocalBackend(parse_config({"env": {"rollout_server_url": "http://127.0.0.1:1"}, "tinker": tinker}))


def cpu_seconds(backend: LocalBackend) -> float:
    """CPU time of this process and, for the process sampler, of its child."""
    total = time.process_time()
    sampler = backend._sampler
    if isinstance(sampler, ProcessSampler):
        fields = Path(f"/proc/{sampler._pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def measure(backend: LocalBackend, seconds: float) -> dict[str, float]:
    text = backend.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Echo: 4242"}], tokenize=False, add_generation_prompt=True
    )
    prompt = backend.tokenizer.encode(text, add_special_tokens=False)
    request = SamplingRequest(prompt, n=GROUP.n, max_new_tokens=GROUP.max_new_tokens)
    completions = backend.sample(SamplingRequest(prompt, n=32, max_new_tokens=8, seed=1))
    data = [
        build_datum(prompt + c.tokens, [-100] * len(prompt) + c.tokens, 1.0, [1.0] * len(prompt) + c.logprobs, 1024)
        for c in completions
    ]
    version = [0]

    def step() -> None:
        backend.forward_backward(data)
        backend.optim_step(1e-4)
        version[0] += 1
        backend.publish_weights(version[0])

    sampled, sampling, stop = [0], threading.Event(), threading.Event()

    def caller() -> None:
        while not stop.is_set():
            if sampling.is_set():
                backend.sample(request)
                sampled[0] += 1
            else:
                time.sleep(0.001)

    callers = [threading.Thread(target=caller, daemon=True) for _ in range(CALLERS)]
    for thread in callers:
        thread.start()
    figures: dict[str, float] = {}
    try:
        sampling.set()
        figures["groups_alone"], figures["cpu_per_group"] = _rate(lambda: time.sleep(0.01), sampled, seconds, backend)
        figures["groups_together"], _ = _rate(step, sampled, seconds, backend, count_calls=True, out=figures)
        sampling.clear()
        time.sleep(0.5)  # the callers' last requests end
        figures["steps_alone"], figures["cpu_per_step"] = _rate(step, None, seconds, backend)
    finally:
        stop.set()
        for thread in callers:
            thread.join()
    figures["overlap"] = (
        figures["groups_together"] / figures["groups_alone"] + figures["steps_together"] / figures["steps_alone"]
    )
    return figures


def _rate(
    work: Callable[[], None],
    counter: list[int] | None,
    seconds: float,
    backend: LocalBackend,
    count_calls: bool = False,
    out: dict[str, float] | None = None,
) -> tuple[float, float]:
    """(counter's rate, or calls of `work` per second; CPU seconds per count) over `seconds`."""
    start_count = counter[0] if counter else 0
    cpu, started, calls = cpu_seconds(backend), time.monotonic(), 0
    while time.monotonic() - started < seconds:
        work()
        calls += 1
    elapsed, used = time.monotonic() - started, cpu_seconds(backend) - cpu
    if count_calls and out is not None:
        out["steps_together"] = calls / elapsed
    count = (counter[0] - start_count) if counter else calls
    return count / elapsed, used / max(count, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="rlctl-overlap-") as scratch:
        model_dir = init_tiny_model(Path(scratch) / "model", seed=0)
        for round_ in range(args.rounds):
            for sampler in ("thread", "process"):
                backend = backend_for(model_dir, Path(scratch) / f"{sampler}-{round_}", sampler)
                try:
                    f = measure(backend, args.seconds)
                finally:
                    backend.close()
                print(
                    f"{sampler:>7}: alone {f['groups_alone']:5.1f} groups/s, {f['steps_alone']:5.1f} steps/s; "
                    f"together {f['groups_together']:5.1f} groups/s, {f['steps_together']:5.1f} steps/s; "
                    f"overlap {f['overlap']:.2f}; CPU {f['cpu_per_group'] * 1000:5.1f} ms/group, "
                    f"{f['cpu_per_step'] * 1000:5.1f} ms/step; load average {os.getloadavg()[0]:.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
