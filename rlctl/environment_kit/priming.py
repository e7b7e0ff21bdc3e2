"""Priming: a brief supervised fit of a base model on demonstration conversations, so a tiny random model emits a
tool environment's call format at all before RL (docs/TOOL_ENVIRONMENTS.md#priming).

A randomly initialised model never writes `<tool_call>{"name": ...}</tool_call>` by chance, so reinforcement has
nothing to reinforce. A few hundred CPU steps of next-token loss on the assistant turns of demonstrations make the
format likely but not certain: the primed model succeeds on some tasks, and RL has a signal to climb from. The
primed weights are written as a complete model directory (the same tokenizer), built once and reused; the fit is
seeded, so the same inputs give the same model.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PRIMED_MARKER = "rlctl_primed.json"
MASKED = -100


def assistant_masked(
    tokenizer: Any, conversation: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> tuple[list[int], list[int]]:
    """The conversation's tokens and labels: the assistant turns' text (and their end token) are learned, every other
    token (system, user, tool turns, the template's openings) is masked."""
    tokens: list[int] = []
    labels: list[int] = []
    rendered_before = ""
    for index in range(len(conversation)):
        message = conversation[index]
        rendered = tokenizer.apply_chat_template(conversation[: index + 1], tools=tools, tokenize=False)
        if message["role"] == "assistant":
            opening = tokenizer.apply_chat_template(
                conversation[:index], tools=tools, tokenize=False, add_generation_prompt=True
            )
            context = tokenizer.encode(opening[len(rendered_before) :], add_special_tokens=False)
            reply = tokenizer.encode(rendered[len(opening) :], add_special_tokens=False)
            tokens += context + reply
            labels += [MASKED] * len(context) + reply
        else:
            piece = tokenizer.encode(rendered[len(rendered_before) :], add_special_tokens=False)
            tokens += piece
            labels += [MASKED] * len(piece)
        rendered_before = rendered
    return tokens, labels


def prime(
    base_model: Path,
    output: Path,
    conversations: Sequence[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]],
    *,
    steps: int,
    learning_rate: float = 3e-3,
    batch_size: int = 8,
    seed: int = 0,
) -> Path:
    """Fit `base_model` on `conversations` ((messages, tools) pairs) for `steps` Adam steps and write the result to
    `output` (atomically: a finished directory or none). Returns `output` at once when it is already primed."""
    if (output / PRIMED_MARKER).exists():
        return output
    import torch

    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    # One thread: a model this small gains nothing from more, and on a busy machine they slowed the fit tenfold.
    torch.set_num_threads(1)
    try:
        _fit_and_save(base_model, output, conversations, steps, learning_rate, batch_size, seed)
    finally:
        torch.set_num_threads(threads)
    return output


def _fit_and_save(
    base_model: Path,
    output: Path,
    conversations: Sequence[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]],
    steps: int,
    learning_rate: float,
    batch_size: int,
    seed: int,
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    model.train()
    examples = [assistant_masked(tokenizer, messages, tools) for messages, tools in conversations]
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    generator = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    for _ in range(steps):
        picks = torch.randint(len(examples), (batch_size,), generator=generator).tolist()
        input_ids, labels, attention = _pad([examples[index] for index in picks], tokenizer.pad_token_id)
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    staging = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    for extra in Path(base_model).glob("*.json"):  # e.g. the tiny model's marker: the primed one is as complete
        if not (staging / extra.name).exists():
            shutil.copy(extra, staging / extra.name)
    record = {"base_model": str(base_model), "steps": steps, "seed": seed, "final_loss": _mean(losses[-20:])}
    (staging / PRIMED_MARKER).write_text(json.dumps(record))
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        staging.rename(output)
    except OSError:  # primed by another process meanwhile: keep that one
        shutil.rmtree(staging, ignore_errors=True)
        if not (output / PRIMED_MARKER).exists():
            raise


def _pad(examples: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[Any, Any, Any]:
    import torch

    width = max(len(tokens) for tokens, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), MASKED, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (tokens, targets) in enumerate(examples):
        input_ids[row, : len(tokens)] = torch.tensor(tokens)
        labels[row, : len(targets)] = torch.tensor(targets)
        attention[row, : len(tokens)] = 1
    return input_ids, labels, attention


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
