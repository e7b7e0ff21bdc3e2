"""Merge a checkpoint's LoRA adapter into its base model: `rlctl model merge BASE CHECKPOINT OUT`
(`python -m rlctl.trainer.merge`). OUT becomes a plain Hugging Face model directory (weights, config, tokenizer):
base + adapter, no peft needed to load it (docs/TRAINER.md#weights-out)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"


class MergeError(ValueError):
    """The checkpoint or the output directory cannot be used as asked."""


def merge_adapter(base_model: str, checkpoint: Path, output: Path) -> Path:
    """Write base + the checkpoint's adapter to `output` (which must not exist, or be empty); returns it."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (checkpoint / ADAPTER_CONFIG).is_file():
        raise MergeError(f"{checkpoint} has no {ADAPTER_CONFIG}: not a LoRA checkpoint directory")
    if output.exists() and any(output.iterdir()):
        raise MergeError(f"{output} exists and is not empty: choose a new directory")
    # float32: the merge adds the low-rank product to the base weights without losing the adapter to rounding
    base = AutoModelForCausalLM.from_pretrained(base_model, dtype="float32")
    merged = PeftModel.from_pretrained(base, str(checkpoint)).merge_and_unload()
    output.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(output))
    AutoTokenizer.from_pretrained(base_model).save_pretrained(str(output))
    saved = json.loads((checkpoint / ADAPTER_CONFIG).read_text())
    provenance = {"base_model": base_model, "adapter": str(checkpoint), "lora_rank": saved.get("r")}
    (output / "rlctl_merge.json").write_text(json.dumps(provenance, indent=2))
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlctl.trainer.merge", description=__doc__)
    parser.add_argument("base", help="the base model: a directory or a cached hub id")
    parser.add_argument("checkpoint", type=Path, help="a local checkpoint directory (runs/{id}/checkpoints/step_N)")
    parser.add_argument("output", type=Path, help="a new directory for the merged model")
    args = parser.parse_args(argv)
    try:
        merged = merge_adapter(args.base, args.checkpoint, args.output)
    except MergeError as error:
        print(f"error: {error}", flush=True)
        return 2
    print(f"merged {args.checkpoint} into {args.base}: {merged}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
