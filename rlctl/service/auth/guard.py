"""Authentication and scope checks of HTTP requests (docs/AUTH.md).

Every protected route declares the scope it needs with one of READ, OPERATE or ADMIN as its `openapi_extra`;
a protected route that declares none needs `admin` (fail closed), and a test fails on it. The AuthenticationGate
alone checks them, before the route runs: declarations, not dependencies, so that FastAPI resolves nothing for
authentication on a request (resolving `authenticate`, its bearer scheme and a scope check cost a run's record a
fifth of its CPU, 0.07 of 0.34 ms: benchmarks/read_cpu.py).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.security import HTTPBearer
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Send
from starlette.types import Scope as ASGIScope

from rlctl.service.auth.scopes import Scope, allows
from rlctl.service.auth.tokens import ANONYMOUS, ENV_TOKEN_NAME, Principal, TokenFileError, TokenStore, find_token
from rlctl.service.errors import InsufficientScope, PayloadTooLarge, ServiceError, Unauthorized, Unavailable
from rlctl.service.http import error_response
from rlctl.service.observability import actor_var, caller_scopes_var
from rlctl.service.settings import Settings

logger = logging.getLogger("rlctl.auth")
BEARER = "HTTPBearer"  # the scheme's name in the OpenAPI document
SCOPE_FIELD = "x-required-scope"  # a protected operation's scope in the OpenAPI document
ROUTES_KEPT = 4096  # paths whose route the gate keeps (AuthenticationGate._route)
bearer_scheme = HTTPBearer(auto_error=False, description="RLCTL_API_TOKEN, or a token of the tokens file")
MISSING_TOKEN = "missing bearer token: send 'Authorization: Bearer <token>'"


def identify(settings: Settings, tokens: TokenStore, authorization: str | None) -> Principal:
    """The principal of an Authorization header value; raises Unauthorized (401) for a missing or unknown token."""
    scheme, _, given = (authorization or "").partition(" ")
    given = given.strip() if scheme.lower() == "bearer" else ""
    if given and settings.api_token is not None and token_matches(given, settings.api_token.get_secret_value()):
        return Principal(ENV_TOKEN_NAME, (Scope.ADMIN,))  # before the file: it still works when the file is broken
    try:
        entries = tokens.read()
    except TokenFileError as exc:
        # Fail closed: a broken file must not turn a server with no RLCTL_API_TOKEN into an open one.
        logger.error("%s", exc)
        raise Unavailable("the tokens file cannot be read; see the service log") from exc
    if is_open(settings, tokens_file=entries is not None):
        return ANONYMOUS
    if not given:
        raise Unauthorized(MISSING_TOKEN)
    principal = find_token(entries or (), given)
    if principal is None:
        raise Unauthorized("unknown or revoked bearer token")
    return principal


def is_open(settings: Settings, *, tokens_file: bool) -> bool:
    """Whether every call is anonymous: no RLCTL_API_TOKEN and no tokens file (an empty file still closes the
    server, so that revoking the last token never opens it)."""
    return settings.api_token is None and not tokens_file


def require(principal: Principal, needed: Scope, what: str) -> None:
    if not allows(principal.scopes, needed):
        raise InsufficientScope(
            f"the token {principal.name!r} lacks the scope {needed.value!r} that {what} needs",
            {"required_scope": needed.value, "token": principal.name, "scopes": [s.value for s in principal.scopes]},
        )


def remember(scope: ASGIScope, principal: Principal) -> None:
    """The acting token: for the route (`CurrentPrincipal`), the access log (the request's state) and the records
    the request creates (set before the route runs, so its worker threads inherit them)."""
    state = scope.setdefault("state", {})
    state["principal"] = principal
    state["token_name"] = principal.name
    actor_var.set(principal.name)
    caller_scopes_var.set(frozenset(scope.value for scope in principal.scopes))


async def current_principal(request: Request) -> Principal:
    """The caller the gate identified (a route behind the token only). async: FastAPI runs a plain `def`
    dependency in a worker thread."""
    principal: Principal = request.state.principal
    return principal


def declared(scope: Scope) -> dict[str, Any]:
    """A protected route's declaration (its `openapi_extra`): the token it takes and the scope it needs, both
    shown in the OpenAPI document."""
    return {"security": [{BEARER: []}], SCOPE_FIELD: scope.value}


def route_scope(route: Any) -> Scope | None:
    """The scope a route declares, if any."""
    value = (getattr(route, "openapi_extra", None) or {}).get(SCOPE_FIELD)
    return Scope(value) if value is not None else None


def document_bearer(app: FastAPI) -> None:
    """The OpenAPI document names the bearer scheme the routes' declarations refer to (FastAPI adds a scheme only
    for a dependency, which a declaration is not)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            schemes = document.setdefault("components", {}).setdefault("securitySchemes", {})
            schemes[BEARER] = bearer_scheme.model.model_dump(mode="json", by_alias=True, exclude_none=True)
        return build()

    app.openapi = openapi  # type: ignore[method-assign]


def token_matches(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


READ = declared(Scope.READ)
OPERATE = declared(Scope.OPERATE)
ADMIN = declared(Scope.ADMIN)
CurrentPrincipal = Depends(current_principal)


class AuthenticationGate:
    """Pure ASGI, outside the routes: answers 401/403 from the headers alone, before a byte of the body is read
    (FastAPI parses a JSON body before it resolves dependencies, so eight unauthenticated 16 MB posts once held
    the interpreter for seconds), and bounds the body bytes each caller has in flight over all its requests.

    Protected routes are those of the `protected` routers: the gate checks the scope each declares and names the
    caller for the request (`remember`); `self_checked` ones (`/mcp`) check scopes per tool themselves, the gate only
    identifies the caller. Every other route (health, docs, the UI page, Ray nodes' calls) is the caller's address.
    The budget counts bodies held whole in memory (JSON); `streamed` names the requests whose body goes to disk as it
    arrives (uploads, with their own limit), which it does not count.
    """

    def __init__(
        self,
        app: ASGIApp,
        context: Any,
        routes: Sequence[BaseRoute],
        protected: Collection[Any],
        self_checked: Collection[BaseRoute] = (),
        streamed: Callable[[ASGIScope], bool] = lambda _scope: False,
    ) -> None:
        self.app = app
        self.streamed = streamed
        self.context = context
        self.routes = routes  # the app's, in its order: the route the router will pick is the one checked
        self.protected = {id(router) for router in protected}  # the routers included behind the token
        self.self_checked = {id(route) for route in self_checked}
        self.in_flight: dict[str, int] = {}  # caller -> body bytes received by its unfinished requests
        self._found: dict[tuple[int, Any, Any], tuple[BaseRoute | None, bool]] = {}  # `_route`'s, oldest first

    async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            caller = self._caller(scope)
            streamed = self.streamed(scope)
            if not streamed:
                self._admit(caller, scope)
        except ServiceError as error:
            await error_response(error)(scope, _no_body, send)  # the body is never read
            return
        if streamed:
            await self.app(scope, receive, send)
            return
        counted = 0
        budget = self.context.settings.max_caller_body_bytes

        async def counted_receive() -> Message:
            nonlocal counted
            message = await receive()
            if message["type"] == "http.request":
                size = len(message.get("body", b""))
                counted += size
                self.in_flight[caller] = self.in_flight.get(caller, 0) + size
                if self.in_flight[caller] > budget:
                    raise _over_budget(budget)
            return message

        try:
            await self.app(scope, counted_receive, send)
        finally:
            left = self.in_flight.get(caller, 0) - counted
            if left > 0:
                self.in_flight[caller] = left
            else:
                self.in_flight.pop(caller, None)

    def _caller(self, scope: ASGIScope) -> str:
        """Who sends the body: a token's name on a protected route (401/403 raised here), else the address."""
        route, protected = self._route(scope)
        if route is None or not (protected or id(route) in self.self_checked):
            client = scope.get("client") or ("unknown", 0)
            return f"address:{client[0]}"
        principal = identify(self.context.settings, self.context.tokens, _header(scope, b"authorization"))
        if not protected:
            scope.setdefault("state", {})["token_name"] = principal.name  # for the access log
            return f"token:{principal.name}"
        remember(scope, principal)  # before the check: the access log names a refused caller too
        needed = route_scope(route) or Scope.ADMIN  # fail closed: a protected route that declares no scope
        require(principal, needed, f"{scope.get('method')} {getattr(route, 'path', '')}")
        return f"token:{principal.name}"

    def _admit(self, caller: str, scope: ASGIScope) -> None:
        """A declared length that would put the caller over its budget is refused before it is read."""
        budget = self.context.settings.max_caller_body_bytes
        length = _header(scope, b"content-length") or ""
        if length.isdigit() and self.in_flight.get(caller, 0) + int(length) > budget:
            raise _over_budget(budget)

    def _route(self, scope: ASGIScope) -> tuple[BaseRoute | None, bool]:
        """`_find_route`'s answer, kept for the last ROUTES_KEPT paths: walking the routes was a tenth of a run's
        record's CPU (benchmarks/read_cpu.py). The routes are fixed once the app serves; their number is in the key
        all the same."""
        key = (len(self.routes), scope.get("method"), scope.get("path"))
        found = self._found.get(key)
        if found is None:
            found = self._found[key] = self._find_route(scope)
            if len(self._found) > ROUTES_KEPT:
                self._found.pop(next(iter(self._found)))  # the oldest kept
        return found

    def _find_route(self, scope: ASGIScope) -> tuple[BaseRoute | None, bool]:
        """The route the router will choose (the first full match, else the first partial one: a wrong method,
        answered 405 after authentication), and whether it is behind the token."""
        partial: tuple[BaseRoute | None, bool] = (None, False)
        for entry in self.routes:
            for route in _leaves(entry):
                match, _ = route.matches(scope)
                if match == Match.FULL:
                    return route, self._is_protected(entry)
                if match == Match.PARTIAL and partial[0] is None:
                    partial = (route, self._is_protected(entry))
        return partial

    def _is_protected(self, entry: BaseRoute) -> bool:
        """An entry of a router included behind the token (FastAPI keeps an included router as one entry)."""
        return id(getattr(entry, "original_router", None)) in self.protected


def _leaves(entry: BaseRoute) -> Iterator[BaseRoute]:
    """The routes of an app entry: FastAPI keeps an included router as one entry around its own routes."""
    included = getattr(entry, "original_router", None)
    if included is None:
        yield entry
        return
    for route in included.routes:
        yield from _leaves(route)


def _over_budget(budget: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"request bodies in flight over this caller's limit of {budget} bytes (RLCTL_MAX_CALLER_BODY_BYTES)",
        {"limit_bytes": budget},
    )


def _header(scope: ASGIScope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


async def _no_body() -> Message:
    return {"type": "http.disconnect"}
