"""A scripted OpenAI-compatible chat-completions server on loopback.

Only a stand-in for endpoints this machine cannot reach or cannot steer: the paid summariser (OpenRouter) and a
tool-calling agent model (the tiny local model emits random text and never calls a tool). It speaks the real
protocol over real HTTP, so the real `openai` client talks to it; it records each request it gets.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# (request body) -> (status, assistant message or error body)
Script = Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]


@dataclass
class ChatServer:
    base_url: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)


@contextmanager
def chat_server(script: Script) -> Iterator[ChatServer]:
    state = ChatServer(base_url="")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                state.requests.append(body)
                state.authorizations.append(self.headers.get("Authorization", ""))
            status, message = script(body)
            payload = message if status != 200 else _completion(body, message)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _completion(request: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 0,
        "model": request.get("model", ""),
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
