"""Authentication and scope checks of HTTP requests (docs/AUTH.md).

Every protected route declares the scope it needs with one of READ, OPERATE or ADMIN in its `dependencies`;
a protected route that declares none needs `admin` (fail closed), and a test fails on it.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from typing import Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from rlctl.service.auth.scopes import Scope, allows
from rlctl.service.auth.tokens import ANONYMOUS, ENV_TOKEN_NAME, Principal, TokenFileError, TokenStore, find_token
from rlctl.service.errors import InsufficientScope, Unauthorized, Unavailable
from rlctl.service.observability import actor_var
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
