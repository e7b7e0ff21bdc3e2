"""Structured tool calls from rlctl's OpenAI-compatible server, as the official `openai` client reads them: a real
`rlctl model serve` process serving a run's checkpoint of a tiny model fitted to answer with one tool call
(tests/support/fitted_model.py), under the checkpoint's short id; and the server's refusals of malformed requests,
each with its stable code."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from rlctl.trainer.evaluate import backend_for
from tests.conftest import build_settings
from tests.support.databases import MigratedDatabases, database_kinds, fresh_database
from tests.support.fitted_model import WEATHER_PROMPT, WEATHER_TOOL, fitted_tool_call_model
from tests.support.live import in_process_service
from tests.support.served_model import served_model
from tests.support.waiting import REQUEST_TIMEOUT, wait_until

RUN_ID = "run-fitted"
STEP = 3
SHORT_ID = f"{RUN_ID}/step-{STEP}"
ASK = [{"role": "user", "content": WEATHER_PROMPT}]


@pytest.fixture(scope="module")
def served_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The fitted model served with a checkpoint of a run laid out as the service keeps it
    (`runs/{id}/checkpoints/step_N`); a fresh adapter, so it answers as the fitted model does."""
    model = fitted_tool_call_model()
    run_dir = tmp_path_factory.mktemp("data") / "runs" / RUN_ID
    backend = backend_for({"base_model": str(model), "lora_rank": 4, "device": "cpu"}, None, str(run_dir))
    try:
        checkpoint = backend.save_checkpoint(STEP).path
    finally:
        backend.close()
    with served_model(str(model), "--adapter", checkpoint) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def client(served_checkpoint: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{served_checkpoint}/v1", api_key="unused", max_retries=0) as client:
        yield client


def ask(client: openai.OpenAI, **extra: Any) -> Any:
    # 100 tokens: the fitted call is 81 characters (one token each) and the end of the turn
    parameters = {"model": SHORT_ID, "messages": ASK, "tools": [WEATHER_TOOL], "temperature": 0, "max_tokens": 100}
    return client.chat.completions.create(**{**parameters, **extra})


@pytest.fixture(scope="module")
def first_reply(client: openai.OpenAI) -> Any:
    return ask(client)


def test_the_checkpoint_is_offered_under_its_short_id(served_checkpoint: str) -> None:
    models = httpx.get(f"{served_checkpoint}/v1/models", timeout=REQUEST_TIMEOUT).json()
    ids = [entry["id"] for entry in models["data"]]
    assert ids[0] == SHORT_ID and len(ids) == 2 and Path(ids[1]).is_absolute()  # then the base model's path


def test_an_inference_test_names_the_checkpoint_by_its_short_id(
    served_checkpoint: str, tmp_path: Path, session_databases: MigratedDatabases
) -> None:
    # The absolute path the server also answers to is not a model id POST /inference-tests takes (422).
    with fresh_database(database_kinds()[-1], tmp_path, session_databases) as url:
        settings = build_settings(tmp_path / "var", url, tokenizer_name=str(fitted_tool_call_model()))
        with in_process_service(settings) as live, live.client() as service:
            body = {
                "environment": "echo",
                "num_steps": 1,
                "group_size": 2,
                "models": [SHORT_ID],
                "base_url": f"{served_checkpoint}/v1",
            }
            created = service.post("/inference-tests", json=body)
            assert created.status_code == 202, created.text

            def ended() -> dict[str, Any] | None:
                test = service.get(f"/inference-tests/{created.json()['id']}").json()
                return test if test["status"] in ("succeeded", "failed", "cancelled") else None

            test = wait_until(ended, timeout=240, message="inference test ends")
    assert test["status"] == "succeeded", test["error"]
    [result] = test["result"]["models_tested"]
    assert result["model"] == SHORT_ID and result["status"] == "succeeded" and result["total_completions"] == 2


def test_a_tool_call_comes_back_structured(first_reply: Any) -> None:
    choice = first_reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None  # the reply was the call alone
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_a_streamed_tool_call_arrives_as_delta_tool_calls(client: openai.OpenAI) -> None:
    calls: dict[int, dict[str, str]] = {}
    finish, content = None, ""
    for chunk in ask(client, stream=True):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            entry["name"] += delta.function.name or ""
            entry["arguments"] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    assert finish == "tool_calls" and content == ""
    assert [call["name"] for call in calls.values()] == ["get_weather"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}


def test_the_call_and_its_result_continue_the_conversation(client: openai.OpenAI, first_reply: Any) -> None:
    first = first_reply.choices[0].message
    follow_up = [
        *ASK,
        first.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "sunny, 21 °C"},
    ]
    answer = client.chat.completions.create(
        model=SHORT_ID, messages=follow_up, tools=[WEATHER_TOOL], temperature=0, max_tokens=8
    )
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_tool_choice_none_returns_text(client: openai.OpenAI) -> None:
    choice = ask(client, tool_choice="none", max_tokens=8).choices[0]
    assert choice.message.tool_calls is None and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    named = ask(client, tool_choice={"type": "function", "function": {"name": "get_weather"}}).choices[0]
    assert named.message.tool_calls[0].function.name == "get_weather"


def test_without_tools_the_reply_is_text(client: openai.OpenAI) -> None:
    choice = client.chat.completions.create(model=SHORT_ID, messages=ASK, temperature=0, max_tokens=8).choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"messages": [{"role": "robot", "content": "hi"}]}, "invalid_role"),
        ({"temperature": 5}, "invalid_temperature"),
        ({"temperature": -0.5}, "invalid_temperature"),
        ({"presence_penalty": 3}, "invalid_penalty"),
        ({"frequency_penalty": -2.5}, "invalid_penalty"),
        ({"presence_penalty": 0.5}, "unsupported_parameter"),
        ({"tool_choice": "sometimes"}, "invalid_tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "no_such_tool"}}}, "invalid_tool_choice"),
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "invalid_tools"),
        ({"tools": None, "tool_choice": "required"}, "invalid_tool_choice"),
    ],
)
def test_malformed_requests_are_400s_with_stable_codes(served_checkpoint: str, change: dict, code: str) -> None:
    body = {"model": SHORT_ID, "messages": ASK, "tools": [WEATHER_TOOL], "max_tokens": 4, **change}
    response = httpx.post(f"{served_checkpoint}/v1/chat/completions", json=body, timeout=REQUEST_TIMEOUT)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error"
    assert error["param"] is not None
