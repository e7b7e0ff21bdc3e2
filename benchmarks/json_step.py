"""JSON handling per training step on the local backend: the inference server's answers and the batch's decoding.

    .venv/bin/python benchmarks/json_step.py [--reps 200]

The tiny model answers each sampling endpoint for one group as the echo pipeline samples it (8 completions of 8
tokens, with logprobs). For each answer, printed: the time to encode it as the server does now
(`inference_server._answer`: `json.dumps` of the dict as it is) and as FastAPI would with the dict returned from
the route (`jsonable_encoder`, then `json.dumps`), with their ratio; then the time to decode a batch of 4 groups as
the trainer reads it from the Atropos API (`json.loads`), and the per-step total (4 groups), with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastapi.encoders import jsonable_encoder  # noqa: E402

from rlctl.trainer.backends.local import LocalBackend  # noqa: E402
from rlctl.trainer.config import parse_config  # noqa: E402
from rlctl.trainer.inference_server import (  # noqa: E402
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    InferenceService,
)
from rlctl.trainer.tiny_model import init_tiny_model  # noqa: E402

GROUP, TOKENS, GROUPS_PER_STEP = 8, 8, 4


def per_call_s(function: Callable[[], Any], reps: int) -> float:
    function()
    started = time.perf_counter()
    for _ in range(reps):
        function()
    return (time.perf_counter() - started) / reps


def answers(service: InferenceService, prompt: list[int], text: str) -> dict[str, Any]:
    generate = GenerateRequest(
        input_ids=prompt, sampling_params={"n": GROUP, "max_new_tokens": TOKENS}, return_logprob=True
    )
    completion = CompletionRequest(prompt=prompt, n=GROUP, max_tokens=TOKENS, logprobs=1)
    chat = ChatCompletionRequest(
        messages=[{"role": "user", "content": text}], n=GROUP, max_tokens=TOKENS, logprobs=True
    )
    return {
        "/generate": asyncio.run(service.generate(generate)),
        "/v1/completions": asyncio.run(service.completions(completion)),
        "/v1/chat/completions": asyncio.run(service.chat_completions(chat)),
    }


def batch_document(prompt: list[int]) -> str:
    """A batch as the Atropos API sends it: 4 groups of 8 scored sequences (tokens, masks, scores, logprobs)."""
    length = len(prompt) + TOKENS
    group = {
        "tokens": [list(range(length))] * GROUP,
        "masks": [[-100] * len(prompt) + list(range(TOKENS))] * GROUP,
        "scores": [0.5] * GROUP,
        "inference_logprobs": [[1.0] * len(prompt) + [-0.123456] * TOKENS] * GROUP,
        "advantages": None,
        "messages": None,
    }
    return json.dumps({"batch": [group] * GROUPS_PER_STEP})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlctl-json-") as scratch:
        model_dir = init_tiny_model(Path(scratch) / "model", seed=0)
        tinker = {"backend": "local", "base_model": str(model_dir), "run_dir": scratch, "inference_port": 1}
        config = parse_config(
            {"env": {"rollout_server_url": "http://127.0.0.1:1"}, "tinker": tinker | {"device": "cpu"}}
        )
        backend = LocalBackend(config)
        try:
            service = InferenceService(backend)
            text = "Echo: 4242"
            prompt = backend.tokenizer.encode(text)
            answered = answers(service, prompt, text)
        finally:
            backend.close()
    print(f"load average {os.getloadavg()[0]:.2f}; one group = {GROUP} completions of {TOKENS} tokens with logprobs")
    for path, content in answered.items():
        now = per_call_s(lambda content=content: json.dumps(content), args.reps)
        before = per_call_s(lambda content=content: json.dumps(jsonable_encoder(content)), args.reps)
        print(
            f"{path:<22} encode now {now * 1000:6.3f} ms, with jsonable_encoder {before * 1000:6.3f} ms "
            f"({before / now:4.1f}x); per step ({GROUPS_PER_STEP} groups) {GROUPS_PER_STEP * now * 1000:6.2f} ms "
            f"against {GROUPS_PER_STEP * before * 1000:6.2f} ms"
        )
    document = batch_document(prompt)
    decode = per_call_s(lambda: json.loads(document), args.reps)
    print(f"decoding a batch of {GROUPS_PER_STEP} groups ({len(document)} bytes): {decode * 1000:6.3f} ms per step")


if __name__ == "__main__":
    main()
