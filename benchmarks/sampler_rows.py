"""What a row costs the local sampler: batches of 16, 48 and 128 rows on the tiny model, with each kind of cache.

    .venv/bin/python benchmarks/sampler_rows.py [--prompt-tokens 560] [--new-tokens 64] [--repeats 7]
        [--prompts 1] [--threads 0]

Each batch is requests of n = 8 rows sent together from threads of their own (as the inference server's calls
arrive), `--prompts` distinct prompts of about `--prompt-tokens` tokens among them (one: every model of an
inference test sends the same problem), `--new-tokens` each, sampled at temperature 1 (rows end early on an
end-of-sequence token, as real ones do). Printed: the median time of a batch for the shared-prefix cache and for
transformers' own (a copy of the prompt per row), how much longer 48 and 128 rows take than 16 (the goal of three
inference-test models together: 48 rows within 1.2x of 16), and the shared-prefix speed-up. `--threads` sets
torch's intra-op threads (0: its default).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlctl.trainer.backends.base import SamplingRequest  # noqa: E402
from rlctl.trainer.backends.local import LocalBackend  # noqa: E402
from rlctl.trainer.config import parse_config  # noqa: E402
from rlctl.trainer.tiny_model import init_tiny_model  # noqa: E402

ROWS = (16, 48, 128)
ROWS_PER_REQUEST = 8


def batch_seconds(backend: LocalBackend, prompts: list[list[int]], rows: int, new_tokens: int) -> float:
    requests = [
        SamplingRequest(prompts[index % len(prompts)], n=ROWS_PER_REQUEST, max_new_tokens=new_tokens)
        for index in range(rows // ROWS_PER_REQUEST)
    ]
    threads = [threading.Thread(target=backend.sample, args=(request,)) for request in requests]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def chat_prompts(backend: LocalBackend, count: int, tokens: int) -> list[list[int]]:
    rng = random.Random(0)
    prompts = []
    for _ in range(count):
        content = "".join(rng.choice("0123456789 abcdefghij+-=?") for _ in range(tokens))
        text = backend.tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
        prompts.append(backend.tokenizer.encode(text, add_special_tokens=False))
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=560)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--prompts", type=int, default=1, help="distinct prompts in a batch")
    parser.add_argument("--threads", type=int, default=0, help="torch's intra-op threads (0: its default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="rlctl-bench-sampler-") as tmp:
        root = Path(tmp)
        model_dir = init_tiny_model(root / "tiny-qwen3", seed=0)
        config = parse_config(
            {
                "env": {"rollout_server_url": "http://127.0.0.1:1"},
                "tinker": {
                    "base_model": str(model_dir),
                    "run_dir": str(root / "run"),
                    "inference_port": 1,  # never served: the sampler is called directly
                    "device": "cpu",
                },
            }
        )
        medians: dict[str, dict[int, float]] = {}
        for kind in ("shared_prefix", "padded"):
            backend = LocalBackend(config, shared_prefix=kind == "shared_prefix")
            prompts = chat_prompts(backend, args.prompts, args.prompt_tokens)
            if not medians:
                print(
                    f"tiny model, {torch.get_num_threads()} torch threads; {args.prompts} prompt(s) of "
                    f"{len(prompts[0])} tokens, {args.new_tokens} new tokens per row, {ROWS_PER_REQUEST} rows per "
                    "request",
                    flush=True,
                )
            batch_seconds(backend, prompts, ROWS[0], args.new_tokens)  # warm-up
            medians[kind] = {}
            for rows in ROWS:
                times = [batch_seconds(backend, prompts, rows, args.new_tokens) for _ in range(args.repeats)]
                medians[kind][rows] = statistics.median(times)
            backend.close()
            row_text = ", ".join(f"{rows} rows {seconds:.3f} s" for rows, seconds in medians[kind].items())
            growth = ", ".join(f"{rows}/16 {medians[kind][rows] / medians[kind][16]:.2f}x" for rows in ROWS[1:])
            print(f"{kind:>14}: {row_text}; {growth}", flush=True)
    speedup = ", ".join(f"{rows} rows {medians['padded'][rows] / medians['shared_prefix'][rows]:.2f}x" for rows in ROWS)
    print(f"shared-prefix speed-up over a copy per row: {speedup}")


if __name__ == "__main__":
    main()
