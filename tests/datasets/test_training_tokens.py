"""Stored trajectories as training tokens: every assistant turn trained, every other token masked."""

from __future__ import annotations

from typing import Any

import pytest

from rlctl.trainer.tiny_model import build_tokenizer
from rlctl.trajectories.records import record_from_dict
from rlctl.trajectories.training import (
    PROMPT_MASK,
    assistant_spans,
    chat_messages,
    has_assistant_turn,
    prompt_messages,
    reply_samples,
    training_tokens,
)

MULTI_TURN = {
    "conversations": [
        {"from": "system", "value": "You run tools."},
        {"from": "human", "value": "List the files."},
        {"from": "gpt", "value": '<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>'},
        {"from": "tool", "value": "a.py b.py"},
        {"from": "gpt", "value": "Two files: a.py and b.py."},
    ]
}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer()


def trained_text(tokenizer: Any, tokens: list[int], masks: list[int]) -> str:
    return tokenizer.decode([t for t, m in zip(tokens, masks, strict=True) if m != PROMPT_MASK])


def test_every_assistant_turn_is_trained_and_nothing_else(tokenizer: Any) -> None:
    messages = chat_messages(record_from_dict(MULTI_TURN))
    tokens, masks = training_tokens(tokenizer, messages)
    assert len(tokens) == len(masks)
    trained = trained_text(tokenizer, tokens, masks)
    assert '"name": "ls"' in trained and "Two files: a.py and b.py." in trained
    for masked in ("You run tools.", "List the files.", "a.py b.py<"):
        assert masked not in trained
    # the end-of-turn token of each assistant turn is trained (the policy learns to stop), its header is not
    assert trained.count("<|im_end|>") == 2 and "assistant" not in trained
    # masks carry the token id where trained
    assert all(m in (PROMPT_MASK, t) for t, m in zip(tokens, masks, strict=True))
    # the whole sequence is the rendered conversation
    assert tokenizer.decode(tokens) == tokenizer.apply_chat_template(messages, tokenize=False)


def test_a_template_that_is_not_prefix_stable_still_finds_the_turns(tokenizer: Any) -> None:
    class DropsOldTurns:
        """Renders earlier assistant turns as '…' once a later turn exists, as reasoning-dropping templates do."""

        def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> str:
            last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
            parts = [
                f"[{m['role']}] " + (m["content"] if m["role"] != "assistant" or i == last else "…")
                for i, m in enumerate(messages)
            ]
            return "\n".join(parts) + ("\n[assistant] " if kwargs.get("add_generation_prompt") else "")

        def encode(self, text: str, **kwargs: Any) -> list[int]:
            return [ord(c) for c in text]

    messages = chat_messages(record_from_dict(MULTI_TURN))
    full, spans = assistant_spans(DropsOldTurns(), messages)
    assert [full[a:b] for a, b in spans] == ["Two files: a.py and b.py."]  # the dropped turn cannot be trained


def test_prompt_messages_stop_at_the_first_assistant_turn() -> None:
    record = record_from_dict(MULTI_TURN)
    assert prompt_messages(record) == [
        {"role": "system", "content": "You run tools."},
        {"role": "user", "content": "List the files."},
    ]
    assert has_assistant_turn(record)
    assert not has_assistant_turn(record_from_dict({"conversations": [{"from": "human", "value": "hi"}]}))


def test_replies_of_a_text_endpoint_share_one_rendering_of_their_prompt(tokenizer: Any) -> None:
    class Counting:
        renders = 0

        def apply_chat_template(self, messages: Any, **kwargs: Any) -> Any:
            Counting.renders += 1
            return tokenizer.apply_chat_template(messages, **kwargs)

        def encode(self, text: str, **kwargs: Any) -> list[int]:
            return tokenizer.encode(text, **kwargs)

    messages = [{"role": "system", "content": "Add."}, {"role": "user", "content": "2 + 2?"}]
    samples = reply_samples(Counting(), messages, ["4", "It is 4.", ""])
    assert Counting.renders == 1
    prompt = tokenizer.encode(
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )
    for (reply, tokens, masks, logprobs), text in zip(samples, ["4", "It is 4.", ""], strict=True):
        assert reply == text and tokens[: len(prompt)] == prompt
        assert tokenizer.decode(tokens[len(prompt) :]) == text
        assert masks == [PROMPT_MASK] * len(prompt) + tokens[len(prompt) :]
        assert logprobs == [1.0] * len(tokens)
