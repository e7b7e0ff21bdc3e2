"""A thin HTTP client of the rlctl API: the base URL, the bearer token, and the one error body."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8080"
USER_AGENT = "rlctl-cli/0.1.0"


class ClientError(Exception):
    """Anything that ends a command with a message: an error answer, or no answer at all."""

    exit_code = 1

    def __init__(self, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.body = body


class Unreachable(ClientError):
    exit_code = 3


class ApiError(ClientError):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        found = body.get("error")
        error: dict[str, Any] = found if isinstance(found, dict) else {}
        self.status = status
        self.code = str(error.get("code", f"HTTP_{status}"))
        request_id = f" (request id {error['request_id']})" if error.get("request_id") else ""
        reasons = "".join(f"\n  {line}" for line in field_reasons(error.get("details")))
        super().__init__(f"{status} {self.code}: {error.get('message', 'no message')}{request_id}{reasons}", body)


def field_reasons(details: Any) -> list[str]:
    """`field: reason` for each refused field of a validation error (its `details.errors`), the body's own
    location prefix left out: `config.group_size: Input should be greater than 0`."""
    errors = details.get("errors") if isinstance(details, dict) else None
    lines = []
    for error in errors if isinstance(errors, list) else []:
        if not isinstance(error, dict):
            continue
        location = [str(part) for part in error.get("location", [])]
        if location[:1] in (["body"], ["query"], ["path"], ["header"]) and len(location) > 1:
            location = location[1:]
        lines.append(f"{'.'.join(location) or 'request'}: {error.get('message', 'not valid')}")
    return lines


class RateLimitedError(ApiError):
    exit_code = 75  # EX_TEMPFAIL: try again later


class ApiClient:
    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 60.0) -> None:
        headers = {"User-Agent": USER_AGENT}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any = None, **params: Any) -> Any:
        return self.request("POST", path, params=params, json=body)

    def request(self, method: str, path: str, params: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, params=_drop_none(params), **kwargs)
        except httpx.HTTPError as exc:
            raise Unreachable(f"cannot reach {self.base_url}: {exc}") from exc
        _raise_for_error(response)
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.text

    def upload(self, path: str, chunks: Iterable[bytes], size: int, content_type: str, **params: Any) -> Any:
        """A raw body, streamed (never read whole into memory)."""
        headers = {"Content-Type": content_type, "Content-Length": str(size)}
        return self.request("POST", path, params=params, content=chunks, headers=headers)

    def stream(self, path: str, **params: Any) -> Iterator[bytes]:
        """A response body as it arrives (log follow, exports): no read time-out, the server decides the end."""
        timeout = httpx.Timeout(self.http.timeout.connect, read=None)
        try:
            with self.http.stream("GET", path, params=_drop_none(params), timeout=timeout) as response:
                if response.status_code >= 400:
                    response.read()
                    _raise_for_error(response)
                yield from response.iter_bytes()
        except httpx.HTTPError as exc:
            raise Unreachable(f"lost the connection to {self.base_url}: {exc}") from exc


def _drop_none(params: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (params or {}).items() if v is not None}


def _raise_for_error(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = {"error": {"code": f"HTTP_{response.status_code}", "message": response.text[:500]}}
    if not isinstance(body, dict):
        body = {"error": {"code": f"HTTP_{response.status_code}", "message": str(body)[:500]}}
    error_class = RateLimitedError if response.status_code == 429 else ApiError
    raise error_class(response.status_code, body)
