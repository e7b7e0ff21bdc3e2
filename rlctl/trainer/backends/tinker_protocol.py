"""Which version of the Tinker protocol a server speaks, and which parameters rlctl sends that it would ignore.

rlctl pins the `tinker` SDK (0.38), whose high-level calls assume the current protocol of the hosted service.
Self-hosted servers may speak an older one: SkyRL 0.4 implements the protocol of `tinker>=0.25,<0.26`. The
backend therefore uses one of two API subsets (docs/TRAINER.md, "Tinker protocols"):

- `current`: the SDK's high-level calls, as the hosted Tinker service expects them;
- `legacy`: the calls of the 0.25 protocol, still made through the pinned SDK: resume is `create_model` then
  `load_weights` addressed by model id, samples are read without per-sequence ids, and the session is not
  finished explicitly (it expires when its heartbeats stop).

`auto` (the default) asks the server: a self-hosted server (`TINKER_BASE_URL` set) whose OpenAPI document lists
the Tinker routes but not `/api/v1/sessions/{session_id}/finish`, which every SDK since 0.26 calls, speaks the
legacy protocol. A server that publishes no OpenAPI document, and the hosted service, get `current`.

The same document tells which of the parameters rlctl sends the server would drop: a request field that the
server's schema for that route does not declare is ignored by a pydantic server such as SkyRL's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from rlctl.trainer.config import TINKER_PROTOCOLS

log = logging.getLogger(__name__)

TINKER_ROUTE = "/api/v1/asample"
FINISH_SESSION_ROUTE = "/api/v1/sessions/{session_id}/finish"
DESCRIBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ServerDescription:
    """What a server publishes about itself in its OpenAPI document; empty when it publishes none."""

    document: dict[str, Any] = field(default_factory=dict)

    @property
    def published(self) -> bool:
        return bool(self.document.get("paths"))

    @property
    def routes(self) -> frozenset[str]:
        return frozenset(self.document.get("paths") or {})

    def declared_fields(self, route: str, location: tuple[str, ...]) -> frozenset[str] | None:
        """Fields the JSON body of POST `route` declares at `location` (nested field names), or None if undeclared."""
        operation = ((self.document.get("paths") or {}).get(route) or {}).get("post") or {}
        content = (operation.get("requestBody") or {}).get("content") or {}
        schema = self._resolve((content.get("application/json") or {}).get("schema"))
        for name in location:
            if schema is None:
                return None
            schema = self._resolve((schema.get("properties") or {}).get(name))
        if schema is None or "properties" not in schema:
            return None
        return frozenset(schema["properties"])

    def _resolve(self, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        """Follow `$ref`s and the `anyOf: [X, null]` of optional fields down to an object schema."""
        for _ in range(16):  # a bound, not a loop: schemas nest a few levels at most
            if not isinstance(schema, dict):
                return None
            if "$ref" in schema:
                reference = schema["$ref"]
                if not reference.startswith("#/components/schemas/"):
                    return None
                schema = ((self.document.get("components") or {}).get("schemas") or {}).get(reference.rsplit("/", 1)[1])
                continue
            options = [
                option for option in schema.get("anyOf") or schema.get("allOf") or [] if option != {"type": "null"}
            ]
            if "properties" not in schema and len(options) == 1:
                schema = options[0]
                continue
            return schema
        return None


def describe_server(base_url: str | None) -> ServerDescription:
    """The OpenAPI document of a self-hosted server; nothing for the hosted service or a server without one."""
    if not base_url:
        return ServerDescription()
    url = base_url.rstrip("/") + "/openapi.json"
    try:
        response = httpx.get(url, timeout=DESCRIBE_TIMEOUT_S)
        document = response.json() if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError) as error:
        log.info("no OpenAPI document at %s (%s)", url, error)
        return ServerDescription()
    return ServerDescription(document if isinstance(document, dict) else {})


def choose_protocol(configured: str, server: ServerDescription) -> tuple[str, str]:
    """(protocol, why): `configured` unless it is `auto`, else what the server's routes say."""
    if configured not in TINKER_PROTOCOLS:
        raise ValueError(f"tinker.protocol must be one of {TINKER_PROTOCOLS}, got {configured!r}")
    if configured != "auto":
        return configured, "set by tinker.protocol"
    if not server.published:
        return "current", "the server publishes no OpenAPI document"
    if TINKER_ROUTE in server.routes and FINISH_SESSION_ROUTE not in server.routes:
        return "legacy", f"the server's OpenAPI document has no {FINISH_SESSION_ROUTE} (tinker 0.25 protocol)"
    return "current", "the server's OpenAPI document lists the routes of the current protocol"


@dataclass(frozen=True)
class SentParameter:
    """One parameter rlctl puts in a request: `route`'s JSON body, at `location`, field `name`."""

    route: str
    location: tuple[str, ...]
    name: str
    value: Any

    @property
    def label(self) -> str:
        return ".".join((*self.location, self.name))


def ignored_parameters(server: ServerDescription, sent: Iterable[SentParameter]) -> list[SentParameter]:
    """The parameters whose field the server's schema for their route does not declare (it would drop them)."""
    ignored = []
    for parameter in sent:
        declared = server.declared_fields(parameter.route, parameter.location)
        if declared is not None and parameter.name not in declared:
            ignored.append(parameter)
    return ignored
