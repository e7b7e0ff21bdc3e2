"""Multi-turn tool episodes built by token extension (docs/TOOL_ENVIRONMENTS.md#episodes).

One episode is one conversation: the prompt (the chat template with its tools), then turn after turn the policy's
reply sampled from the run's model server, its tool calls parsed (`rlctl/trajectories/tool_calls.py`, the chat
template's own `<tool_call>` format), each call run, and the results appended as tool turns, until a reply calls no
tool, `max_turns` replies were sampled, or the conversation would outgrow `max_tokens`.

The tokens are never re-tokenized from text: each reply's sampled tokens are appended as they came (with their
sampler logprobs), and only the template's text around them (a turn's closing, tool turns, the next assistant
opening) is tokenized, so the trained tokens are exactly the sampled ones. Masks follow Atropos: -100 on everything
the policy did not sample (prompt, tool results, template text), the token id on the policy's tokens; logprobs are
1.0 on masked positions.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlctl.trajectories.tool_calls import ParsedToolCall, split_tool_calls

MASKED = -100
MASKED_LOGPROB = 1.0


class Tokenizer(Protocol):
    eos_token: str
    eos_token_id: int

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, tokens: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True)
class Sampled:
    """One reply of the policy: its tokens, their sampler logprobs, and why it ended (`stop` or `length`)."""

    tokens: list[int]
    logprobs: list[float]
    finish_reason: str


# Samples one reply continuing `input_ids` with at most `max_tokens` tokens.
Sampler = Callable[[list[int], int], Awaitable[Sampled]]
# Runs one tool call; returns the tool turn's text. Raising counts the call as failed (its error is the text).
ToolRunner = Callable[[ParsedToolCall], Awaitable[str]]


class ToolCallFailed(Exception):
    """A call the tools refuse (unknown tool, bad arguments, a tool's own error): the policy sees `result` when the
    tool gave one (a sandboxed call's JSON with its `error`), else `{"error": message}`."""

    def __init__(self, message: str, result: str | None = None) -> None:
        super().__init__(message)
        self.result = result


@dataclass
class EpisodeStats:
    turns: int = 0  # replies sampled
    tool_calls: int = 0
    failed_calls: int = 0
    truncated: bool = False  # cut: max_turns, max_tokens, or its last reply at its token limit
    sampling_s: float = 0.0
    tool_s: float = 0.0


@dataclass
class Episode:
    """A finished conversation: training tokens, masks and logprobs, the messages, and what happened."""

    tokens: list[int] = field(default_factory=list)
    masks: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    final_reply: str = ""
    tool_results: list[tuple[ParsedToolCall, str, bool]] = field(default_factory=list)  # (call, result, failed)
    stats: EpisodeStats = field(default_factory=EpisodeStats)

    def extend(self, tokens: Sequence[int], logprobs: Sequence[float] | None = None) -> None:
        """Append tokens: the policy's (trained) when `logprobs` are given, else masked context."""
        self.tokens.extend(tokens)
        if logprobs is None:
            self.masks.extend([MASKED] * len(tokens))
            self.logprobs.extend([MASKED_LOGPROB] * len(tokens))
        else:
            self.masks.extend(tokens)
            self.logprobs.extend(logprobs)


class Template:
    """The chat template's text around the policy's replies, measured once from a reference rendering so any
    template that renders turns in order works (ChatML/Qwen, ...)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        reference = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "\x01"}]
        rendered = self._render(reference)
        self.closing = rendered[rendered.rindex("\x01") + 1 :]  # after a reply: "<|im_end|>\n" in ChatML
        self._reference = rendered

    def _render(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        assert isinstance(text, str)
        return text

    def prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        text = self._render(messages, tools=tools or None, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def reply_closing(self, sampled: Sampled) -> list[int]:
        """What closes a reply's turn: the rest of the closing after the end token the policy sampled, or all of it
        when the reply was cut off."""
        closing = self.closing
        ended = bool(sampled.tokens) and sampled.tokens[-1] == self.tokenizer.eos_token_id
        if ended and closing.startswith(self.tokenizer.eos_token):
            closing = closing[len(self.tokenizer.eos_token) :]
        return self.tokenizer.encode(closing, add_special_tokens=False) if closing else []

    def tool_turns(self, results: list[dict[str, Any]]) -> list[int]:
        """The tool turns and the next assistant turn's opening, as the template renders them."""
        rendered = self._render(
            [*self._reference_messages(), *results],
            add_generation_prompt=True,
        )
        if not rendered.startswith(self._reference):
            raise ValueError("the chat template does not render a conversation's turns in order")
        return self.tokenizer.encode(rendered[len(self._reference) :], add_special_tokens=False)

    @staticmethod
    def _reference_messages() -> list[dict[str, Any]]:
        return [{"role": "user", "content": "u"}, {"role": "assistant", "content": "\x01"}]


def tool_message(call: ParsedToolCall, result: str) -> dict[str, Any]:
    return {"role": "tool", "content": result, "name": call.name, **({"tool_call_id": call.id} if call.id else {})}


async def run_episode(
    template: Template,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    sample: Sampler,
    run_tool: ToolRunner,
    *,
    max_turns: int,
    max_reply_tokens: int,
    max_tokens: int,
) -> Episode:
    """One conversation (see the module's docstring)."""
    episode = Episode(messages=[dict(message) for message in messages])
    episode.extend(template.prompt(messages, tools))
    while True:
        room = min(max_reply_tokens, max_tokens - len(episode.tokens))
        if room <= 0:
            episode.stats.truncated = True
            break
        started = time.perf_counter()
        sampled = await sample(list(episode.tokens), room)
        episode.stats.sampling_s += time.perf_counter() - started
        episode.stats.turns += 1
        episode.extend(sampled.tokens, sampled.logprobs)
        text = template.tokenizer.decode(sampled.tokens, skip_special_tokens=True)
        parsed = split_tool_calls(text)
        episode.messages.append({"role": "assistant", "content": text})
        episode.final_reply = text
        if not parsed.tool_calls:  # the answer; a reply cut at its token limit may have been a call cut short
            episode.stats.truncated = sampled.finish_reason == "length"
            break
        episode.extend(template.reply_closing(sampled))
        if episode.stats.turns >= max_turns:
            episode.stats.truncated = True
            break
        results = await _run_calls(episode, parsed.tool_calls, run_tool)
        episode.messages.extend(results)
        episode.extend(template.tool_turns(results))
    if len(episode.tokens) > max_tokens:  # a tool turn pushed it over: what follows the last reply is cut
        episode.stats.truncated = True
        del episode.tokens[max_tokens:], episode.masks[max_tokens:], episode.logprobs[max_tokens:]
    return episode


async def _run_calls(episode: Episode, calls: list[ParsedToolCall], run_tool: ToolRunner) -> list[dict[str, Any]]:
    results = []
    for call in calls:
        episode.stats.tool_calls += 1
        started = time.perf_counter()
        try:
            result, failed = await run_tool(call), False
        except ToolCallFailed as error:
            result = error.result if error.result is not None else json.dumps({"error": str(error)})
            failed = True
        episode.stats.tool_s += time.perf_counter() - started
        episode.stats.failed_calls += failed
        episode.tool_results.append((call, result, failed))
        results.append(tool_message(call, result))
    return results


# Samples `n` replies continuing `input_ids`, each with at most `max_tokens` tokens.
SamplerOfN = Callable[[list[int], int, int], Awaitable[list[Sampled]]]


def coalesced(sample_n: SamplerOfN) -> Sampler:
    """One sampler for a group's episodes: the requests of one prompt made in the same pass of the event loop (a
    group's first turn: every episode of a task opens alike) go out as one request of `n` rows, so the prompt is
    sent and read once, as a single-turn group's is. Later turns differ and go out alone. Justified by
    `benchmarks/rollout_sampling.py` (a group of 8 tool episodes: 299 ms, against 505 ms with every turn its own
    request); delete it when the sampler reads a prompt once for its rows however they arrive and that benchmark
    shows no difference."""
    waiting: dict[tuple[tuple[int, ...], int], list[asyncio.Future[Sampled]]] = {}
    sending: set[asyncio.Task[None]] = set()  # held until done: the loop keeps only weak references to tasks

    async def send(key: tuple[tuple[int, ...], int]) -> None:
        futures = waiting.pop(key)
        try:
            replies = await sample_n(list(key[0]), key[1], len(futures))
        except Exception as error:  # every caller sees the request's failure
            for future in futures:
                if not future.done():
                    future.set_exception(error)
            return
        except BaseException:  # cancelled: so are its callers
            for future in futures:
                future.cancel()
            raise
        for future, reply in zip(futures, replies, strict=True):
            if not future.done():
                future.set_result(reply)

    def start(key: tuple[tuple[int, ...], int]) -> None:
        task = asyncio.get_running_loop().create_task(send(key))
        sending.add(task)
        task.add_done_callback(sending.discard)

    async def sample(input_ids: list[int], max_tokens: int) -> Sampled:
        loop = asyncio.get_running_loop()
        key = (tuple(input_ids), max_tokens)
        if key not in waiting:
            waiting[key] = []
            loop.call_soon(start, key)  # after the episodes already scheduled in this pass have asked too
        future: asyncio.Future[Sampled] = loop.create_future()
        waiting[key].append(future)
        return await future

    return sample


def server_sampler(server: Any, model: str, temperature: float, split: str = "train") -> Sampler:
    """A sampler over an Atropos ServerManager (`env.server`) whose server returns tokens and logprobs (the run's
    inference server, SGLang's `/generate`); a group's episodes share one (`coalesced`)."""

    async def sample_n(input_ids: list[int], max_tokens: int, n: int) -> list[Sampled]:
        _prompt, outputs, logprobs, finishes = await server.tokens_and_logprobs_completion(
            input_ids=input_ids, n=n, max_tokens=max_tokens, temperature=temperature, model=model, split=split
        )
        rows = zip(outputs, logprobs, finishes, strict=True)
        return [_sampled(tokens, values, finish) for tokens, values, finish in rows]

    return coalesced(sample_n)


def _sampled(tokens: Sequence[int], logprobs: Sequence[Any], finish: Any) -> Sampled:
    reason = finish.get("type", "stop") if isinstance(finish, Mapping) else str(finish or "stop")
    return Sampled(list(tokens), [float(value) for value in logprobs], reason)


async def run_group(episodes: Sequence[Awaitable[Episode]]) -> list[Episode]:
    """A group's episodes, concurrently (the inference server batches their turns)."""
    return list(await asyncio.gather(*episodes))


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Per-episode means of the turn statistics, as run metrics (docs/TOOL_ENVIRONMENTS.md#metrics)."""
    if not episodes:
        return {}
    count = len(episodes)
    calls = sum(episode.stats.tool_calls for episode in episodes)
    failed = sum(episode.stats.failed_calls for episode in episodes)
    return {
        "agent/turns_per_episode": sum(episode.stats.turns for episode in episodes) / count,
        "agent/tool_calls_per_episode": calls / count,
        "agent/failed_calls_per_episode": failed / count,
        "agent/failed_call_share": failed / calls if calls else 0.0,
        "agent/truncated_share": sum(episode.stats.truncated for episode in episodes) / count,
        "agent/sampling_s_per_episode": sum(episode.stats.sampling_s for episode in episodes) / count,
        "agent/tool_s_per_episode": sum(episode.stats.tool_s for episode in episodes) / count,
    }
