"""Authentication and scope checks of HTTP requests (docs/AUTH.md).

Every protected route declares the scope it needs with one of READ, OPERATE or ADMIN in its `dependencies`;
a protected route that declares none needs `admin` (fail closed), and a test fails on it.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
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


async def authenticate(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer_scheme)
) -> Principal:
    """Router-level: who calls. Also enforces `admin` on a protected route that declares no scope."""
    header = f"{credentials.scheme} {credentials.credentials}" if credentials else None
    context = request.app.state.context
    principal = identify(context.settings, context.tokens, header)
    remember(request, principal)
    if route_scope(request.scope.get("route")) is None:
        require(principal, Scope.ADMIN, "a route without a declared scope")
    return principal


def remember(request: Request, principal: Principal) -> None:
    """The acting token's name, for the access log (request state) and for records the request creates."""
    request.state.token_name = principal.name
    actor_var.set(principal.name)
    caller_scopes_var.set(frozenset(scope.value for scope in principal.scopes))


class ScopeCheck:
    """A route's declared scope, and its check (after authentication)."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    async def __call__(self, request: Request, principal: Principal = Depends(authenticate)) -> Principal:
        require(principal, self.scope, f"{request.method} {getattr(request.scope.get('route'), 'path', '')}")
        return principal


def route_scope(route: Any) -> Scope | None:
    """The scope a route declares through a ScopeCheck dependency, if any."""
    dependant = getattr(route, "dependant", None)
    for dependency in getattr(dependant, "dependencies", ()):
        if isinstance(dependency.call, ScopeCheck):
            return dependency.call.scope
    return None


def token_matches(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


READ = Depends(ScopeCheck(Scope.READ))
OPERATE = Depends(ScopeCheck(Scope.OPERATE))
ADMIN = Depends(ScopeCheck(Scope.ADMIN))
CurrentPrincipal = Depends(authenticate)


class AuthenticationGate:
    """Pure ASGI, outside the routes: answers 401/403 from the headers alone, before a byte of the body is read
    (FastAPI parses a JSON body before it resolves dependencies, so eight unauthenticated 16 MB posts once held
    the interpreter for seconds), and bounds the body bytes each caller has in flight over all its requests.

    Protected routes are those behind the `authenticate` dependency (it still runs there, and names the caller for
    the request); `self_checked` ones (`/mcp`) check scopes per tool themselves, the gate only
    identifies the caller. Every other route (health, docs, the UI page, Ray nodes' calls) is the caller's address.
    The budget counts bodies held whole in memory (JSON); `streamed` names the requests whose body goes to disk as it
    arrives (uploads, with their own limit), which it does not count.
    """

    def __init__(
        self,
        app: ASGIApp,
        context: Any,
        routes: Sequence[BaseRoute],
        self_checked: Collection[BaseRoute] = (),
        streamed: Callable[[ASGIScope], bool] = lambda _scope: False,
    ) -> None:
        self.app = app
        self.streamed = streamed
        self.context = context
        self.routes = routes  # the app's, in its order: the route the router will pick is the one checked
        self.self_checked = {id(route) for route in self_checked}
        self.in_flight: dict[str, int] = {}  # caller -> body bytes received by its unfinished requests

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
        scope.setdefault("state", {})["token_name"] = principal.name  # for the access log of a refused call
        if protected:
            needed = route_scope(route) or Scope.ADMIN  # fail closed, as `authenticate` does
            require(principal, needed, f"{scope.get('method')} {getattr(route, 'path', '')}")
        return f"token:{principal.name}"

    def _admit(self, caller: str, scope: ASGIScope) -> None:
        """A declared length that would put the caller over its budget is refused before it is read."""
        budget = self.context.settings.max_caller_body_bytes
        declared = _header(scope, b"content-length") or ""
        if declared.isdigit() and self.in_flight.get(caller, 0) + int(declared) > budget:
            raise _over_budget(budget)

    def _route(self, scope: ASGIScope) -> tuple[BaseRoute | None, bool]:
        """The route the router will choose (the first full match, else the first partial one: a wrong method,
        answered 405 after authentication), and whether it is behind the token."""
        partial: tuple[BaseRoute | None, bool] = (None, False)
        for entry in self.routes:
            for route in _leaves(entry):
                match, _ = route.matches(scope)
                if match == Match.FULL:
                    return route, is_protected(entry)
                if match == Match.PARTIAL and partial[0] is None:
                    partial = (route, is_protected(entry))
        return partial


def _leaves(entry: BaseRoute) -> Iterator[BaseRoute]:
    """The routes of an app entry: FastAPI keeps an included router as one entry around its own routes."""
    included = getattr(entry, "original_router", None)
    if included is None:
        yield entry
        return
    for route in included.routes:
        yield from _leaves(route)


def is_protected(entry: BaseRoute) -> bool:
    """An included router behind the `authenticate` dependency (how the app includes its protected routers)."""
    dependencies = getattr(getattr(entry, "include_context", None), "dependencies", ())
    return any(getattr(dependency, "dependency", None) is authenticate for dependency in dependencies)


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
