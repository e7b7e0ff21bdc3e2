"""Request ids and logging: text or JSON lines, with every configured secret scrubbed."""

from __future__ import annotations

import base64
import contextvars
import json
import logging
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
# The name of the token that acted (never the token): in the access log and the records it creates.
actor_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("actor", default=None)
# The acting token's scopes (their names); None for the service's own calls.
caller_scopes_var: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar("caller_scopes", default=None)

_STANDARD_RECORD_KEYS = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


MIN_ENCODED_CHARS = 8  # a shorter encoded fragment would match ordinary text; secrets are 16 characters or more


class Scrubber:
    """Replaces every copy of a secret in a text by `***`: the value itself, reversed, and base64-encoded (standard
    and URL-safe, at any of the three byte alignments it may have inside a longer encoded text)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        forms: set[str] = set()
        for secret in filter(None, secrets):
            forms.update((secret, secret[::-1]))
            forms.update(form for form in _base64_forms(secret.encode()) if len(form) >= MIN_ENCODED_CHARS)
        # Longest first: a form inside another is replaced after it, never cutting it in half.
        self.forms = sorted(forms, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for form in self.forms:
            if form in text:
                text = text.replace(form, "***")
        return text


def _base64_forms(secret: bytes) -> set[str]:
    """The base64 characters that depend on `secret`'s bytes alone, for each offset it may have in a longer
    encoded text: whole 4-character groups, those mixed with neighbouring bytes dropped."""
    forms: set[str] = set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + secret).decode()
        first = 4 if offset else 0  # the group holding the padding bytes is mixed
        last = 4 * ((offset + len(secret)) // 3)  # the last whole group of secret bytes
        core = encoded[first:last]
        forms.update((core, core.translate(_URLSAFE)))
    return forms


_URLSAFE = str.maketrans("+/", "-_")


def scrub_json(value: Any, scrub: Callable[[str], str]) -> Any:
    """Every string of a JSON-like value (keys included) scrubbed: what a model, a tool or a caller wrote may hold
    a secret."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {scrub_json(key, scrub): scrub_json(item, scrub) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [scrub_json(item, scrub) for item in value]
    return value


class SecretScrubber(logging.Filter):
    """Replaces any secret value in a log record's message (and its arguments) by `***`."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.scrub = Scrubber(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        message = self.scrub(record.getMessage())
        # One record is one line: a CR or LF from a request (a path with %0d%0a) cannot forge another.
        record.msg, record.args = escape_controls(message), None
        record.request_id = request_id_var.get() or "-"
        return True


_CONTROLS = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F) if code != 0x09}
_CONTROLS.update({0x0A: "\\n", 0x0D: "\\r"})


def escape_controls(text: str) -> str:
    """Control characters (but tab) written as escapes, so a log line holds no line break nor terminal escape."""
    return text.translate(_CONTROLS)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if request_id := getattr(record, "request_id", None):
            entry["request_id"] = request_id
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD_RECORD_KEYS})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str, fmt: str, secrets: Iterable[str]) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(SecretScrubber(secrets))
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
