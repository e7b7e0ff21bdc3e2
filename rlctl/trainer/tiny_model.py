"""A tiny, randomly initialised Qwen3 model with a local character-level tokenizer.

It exists so the whole pipeline (Atropos API, environment, trainer, inference server) runs offline with no
downloads: the tokenizer is built here with the `tokenizers` library and the weights are random. The
vocabulary is small on purpose (printable ASCII plus chat tokens), so a digit is about one token in ten
and a tiny model can learn to prefer digits within a few dozen GRPO steps.

    python -m rlctl.trainer.tiny_model DIR      # create (idempotent) and print the directory
"""

from __future__ import annotations

import argparse
import json
import os
import string
from pathlib import Path
from typing import Any

TINY_MODEL_SUBDIR = Path("models") / "tiny-qwen3"
COMPLETE_MARKER = "rlctl_tiny_model.json"

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
UNKNOWN_TOKEN = "<unk>"
PAD_TOKEN, EOS_TOKEN = "<|endoftext|>", "<|im_end|>"

# ChatML, the format Qwen models use; `add_generation_prompt` opens the assistant turn.
# ChatML, as Qwen3 writes it: the tools in a system turn, an assistant's tool calls as <tool_call> blocks, a tool's
# answer as its own turn. A conversation without tools renders exactly as plain ChatML.
CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\n# Tools\n<tools>' }}"
    "{% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\n</tools><|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{% set function = call['function'] if call.get('function') else call %}"
    "{% set arguments = function['arguments'] if function['arguments'] is string else function['arguments'] | tojson %}"
    "{{ '\n<tool_call>\n{\"name\": ' + (function['name'] | tojson) }}"
    "{{ ', \"arguments\": ' + arguments + '}\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TINY_ARCHITECTURE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,  # a separate lm_head, so LoRA can train the unembedding
}


def default_tiny_model_dir(data_dir: Path) -> Path:
    """Where the local backend keeps its default base model inside the data directory."""
    return Path(data_dir) / TINY_MODEL_SUBDIR


def _character_vocabulary() -> list[str]:
    printable = [c for c in string.printable if c not in "\x0b\x0c\r"]
    return SPECIAL_TOKENS + [UNKNOWN_TOKEN] + printable


def build_tokenizer():
    """A character-level fast tokenizer with a ChatML chat template; no files are downloaded."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(_character_vocabulary())}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNKNOWN_TOKEN))
    # Fold accents and compatibility forms to ASCII where possible; anything else becomes <unk>.
    backend.normalizer = normalizers.Sequence([normalizers.NFKD(), normalizers.StripAccents()])
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token=UNKNOWN_TOKEN,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (PAD_TOKEN, EOS_TOKEN)],
        clean_up_tokenization_spaces=False,
        model_max_length=TINY_ARCHITECTURE["max_position_embeddings"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def init_tiny_model(directory: Path, seed: int = 0) -> Path:
    """Create the tiny model and tokenizer in `directory` unless a complete one is already there."""
    directory = Path(directory)
    if (directory / COMPLETE_MARKER).exists():
        return directory
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = build_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **TINY_ARCHITECTURE,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    # Write into a sibling temp dir and rename, so a crash never leaves a half-written model behind.
    staging = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    staging.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / COMPLETE_MARKER).write_text(json.dumps({"seed": seed, "architecture": "Qwen3ForCausalLM"}))
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        staging.rename(directory)
    except OSError:
        # Another process created it first (or a partial dir exists): keep a complete one.
        if not (directory / COMPLETE_MARKER).exists():
            raise
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
    return directory


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Create a tiny random Qwen3 model and tokenizer locally.")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(init_tiny_model(args.directory, seed=args.seed))


if __name__ == "__main__":
    main()
