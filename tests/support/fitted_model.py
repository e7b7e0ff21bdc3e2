"""A tiny model fitted to answer one prompt with one tool call, so the servers' tool-call path runs on a real model
that emits a real call deterministically (greedy). A random tiny model never writes a well-formed `<tool_call>`;
a few dozen Adam steps on the target strings (seconds on one CPU core) make it, built once per session.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

from rlctl.trainer.tiny_model import COMPLETE_MARKER
from tests.support.tiny_model import session_tiny_model

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
WEATHER_PROMPT = "Weather in Paris?"
WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
# A collection's agent (the built-in write_file tool): the call, then a final answer once the tool's result is in.
WRITE_PROMPT = "Write 42 to answer.txt."
WRITE_ARGUMENTS = {"path": "answer.txt", "content": "42"}
WRITE_CALL = '<tool_call>\n{"name": "write_file", "arguments": {"path": "answer.txt", "content": "42"}}\n</tool_call>'
WRITE_RESULT = '{"written_bytes": 2, "path": "answer.txt"}'  # what the write_file tool answers
WRITE_DONE = "Done."
MAX_STEPS = 300
TARGET_LOSS = 0.02  # the largest mean per-token loss of the examples at which greedy decoding reproduces them

_lock = threading.Lock()


def fitted_tool_call_model() -> Path:
    """The session's tiny model, fitted so that greedy decoding answers: the chat [user: WEATHER_PROMPT] with tools
    [WEATHER_TOOL] by WEATHER_CALL; [user: WRITE_PROMPT] with the collections' write_file tool by WRITE_CALL; and
    that conversation with the call and WRITE_RESULT by WRITE_DONE (each then the end of the turn)."""
    base = session_tiny_model()
    model = base.parent / "tiny-qwen3-tool-call"
    with _lock:
        if not (model / COMPLETE_MARKER).exists():
            _fit(base, model)
    return model


def _examples() -> list[tuple[list[dict[str, Any]], dict[str, Any], str]]:
    from rlctl.sandbox.toolbox import SCHEMAS

    write_tool = SCHEMAS["write_file"]
    asked = [{"role": "user", "content": WRITE_PROMPT}]
    called = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "id": "call_0", "function": {"name": "write_file", "arguments": WRITE_ARGUMENTS}}
        ],
    }
    answered = {"role": "tool", "content": WRITE_RESULT, "tool_call_id": "call_0", "name": "write_file"}
    return [
        ([{"role": "user", "content": WEATHER_PROMPT}], WEATHER_TOOL, WEATHER_CALL),
        (asked, write_tool, WRITE_CALL),
        ([*asked, called, answered], write_tool, WRITE_DONE),
    ]


def _fit(base: Path, directory: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    batches = []
    for messages, tool, reply in _examples():
        prompt = tokenizer.apply_chat_template(
            messages,
            tools=[tool],
            tokenize=False,
            add_generation_prompt=True,  # as the inference server renders it
        )
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        reply_ids = tokenizer.encode(reply + "<|im_end|>", add_special_tokens=False)
        labels = [-100] * len(prompt_ids) + reply_ids  # only the reply is learnt
        batches.append((torch.tensor([prompt_ids + reply_ids]), torch.tensor([labels])))
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 90k-parameter model: more threads only contend with the suite's other work
    try:
        for _ in range(MAX_STEPS):
            losses = [model(input_ids=inputs, labels=labels).loss for inputs, labels in batches]
            optimizer.zero_grad()
            sum(losses).backward()
            optimizer.step()
            if max(loss.item() for loss in losses) < TARGET_LOSS:
                break
        else:
            raise RuntimeError(f"the tiny model did not fit its tool calls in {MAX_STEPS} steps")
    finally:
        torch.set_num_threads(threads)
    staging = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(base, staging)  # tokenizer, chat template, marker
    model.save_pretrained(staging)
    staging.rename(directory)
