"""Sample several models on the same prompts: `python -m trainer.evaluate SPEC.json OUT.jsonl`.

The control plane's evaluations run this in a child process (docs/EVALUATIONS.md#sampling): for each model of the
spec (the base model, or the base model plus a local checkpoint's LoRA adapter) it answers every prompt
`samples_per_prompt` times and appends one line per completion to OUT.jsonl:
`{"model": NAME, "prompt_index": I, "sample": S, "text": ...}`. A prompt's samples use the same seed for every
model, so the models are compared on the same random numbers. Scoring is the caller's.

SPEC: `{"base_model", "tokenizer_name", "lora_rank", "device", "models": [{"name", "weights": DIR | null}],
"prompts": [[{"role", "content"}, ...], ...], "samples_per_prompt", "max_tokens", "temperature", "seed"}`.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from trainer.backends.base import Checkpoint, SamplingRequest
from trainer.backends.local import LocalBackend
from trainer.config import parse_config


def backend_for(spec: dict[str, Any], adapter: str | None, scratch: str) -> LocalBackend:
    config = parse_config(
        {
            "env": {"tokenizer_name": spec.get("tokenizer_name"), "rollout_server_url": "http://127.0.0.1:1"},
            "tinker": {
                "backend": "local",
                "base_model": spec["base_model"],
                "lora_rank": int(spec.get("lora_rank") or 8),
                "inference_port": 1,
                "run_dir": scratch,
                "seed": int(spec.get("seed") or 0),
                "device": spec.get("device") or "auto",
            },
        }
    )
    # A fresh LoRA adapter starts at zero (its B matrices), so without a checkpoint this is the base model exactly.
    resume = Checkpoint(step=0, path=adapter, weights=adapter) if adapter else None
    return LocalBackend(config, resume_from=resume)


def sample_all(spec: dict[str, Any], out_path: Path) -> None:
    with tempfile.TemporaryDirectory() as scratch, out_path.open("a", encoding="utf-8") as out:
        for model in spec["models"]:
            backend = backend_for(spec, model.get("weights"), scratch)
            tokenizer = backend.tokenizer
            for index, messages in enumerate(spec["prompts"]):
                text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                request = SamplingRequest(
                    prompt_tokens=tokenizer.encode(text, add_special_tokens=False),
                    n=int(spec["samples_per_prompt"]),
                    max_new_tokens=int(spec["max_tokens"]),
                    temperature=float(spec["temperature"]),
                    seed=int(spec.get("seed") or 0) * 1_000_003 + index,
                )
                lines = [
                    {
                        "model": model["name"],
                        "prompt_index": index,
                        "sample": sample,
                        "text": tokenizer.decode(completion.tokens, skip_special_tokens=True),
                    }
                    for sample, completion in enumerate(backend.sample(request))
                ]
                out.write("".join(json.dumps(line) + "\n" for line in lines))
                out.flush()  # a prompt's samples at once: the caller counts lines as progress
            del backend


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 2:
        print("usage: python -m trainer.evaluate SPEC.json OUT.jsonl", file=sys.stderr)
        return 2
    sample_all(json.loads(Path(args[0]).read_text()), Path(args[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
