"""Sample several models on the same prompts: `python -m rlctl.trainer.evaluate SPEC.json OUT.jsonl`.

The control plane's evaluations run this in a child process (docs/EVALUATIONS.md#sampling): for each model of the
spec it answers every prompt `samples_per_prompt` times and appends one line per completion to OUT.jsonl:
`{"model": NAME, "prompt_index": I, "sample": S, "text": ...}`, a prompt's samples of one model together. A
prompt's samples use the same seed for every model, so the models are compared on the same random numbers.
Scoring is the caller's.

A model is the base model (`weights` null) or a checkpoint's weights: on the `local` backend the base model plus
the checkpoint's LoRA adapter directory; on `tinker` the checkpoint's saved sampler weights (`tinker://…`),
sampled through the Tinker SDK as the trainer samples (rlctl/trainer/backends/tinker_backend.py), with TINKER_API_KEY
and TINKER_BASE_URL from this process's environment, never from the spec.

SPEC: `{"backend": "local" | "tinker", "base_model", "tokenizer_name", "lora_rank", "protocol", "device",
"models": [{"name", "weights": DIR | URI | null}], "prompts": [[{"role", "content"}, ...], ...],
"samples_per_prompt", "max_tokens", "temperature", "seed"}`.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlctl.trainer.backends.base import Checkpoint, Completion, SamplingRequest
from rlctl.trainer.config import parse_config

if TYPE_CHECKING:  # torch and the Tinker SDK are imported for the models that need them
    from rlctl.trainer.backends.local import LocalBackend
    from rlctl.trainer.backends.tinker_backend import TinkerSession


class ModelSampler(Protocol):
    """One model's weights to sample: a backend, or saved Tinker weights."""

    tokenizer: Any

    def sample(self, request: SamplingRequest) -> list[Completion]: ...


def adapter_shape(adapter: str | None, default_rank: int) -> tuple[int, int | None]:
    """(rank, alpha) of a checkpoint's LoRA adapter, from its adapter_config.json, so a checkpoint loads with
    whatever the run trained (docs/TRAINER.md#training-options); the default rank and alpha without one."""
    if adapter is None:
        return default_rank, None
    try:
        saved = json.loads((Path(adapter) / "adapter_config.json").read_text())
        return int(saved["r"]), int(saved["lora_alpha"]) if saved.get("lora_alpha") is not None else None
    except (OSError, ValueError, KeyError, TypeError):
        return default_rank, None


def backend_for(spec: dict[str, Any], adapter: str | None, scratch: str) -> LocalBackend:
    """The local backend on the spec's base model, with a checkpoint's LoRA adapter directory or without one."""
    from rlctl.trainer.backends.local import LocalBackend  # torch: imported for local models only

    rank, alpha = adapter_shape(adapter, int(spec.get("lora_rank") or 8))

    config = parse_config(
        {
            "env": {"tokenizer_name": spec.get("tokenizer_name"), "rollout_server_url": "http://127.0.0.1:1"},
            "tinker": {
                "backend": "local",
                "base_model": spec["base_model"],
                "lora_rank": rank,
                "lora_alpha": alpha,
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


def local_models(spec: dict[str, Any]) -> Iterator[tuple[dict[str, Any], ModelSampler]]:
    """The local backend once per model, each loaded when the one before is done with (CPU memory)."""
    with tempfile.TemporaryDirectory() as scratch:
        for model in spec["models"]:
            backend = backend_for(spec, model.get("weights"), scratch)
            try:
                yield model, backend
            finally:
                backend.close()  # its sampling thread holds the model until then
            del backend


class SavedTinkerWeights:
    """A sampling client of one model's weights on Tinker, sampled through the session's shared code."""

    def __init__(self, session: TinkerSession, model_path: str | None) -> None:
        self._session = session
        self._client = session.sampling_client(model_path)
        self.tokenizer = session.tokenizer

    def sample(self, request: SamplingRequest) -> list[Completion]:
        return self._session.sample(self._client, request)


def tinker_models(spec: dict[str, Any]) -> Iterator[tuple[dict[str, Any], ModelSampler]]:
    """One Tinker session; a sampling client per model: the base model, or a checkpoint's saved sampler weights."""
    from rlctl.trainer.backends.tinker_backend import TinkerSession

    session = TinkerSession(spec["base_model"], spec.get("tokenizer_name"), spec.get("protocol") or "auto", None)
    try:
        for model in spec["models"]:
            yield model, SavedTinkerWeights(session, model.get("weights"))
    finally:
        session.close()


def evaluated_models(spec: dict[str, Any]) -> Iterator[tuple[dict[str, Any], ModelSampler]]:
    """Each of the spec's models with its sampler, on its backend (Tinker, or the local one model at a time)."""
    return tinker_models(spec) if spec.get("backend") == "tinker" else local_models(spec)


def sample_all(spec: dict[str, Any], out_path: Path) -> None:
    models = evaluated_models(spec)
    with out_path.open("a", encoding="utf-8") as out:
        for model, sampler in models:
            tokenizer = sampler.tokenizer
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
                    for sample, completion in enumerate(sampler.sample(request))
                ]
                out.write("".join(json.dumps(line) + "\n" for line in lines))
                out.flush()  # a prompt's samples at once: the caller counts lines as progress
            del sampler


def child_main(argv: list[str] | None, module: str, play: Callable[[dict[str, Any], Path], None]) -> int:
    """An evaluation child's command line, `python -m MODULE SPEC.json OUT.jsonl`: `play` the spec into OUT."""
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 2:
        print(f"usage: python -m {module} SPEC.json OUT.jsonl", file=sys.stderr)
        return 2
    play(json.loads(Path(args[0]).read_text()), Path(args[1]))
    return 0


def main(argv: list[str] | None = None) -> int:
    return child_main(argv, "rlctl.trainer.evaluate", sample_all)


if __name__ == "__main__":
    raise SystemExit(main())
