"""Summarisers: the deterministic extractive one, and the OpenAI-compatible one against a real HTTP server."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rlctl.service.datasets.summary_client import DEFAULT_SUMMARY_MODEL, OpenAICompatibleSummarizer
from rlctl.trajectories.compression import (
    SUMMARIZATION_FAILED,
    SUMMARY_PREFIX,
    CompressionConfig,
    compress_record,
)
from rlctl.trajectories.summarizers import ExtractiveSummarizer, SummarizationError
from rlctl.trajectories.tokens import ApproximateTokenCounter


class ChatServer:
    """A loopback chat-completions server that plays a script of replies: ("ok", text), ("status", code) or
    ("slow", seconds); it records every request body it received."""

    def __init__(self) -> None:
        self.script: list[tuple[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server hook name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                kind, value = server.script.pop(0) if server.script else ("ok", "default summary")
                if kind == "slow":
                    time.sleep(value)
                    kind, value = "ok", "late summary"
                if kind == "status":
                    self._reply(value, {"error": {"message": "scripted failure", "type": "server_error"}})
                else:
                    self._reply(200, completion(body["model"], value))

            def _reply(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client timed out
                    self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> ChatServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def completion(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    with ChatServer() as server:
        yield server


def summarizer_for(server: ChatServer, **options: Any) -> OpenAICompatibleSummarizer:
    return OpenAICompatibleSummarizer(server.base_url, api_key="test-key", backoff_s=0.01, **options)


def test_the_model_is_asked_with_the_default_model_and_temperature(chat_server, real_records) -> None:
    chat_server.script = [("ok", "The agent listed files and fixed the parser.")]
    turns = real_records["openhands-multi-swe-bench-output.jsonl"][0].turns[4:10]
    text = summarizer_for(chat_server).summarize(turns, 200)
    assert text == "The agent listed files and fixed the parser."
    [request] = chat_server.requests
    assert request["model"] == DEFAULT_SUMMARY_MODEL == "google/gemini-3-flash-preview"
    assert request["temperature"] == 0.3 and request["max_tokens"] == 800
    assert "200 tokens" in request["messages"][0]["content"]
    assert "[gpt]" in request["messages"][1]["content"] and "[tool]" in request["messages"][1]["content"]


def test_transient_failures_are_retried_with_backoff(chat_server, real_records) -> None:
    chat_server.script = [("status", 500), ("status", 429), ("ok", "third time lucky")]
    turns = real_records["tau-bench-gpt-4o-airline.json"][0].turns[2:6]
    assert summarizer_for(chat_server, max_retries=3).summarize(turns, 100) == "third time lucky"
    assert len(chat_server.requests) == 3


def test_retries_run_out_into_a_summarization_error(chat_server, real_records) -> None:
    chat_server.script = [("status", 503)] * 3
    turns = real_records["tau-bench-gpt-4o-airline.json"][0].turns[2:6]
    with pytest.raises(SummarizationError, match="3 attempts"):
        summarizer_for(chat_server, max_retries=2).summarize(turns, 100)
    assert len(chat_server.requests) == 3


def test_a_refused_request_is_not_retried(chat_server, real_records) -> None:
    chat_server.script = [("status", 401), ("ok", "never reached")]
    turns = real_records["tau-bench-gpt-4o-airline.json"][0].turns[2:6]
    with pytest.raises(SummarizationError, match="401"):
        summarizer_for(chat_server).summarize(turns, 100)
    assert len(chat_server.requests) == 1


def test_an_empty_answer_counts_as_a_failed_attempt(chat_server, real_records) -> None:
    chat_server.script = [("ok", "  "), ("ok", "a real summary")]
    turns = real_records["tau-bench-gpt-4o-airline.json"][0].turns[2:6]
    assert summarizer_for(chat_server).summarize(turns, 100) == "a real summary"


def test_a_time_out_keeps_the_record_whole_and_is_counted(chat_server, real_records) -> None:
    chat_server.script = [("slow", 3.0)] * 3
    record = real_records["openhands-multi-swe-bench-output.jsonl"][0]
    started = time.monotonic()
    summarizer = summarizer_for(chat_server, timeout_s=0.5, max_retries=2)
    result = compress_record(record, ApproximateTokenCounter(), summarizer, CompressionConfig())
    assert time.monotonic() - started < 2.5  # the per-record time-out bounds every attempt together
    assert result.record is record
    assert result.metrics.skipped_reason == SUMMARIZATION_FAILED and result.metrics.summarization_errors == 1
    assert "SummarizationError" in (result.metrics.error or "")


def test_compression_with_the_model_summary(chat_server, real_records) -> None:
    chat_server.script = [("ok", "The agent explored the repository and edited parser.c.")]
    record = real_records["openhands-multi-swe-bench-output.jsonl"][0]
    counter = ApproximateTokenCounter()
    result = compress_record(record, counter, summarizer_for(chat_server), CompressionConfig())
    assert result.metrics.was_compressed and not result.metrics.still_over_limit
    summary_turns = [t for t in result.record.turns if t.value.startswith(SUMMARY_PREFIX)]
    assert summary_turns[0].value == SUMMARY_PREFIX + "The agent explored the repository and edited parser.c."


def test_an_unreachable_server_is_a_summarization_error(real_records) -> None:
    with ChatServer() as server:
        url = server.base_url
    summarizer = OpenAICompatibleSummarizer(url, "k", max_retries=1, backoff_s=0.01, timeout_s=5)
    with pytest.raises(SummarizationError):
        summarizer.summarize(real_records["tau-bench-gpt-4o-airline.json"][0].turns[:3], 50)


def test_extractive_summary_is_deterministic_and_names_tools_and_failures(real_records) -> None:
    turns = real_records["openhands-multi-swe-bench-output.jsonl"][1].turns[4:40]
    summarizer = ExtractiveSummarizer()
    first, second = summarizer.summarize(turns, 300), summarizer.summarize(turns, 300)
    assert first == second
    assert first.startswith("36 turns summarised. Tool calls:")
    assert "str_replace_editor" in first and "failed" in first
    assert len(first) <= 300 * ExtractiveSummarizer.chars_per_token + 40
