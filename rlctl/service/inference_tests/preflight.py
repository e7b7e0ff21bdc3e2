"""Checks made before an inference test runs anything: which key its endpoint gets, and whether the tokenizer loads.

A key goes only to the endpoint it belongs to: `OPENROUTER_API_KEY` to OpenRouter's origin,
`RLCTL_INFERENCE_API_KEY` to `RLCTL_INFERENCE_BASE_URL`'s; any other URL a caller names gets no key at all, so a
request cannot send the server's keys elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from rlctl.service.errors import Conflict, ValidationFailed
from rlctl.service.settings import Settings

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
NO_KEY = "none"  # what a keyless endpoint is sent: the openai client insists on some key
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


class InferenceKeyMissing(Conflict):
    """The endpoint needs a key the server does not have (like BACKEND_UNAVAILABLE for runs)."""

    code = "INFERENCE_KEY_MISSING"


class TokenizerUnavailable(Conflict):
    """The locked tokenizer cannot be loaded here: the operator must fix RLCTL_TOKENIZER_NAME."""

    code = "TOKENIZER_UNAVAILABLE"


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    default_port = {"http": 80, "https": 443}.get(parts.scheme.lower())
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port or default_port


def validate_base_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # e.g. a port above 65535
        valid = False
    if not valid or "@" in parts.netloc:
        raise ValidationFailed(
            f"base_url must be an http(s) URL without credentials, e.g. https://openrouter.ai/api/v1; got {url!r}",
            {"field": "base_url"},
        )
    return url.rstrip("/")


def endpoint_key(settings: Settings, base_url: str) -> str | None:
    """The key this endpoint gets (None: it gets none); a missing key for a keyed endpoint is a 409."""
    if origin(base_url) == origin(settings.openrouter_base_url):
        if settings.openrouter_api_key is None:
            raise InferenceKeyMissing(
                "inference tests on OpenRouter need OPENROUTER_API_KEY in the server's environment; "
                "set it, or give a base_url of an endpoint that needs no key",
                {"base_url": base_url, "missing": "OPENROUTER_API_KEY"},
            )
        return settings.openrouter_api_key.get_secret_value()
    if settings.inference_base_url and origin(base_url) == origin(settings.inference_base_url):
        if settings.inference_api_key is None:
            raise InferenceKeyMissing(
                "this endpoint is RLCTL_INFERENCE_BASE_URL, whose key RLCTL_INFERENCE_API_KEY is not set",
                {"base_url": base_url, "missing": "RLCTL_INFERENCE_API_KEY"},
            )
        return settings.inference_api_key.get_secret_value()
    return None


def tokenizer_problem(name: str) -> str | None:
    """Why the tokenizer `name` cannot be loaded here, or None: a local directory, a cached or reachable hub id."""
    path = Path(name).expanduser()
    if path.is_dir():
        if any((path / file).is_file() for file in TOKENIZER_FILES):
            return None
        return f"the tokenizer directory {name} holds no tokenizer ({', '.join(TOKENIZER_FILES)})"
    if path.is_absolute() or name.startswith((".", "~")) or path.exists() or name.count("/") > 1:
        return f"the tokenizer directory {name} does not exist"
    return _hub_tokenizer_problem(name)


def _hub_tokenizer_problem(repo_id: str) -> str | None:
    import huggingface_hub
    from huggingface_hub.errors import HFValidationError

    try:
        if isinstance(huggingface_hub.try_to_load_from_cache(repo_id, "tokenizer_config.json"), str):
            return None
    except HFValidationError:
        return f"{repo_id!r} is neither a local directory nor a valid Hugging Face model id"
    if any(os.environ.get(variable, "").lower() in ("1", "true", "yes") for variable in OFFLINE_VARIABLES):
        return f"the tokenizer {repo_id} is not in the local Hugging Face cache and the hub is offline"
    try:
        if huggingface_hub.file_exists(repo_id, "tokenizer_config.json"):
            return None
    except Exception as error:  # noqa: BLE001 - any failure to reach the hub means: not loadable here
        return f"the tokenizer {repo_id} is not cached locally and the Hugging Face hub could not be reached ({error})"
    return f"the Hugging Face hub has no tokenizer {repo_id}"


def require_tokenizer(name: str) -> None:
    problem = tokenizer_problem(name)
    if problem:
        raise TokenizerUnavailable(
            f"{problem}; the operator sets RLCTL_TOKENIZER_NAME (offline: a local model directory, e.g. one made "
            "by `rlctl model init-tiny DIR`)",
            {"tokenizer_name": name},
        )
