"""The inference server over real HTTP on loopback: SGLang's /generate as atroposlib calls it, and the OpenAI
API as the official `openai` client calls it."""

from __future__ import annotations

import asyncio
import string
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from rlctl.trainer.backends.local import LocalBackend
from rlctl.trainer.failures import SAMPLING_FAILED, BudgetExhausted, FailureBudget
from rlctl.trainer.inference_server import InferenceServer, create_app
from tests.support.endpoints import cpu_backend
from tests.support.live import free_port
from tests.support.waiting import REQUEST_TIMEOUT

ALIAS = "tiny/alias-model"


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LocalBackend]]:
    port = free_port()
    backend = cpu_backend(tiny_model_dir, tmp_path_factory.mktemp("run"), port)
    backend.publish_weights(7)
    server = InferenceServer(create_app(backend, model_names=[ALIAS]), "127.0.0.1", port)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", backend
    finally:
        server.stop()
        backend.close()


def test_health_and_models(served: tuple[str, LocalBackend]) -> None:
    url, backend = served
    health = httpx.get(f"{url}/health", timeout=REQUEST_TIMEOUT).json()
    assert health["status"] == "ok" and health["weights_version"] == 7
    models = httpx.get(f"{url}/v1/models", timeout=REQUEST_TIMEOUT).json()
    assert [entry["id"] for entry in models["data"]] == [ALIAS, backend.model_name]  # the short name first


def test_generate_answers_in_sglang_shape(served: tuple[str, LocalBackend]) -> None:
    url, backend = served
    prompt = backend.tokenizer.encode("Echo: 12", add_special_tokens=False)
    params = {"n": 3, "max_new_tokens": 5, "temperature": 1.0, "stop": None}
    many = httpx.post(f"{url}/generate", json={"input_ids": prompt, "sampling_params": params}, timeout=120).json()
    assert isinstance(many, list) and len(many) == 3
    for result in many:
        meta = result["meta_info"]
        triples = meta["output_token_logprobs"]
        assert 1 <= len(triples) <= 5 == params["max_new_tokens"]
        assert all(lp <= 0 and isinstance(tid, int) and text is None for lp, tid, text in triples)
        assert meta["completion_tokens"] == len(triples) and meta["prompt_tokens"] == len(prompt)
        assert meta["finish_reason"]["type"] in ("stop", "length")
        if meta["finish_reason"]["type"] == "length":
            assert len(triples) == 5
    one = httpx.post(f"{url}/generate", json={"input_ids": prompt, "sampling_params": {"n": 1}}, timeout=120).json()
    assert isinstance(one, dict) and "meta_info" in one  # a single object for n = 1, as SGLang answers
    served_counts = httpx.get(f"{url}/health", timeout=REQUEST_TIMEOUT).json()["served"]
    assert served_counts["generate"] >= 2 and served_counts["completions"] >= 4


def test_atroposlib_sglang_client_gets_tokens_and_logprobs(served: tuple[str, LocalBackend]) -> None:
    from atroposlib.envs.server_handling.server_baseline import APIServerConfig
    from atroposlib.envs.server_handling.sglang_server import SGLangServer

    url, backend = served
    config = APIServerConfig(
        model_name=backend.model_name,
        base_url=f"{url}/v1",
        api_key="local",
        server_type="sglang",
        health_check=False,
    )
    client = SGLangServer(config)
    prompt_tokens, outputs, logprobs, finish_reasons = asyncio.run(
        client.tokens_and_logprobs_completion(prompt="Echo: 7", n=4, max_tokens=6, temperature=1.0)
    )
    assert prompt_tokens == backend.tokenizer.encode("Echo: 7")
    assert len(outputs) == len(logprobs) == len(finish_reasons) == 4
    assert all(len(tokens) == len(values) >= 1 for tokens, values in zip(outputs, logprobs, strict=True))
    assert all(reason["type"] in ("stop", "length") for reason in finish_reasons)


def test_openai_client_chat_has_usage_and_logprobs(served: tuple[str, LocalBackend]) -> None:
    url, backend = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="local", max_retries=0)
    messages = [{"role": "user", "content": "Echo: 4821"}]
    response = client.chat.completions.create(
        model=backend.model_name, messages=messages, max_tokens=4, n=2, logprobs=True, top_logprobs=3
    )
    template = backend.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert response.usage.prompt_tokens == len(backend.tokenizer.encode(template, add_special_tokens=False))
    assert len(response.choices) == 2
    sampled = 0
    for choice in response.choices:
        content = choice.logprobs.content
        sampled += len(content)
        assert 1 <= len(content) <= 4
        assert all(entry.logprob <= 0 and len(entry.top_logprobs) == 3 for entry in content)
        assert all(entry.top_logprobs[0].logprob >= entry.logprob for entry in content)
        assert choice.finish_reason in ("stop", "length")
        if choice.finish_reason == "length" or len(content) < 4:
            assert (choice.finish_reason == "length") == (len(content) == 4)
    assert response.usage.completion_tokens == sampled
    assert response.usage.total_tokens == response.usage.prompt_tokens + sampled


def test_openai_completions_stop_strings_and_logprobs(served: tuple[str, LocalBackend]) -> None:
    url, backend = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="local", max_retries=0)
    every_character = list(string.printable)
    stopped = client.completions.create(
        model=backend.model_name, prompt="Echo: 5", max_tokens=8, n=3, stop=every_character, logprobs=2
    )
    for choice in stopped.choices:
        assert choice.finish_reason == "stop"
        assert choice.text == ""  # the stop string is cut from the text
        assert len(choice.logprobs.token_logprobs) == 1 and len(choice.logprobs.top_logprobs[0]) <= 2
    assert stopped.usage.completion_tokens == 3


def test_bad_requests_get_openai_style_errors(served: tuple[str, LocalBackend]) -> None:
    url, backend = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="local", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="echo is not supported"):
        client.completions.create(model=backend.model_name, prompt="x", echo=True)
    too_long = httpx.post(
        f"{url}/generate", json={"input_ids": [5] * 5000, "sampling_params": {"n": 1}}, timeout=REQUEST_TIMEOUT
    )
    assert too_long.status_code == 400 and "context" in too_long.json()["error"]["message"]


def test_unknown_model_is_a_404_and_served_names_answer(served: tuple[str, LocalBackend]) -> None:
    url, backend = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="local", max_retries=0)
    messages = [{"role": "user", "content": "Echo: 1"}]
    with pytest.raises(openai.NotFoundError, match="does not exist") as raised:
        client.chat.completions.create(model="no-such/model", messages=messages, max_tokens=2)
    assert raised.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such/model", prompt="x", max_tokens=2)
    aliased = client.chat.completions.create(model=ALIAS, messages=messages, max_tokens=2)
    assert aliased.model == ALIAS and len(aliased.choices) == 1
    unnamed = httpx.post(
        f"{url}/v1/chat/completions", json={"messages": messages, "max_tokens": 2}, timeout=REQUEST_TIMEOUT
    ).json()
    assert unnamed["model"] == backend.model_name


def test_openai_client_streams_chat_with_usage_in_the_last_chunk(served: tuple[str, LocalBackend]) -> None:
    url, backend = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="local", max_retries=0)
    messages = [{"role": "user", "content": "Echo: 93"}]
    chunks = list(
        client.chat.completions.create(
            model=ALIAS, messages=messages, max_tokens=4, n=2, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks, "a stream with no chunks"
    by_choice: dict[int, list] = {}
    for chunk in chunks[:-1]:
        assert chunk.object == "chat.completion.chunk" and chunk.usage is None and chunk.model == ALIAS
        for choice in chunk.choices:
            by_choice.setdefault(choice.index, []).append(choice)
    assert sorted(by_choice) == [0, 1]
    completion_tokens = 0
    for choices in by_choice.values():
        assert choices[0].delta.role == "assistant"
        assert choices[-1].finish_reason in ("stop", "length")
        text = "".join(choice.delta.content or "" for choice in choices)
        completion_tokens += len(backend.tokenizer.encode(text, add_special_tokens=False)) if text else 0
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert last.usage.completion_tokens >= 2  # at least one token per choice

    plain = list(client.completions.create(model=ALIAS, prompt="Echo: 5", max_tokens=3, stream=True))
    assert plain and plain[-1].choices[0].finish_reason in ("stop", "length")
    assert all(chunk.usage is None for chunk in plain)


def test_content_parts_tool_calls_and_tools_reach_the_chat_template(served: tuple[str, LocalBackend]) -> None:
    url, backend = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="local", max_retries=0)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup_number",
                "description": "Look a number up.",
                "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            },
        }
    ]
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup_number", "arguments": '{"n": 42}'}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Echo: "}, {"type": "text", "text": "42"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "forty-two"},
    ]
    response = client.chat.completions.create(model=ALIAS, messages=messages, tools=tools, max_tokens=2)
    rendered = backend.tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "Echo: 42"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "id": "call_1", "function": {"name": "lookup_number", "arguments": {"n": 42}}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "forty-two"},
        ],
        tools=tools,  # as OpenAI sends them: {"type": "function", "function": {...}}
        tokenize=False,
        add_generation_prompt=True,
    )
    assert "lookup_number" in rendered and "forty-two" in rendered and '"n": 42' in rendered
    assert response.usage.prompt_tokens == len(backend.tokenizer.encode(rendered, add_special_tokens=False))
    with pytest.raises(openai.BadRequestError, match="only text content parts"):
        client.chat.completions.create(
            model=ALIAS,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
        )


def test_errors_are_openai_shaped_and_models_can_be_retrieved(served: tuple[str, LocalBackend]) -> None:
    url, backend = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="local", max_retries=0)
    assert client.models.retrieve(ALIAS).id == ALIAS
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("no-such-model")
    malformed = httpx.post(
        f"{url}/v1/chat/completions", json={"messages": [{"content": "no role"}]}, timeout=REQUEST_TIMEOUT
    )
    assert malformed.status_code == 400
    error = malformed.json()["error"]
    assert error["type"] == "invalid_request_error" and "messages.0.role" in error["message"]
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model=ALIAS, messages=[])
    missing = httpx.get(f"{url}/v1/no-such-endpoint", timeout=REQUEST_TIMEOUT)
    assert missing.status_code == 404 and "error" in missing.json()


class _FailingBackend:
    """The served backend with sampling broken, as an upstream fault would break it."""

    def __init__(self, backend: LocalBackend) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> object:
        return getattr(self._backend, name)

    def sample(self, request: object) -> list:
        raise ConnectionError("the sampling service went away")


def test_backend_failures_are_502_in_openai_shape_and_count_against_the_budget(
    served: tuple[str, LocalBackend],
) -> None:
    _url, backend = served
    budget = FailureBudget(SAMPLING_FAILED, 2, "sampling calls")
    port = free_port()
    server = InferenceServer(create_app(_FailingBackend(backend), sampling_budget=budget), "127.0.0.1", port)  # type: ignore[arg-type]
    server.start()
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="local", max_retries=0)
        for _ in range(2):
            with pytest.raises(openai.APIStatusError) as raised:
                client.chat.completions.create(
                    model=backend.model_name, messages=[{"role": "user", "content": "x"}], max_tokens=2, stream=True
                )
            assert raised.value.status_code == 502
            assert raised.value.body["code"] == "backend_error" and "went away" in raised.value.body["message"]
    finally:
        server.stop()
    with pytest.raises(BudgetExhausted, match="2 consecutive sampling calls failed"):
        budget.check()
    assert "ConnectionError" in (budget.state().last_error or "")
