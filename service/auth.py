"""Bearer-token authentication on every route but health and docs."""

from __future__ import annotations

import hmac
import ipaddress

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.errors import Unauthorized

bearer_scheme = HTTPBearer(auto_error=False, description="RLCTL_API_TOKEN")


def require_token(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer_scheme)) -> None:
    token = request.app.state.context.settings.api_token
    if token is None:
        return
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <RLCTL_API_TOKEN>'")
    if not token_matches(credentials.credentials, token.get_secret_value()):
        raise Unauthorized("wrong bearer token")


def token_matches(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
