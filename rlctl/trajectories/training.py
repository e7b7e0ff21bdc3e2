"""A stored trajectory as training tokens: chat messages rendered with the run's chat template, every assistant
turn trained and every other token masked (docs/TRAJECTORIES.md#training-tokens).

Pure: the caller hands in a tokenizer (anything with ``apply_chat_template`` and ``encode``, as Hugging Face
tokenizers have); nothing is read or downloaded here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from rlctl.trajectories.records import TrajectoryRecord, Turn

PROMPT_MASK = -100  # Atropos's mask value for a position that is not trained
CHAT_ROLES = {"system": "system", "human": "user", "gpt": "assistant", "tool": "tool"}


class ChatTokenizer(Protocol):
    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, **kwargs: Any) -> list[int]: ...


def chat_messages(record: TrajectoryRecord) -> list[dict[str, str]]:
    """The record's turns as chat messages (ShareGPT roles → chat roles; the tagged text is the content)."""
    return [{"role": CHAT_ROLES[turn.role], "content": turn.value} for turn in record.turns]


def prompt_messages(record: TrajectoryRecord) -> list[dict[str, str]]:
    """The turns before the first assistant turn: what a policy is asked (online runs, evaluations)."""
    messages = []
    for message in chat_messages(record):
        if message["role"] == "assistant":
            break
        messages.append(message)
    return messages


def record_with_completion(
    messages: Sequence[dict[str, str]], completion: str, metadata: dict[str, Any] | None = None
) -> TrajectoryRecord:
    """A prompt's chat messages plus a policy's completion as the last assistant turn: what rewards score."""
    roles = {chat: sharegpt for sharegpt, chat in CHAT_ROLES.items()}
    # roles[...] is one of CHAT_ROLES' keys, which the Literal of Turn.role cannot see through the dict.
    turns = [Turn(roles[m["role"]], m["content"]) for m in messages]  # type: ignore[arg-type]
    return TrajectoryRecord(turns=(*turns, Turn("gpt", completion)), metadata=dict(metadata or {}))


def record_of_conversation(
    messages: Sequence[dict[str, Any]], metadata: dict[str, Any] | None = None
) -> TrajectoryRecord:
    """A finished conversation (a tool environment's episode: chat messages whose assistant turns are the policy's
    text, tool calls included, and whose tool turns are the tools' results) as a record, for the judge."""
    roles = {chat: sharegpt for sharegpt, chat in CHAT_ROLES.items()}
    turns = []
    for message in messages:
        role = roles[message["role"]]
        name = message.get("name") if role == "tool" else None
        turns.append(Turn(role, str(message.get("content") or ""), name=name))  # type: ignore[arg-type]
    return TrajectoryRecord(turns=tuple(turns), metadata=dict(metadata or {}))


def has_assistant_turn(record: TrajectoryRecord) -> bool:
    return any(turn.role == "gpt" for turn in record.turns)


def assistant_spans(tokenizer: ChatTokenizer, messages: Sequence[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
    """The whole rendered conversation and the character spans of its assistant turns.

    A turn's span runs from the end of the generation prompt before it to the end of the turn (its end-of-turn
    token included: the policy learns to stop). Templates that re-render earlier turns differently once later
    ones exist (e.g. dropping old reasoning) are not prefix-stable; their spans are found by the turn's text.
    """
    messages = list(messages)
    full = _render(tokenizer, messages, False)
    spans: list[tuple[int, int]] = []
    cursor = 0
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = _render(tokenizer, messages[:index], True) if index else ""
        through = _render(tokenizer, messages[: index + 1], False)
        if through.startswith(prompt) and full.startswith(through) and len(prompt) >= cursor:
            start, end = len(prompt), len(through)
        else:
            start = full.find(message["content"], cursor)
            if start < 0:
                continue  # the template dropped the text: nothing of this turn can be trained
            end = start + len(message["content"])
        spans.append((start, end))
        cursor = end
    return full, spans


def training_tokens(tokenizer: ChatTokenizer, messages: Sequence[dict[str, str]]) -> tuple[list[int], list[int]]:
    """Tokens of the rendered conversation and Atropos masks: the token id on assistant tokens, -100 elsewhere."""
    full, spans = assistant_spans(tokenizer, messages)
    tokens: list[int] = []
    masks: list[int] = []
    position = 0
    for start, end in spans:
        context = _encode(tokenizer, full[position:start])
        trained = _encode(tokenizer, full[start:end])
        tokens += context + trained
        masks += [PROMPT_MASK] * len(context) + trained
        position = end
    rest = _encode(tokenizer, full[position:])
    return tokens + rest, masks + [PROMPT_MASK] * len(rest)


def reply_samples(
    tokenizer: ChatTokenizer, messages: Sequence[dict[str, str]], replies: Sequence[str]
) -> list[tuple[str, list[int], list[int], list[float]]]:
    """Each reply of a plain OpenAI endpoint (text only) as a rollout: (reply, prompt + reply tokens, masks with
    -100 on the prompt, placeholder logprobs of 1.0). The prompt is the chat template with the generation prompt,
    rendered and encoded once for all the replies; each reply is appended as its own tokens."""
    prompt = _encode(tokenizer, _render(tokenizer, messages, generation_prompt=True))
    samples = []
    for reply in replies:
        tokens = _encode(tokenizer, reply)
        samples.append(
            (reply, prompt + tokens, [PROMPT_MASK] * len(prompt) + tokens, [1.0] * (len(prompt) + len(tokens)))
        )
    return samples


def _render(tokenizer: ChatTokenizer, messages: Sequence[dict[str, str]], generation_prompt: bool) -> str:
    return str(tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt))


def _encode(tokenizer: ChatTokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []
