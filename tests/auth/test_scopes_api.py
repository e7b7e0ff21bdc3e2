"""Every route and every tool against each scope, over the real app (SQLite and PostgreSQL).

The route table is generated from the app's routes: a new route that declares no scope fails here.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Annotated, Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from rlctl.service.auth.guard import AuthenticationGate, CurrentPrincipal, route_scope
from rlctl.service.auth.scopes import Scope, allows
from rlctl.service.auth.tokens import Principal, TokenStore
from rlctl.service.settings import Settings
from rlctl.service.tools.catalog import ALL_TOOLS
from tests.support import mcp_raw
from tests.support.live import LiveService, live_service
from tests.support.waiting import REQUEST_TIMEOUT, wait_until

ADMIN_TOKEN = "scopes-env-admin-token"
PUBLIC_PATHS = {"/healthz", "/readyz", "/ui", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
# A Ray run's node calls these with its run's secret, never a token (docs/RAY.md#authentication).
PUBLIC_PATHS |= {"/runs/{run_id}/node/plan", "/runs/{run_id}/node/report"}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@dataclass
class Scoped:
    live: LiveService
    tokens: dict[Scope, str]  # one token of the tokens file per scope

    def client(self, scope: Scope) -> httpx.Client:
        return self.live.client(token=self.tokens[scope])


@pytest.fixture
def scoped(make_settings: Callable[..., Settings]) -> Iterator[Scoped]:
    settings = make_settings(api_token=ADMIN_TOKEN)
    store = TokenStore(settings.tokens_path)
    tokens = {scope: store.create(f"t-{scope.value}", (scope,)) for scope in Scope}
    with live_service(settings) as live:
        yield Scoped(live, tokens)


def flatten(routes: list[Any]) -> Iterator[Any]:
    """The routes, those of included routers too (FastAPI keeps an included router as one entry)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from flatten(included.routes)
        else:
            yield route


def protected_routes(live: LiveService) -> list[APIRoute]:
    return [r for r in flatten(live.app.routes) if isinstance(r, APIRoute) and r.path not in PUBLIC_PATHS]


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "nosuch", path)


def test_every_route_declares_a_scope_and_enforces_it(scoped: Scoped) -> None:
    routes = protected_routes(scoped.live)
    assert len(routes) > 40
    undeclared = [f"{sorted(r.methods)} {r.path}" for r in routes if route_scope(r) is None]
    assert not undeclared, f"routes without a declared scope: {undeclared}"
    clients = {scope: scoped.client(scope) for scope in Scope}
    try:
        for route in routes:
            needed = route_scope(route)
            assert needed is not None
            for method in sorted(route.methods):
                for scope, client in clients.items():
                    response = client.request(method, concrete(route.path), json={})
                    where = f"{method} {route.path} with a {scope.value} token"
                    if allows([scope], needed):
                        assert response.status_code not in (401, 403), f"{where}: {response.text}"
                    else:
                        assert response.status_code == 403, f"{where}: {response.status_code}"
                        error = response.json()["error"]
                        assert error["code"] == "INSUFFICIENT_SCOPE"
                        assert error["details"]["required_scope"] == needed.value
                        assert error["details"]["token"] == f"t-{scope.value}"
    finally:
        for client in clients.values():
            client.close()


def test_the_scopes_of_the_routes_follow_the_rules(scoped: Scoped) -> None:
    """GET routes read; environment code needs admin; anything else that changes state operates."""
    for route in protected_routes(scoped.live):
        declared = route_scope(route)
        writes_code = route.path.startswith("/environments/{name}") and route.methods & {"PUT", "DELETE", "POST"}
        if writes_code and not route.path.endswith("/preview"):
            assert declared == Scope.ADMIN, route.path
        elif route.methods == {"GET"}:
            assert declared == Scope.READ, route.path


def test_the_document_shows_each_operation_s_token_and_scope(scoped: Scoped) -> None:
    """Clients and agents read from the OpenAPI document which token and scope each operation takes."""
    with scoped.client(Scope.READ) as client:
        document = client.get("/openapi.json").json()
    assert document["components"]["securitySchemes"]["HTTPBearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "RLCTL_API_TOKEN, or a token of the tokens file",
    }
    documented = [r for r in protected_routes(scoped.live) if r.include_in_schema]
    assert len(documented) > 40
    for route in documented:
        for method in route.methods:
            operation = document["paths"][route.path][method.lower()]
            assert operation["security"] == [{"HTTPBearer": []}], route.path
            assert operation["x-required-scope"] == route_scope(route), route.path
    for path in ("/healthz", "/readyz"):
        assert "security" not in document["paths"][path]["get"]


def test_a_protected_route_that_declares_no_scope_needs_admin(make_settings: Callable[..., Settings]) -> None:
    """Fail closed: the gate asks `admin` of a route behind the token that declares no scope."""
    settings = make_settings(api_token=ADMIN_TOKEN)
    store = TokenStore(settings.tokens_path)
    tokens = {scope: store.create(f"t-{scope.value}", (scope,)) for scope in Scope}
    router = APIRouter()

    @router.get("/undeclared")
    async def undeclared(principal: Annotated[Principal, CurrentPrincipal]) -> dict[str, str]:
        return {"caller": principal.name}

    app = FastAPI()
    app.include_router(router)
    context = SimpleNamespace(settings=settings, tokens=store)
    app.add_middleware(AuthenticationGate, context=context, routes=app.router.routes, protected=[router])
    with TestClient(app) as client:
        for scope in (Scope.READ, Scope.OPERATE):
            refused = client.get("/undeclared", headers={"Authorization": f"Bearer {tokens[scope]}"})
            assert refused.status_code == 403
            assert refused.json()["error"]["details"]["required_scope"] == "admin"
        allowed = client.get("/undeclared", headers={"Authorization": f"Bearer {tokens[Scope.ADMIN]}"})
        assert allowed.status_code == 200 and allowed.json() == {"caller": "t-admin"}
        assert client.get("/undeclared").status_code == 401


def test_no_token_wrong_token_and_the_env_token(scoped: Scoped) -> None:
    with scoped.live.client(token="rlctl_not-a-token") as client:
        assert client.get("/runs").status_code == 401
    with httpx.Client(base_url=scoped.live.base_url, timeout=REQUEST_TIMEOUT) as anonymous:
        response = anonymous.get("/runs")
        assert response.status_code == 401 and response.json()["error"]["code"] == "UNAUTHORIZED"
        assert anonymous.get("/healthz").status_code == 200
    with scoped.live.client(token=ADMIN_TOKEN) as admin:
        assert admin.put("/environments/nosuch", json={}).status_code == 422  # past the scope check


def test_tools_are_listed_and_refused_by_scope(scoped: Scoped) -> None:
    for scope in Scope:
        with scoped.client(scope) as client:
            listed = {t["function"]["name"] for t in client.get("/tools").json()["tools"]}
            assert listed == {t.name for t in ALL_TOOLS if t.scope and allows([scope], t.scope)}
            for tool in ALL_TOOLS:
                assert tool.scope is not None, f"{tool.name} declares no scope"
                # Arguments no tool accepts: an allowed call stops at argument validation, changing nothing.
                response = client.post(f"/tools/{tool.name}", json={"not_an_argument": 1})
                if allows([scope], tool.scope):
                    assert response.status_code == 200, (tool.name, scope)
                    assert response.json()["code"] == "VALIDATION_ERROR"
                else:
                    assert response.status_code == 403, (tool.name, scope)
                    assert response.json()["error"]["details"]["required_scope"] == tool.scope.value
    assert {t.name for t in ALL_TOOLS if t.scope == Scope.ADMIN} == {"rl_write_environment"}


def mcp(client: httpx.Client, method: str, params: dict[str, Any]) -> httpx.Response:
    return mcp_raw.call(client, method, params)


def test_mcp_lists_and_refuses_by_scope(scoped: Scoped) -> None:
    for scope in Scope:
        with scoped.client(scope) as client:
            listing = mcp(client, "tools/list", {})
            assert listing.status_code == 200, listing.text
            listed = {t["name"] for t in listing.json()["result"]["tools"]}
            assert listed == {t.name for t in ALL_TOOLS if t.scope and allows([scope], t.scope)}
            for tool in ALL_TOOLS:
                assert tool.scope is not None
                response = mcp(client, "tools/call", {"name": tool.name, "arguments": {"not_an_argument": 1}})
                assert response.status_code == 200, (tool.name, scope, response.text)
                result = response.json()["result"]  # a refusal too is a tool error, which MCP clients show
                assert result["isError"] is True
                expected = "VALIDATION_ERROR" if allows([scope], tool.scope) else "INSUFFICIENT_SCOPE"
                assert result["structuredContent"]["code"] == expected, (tool.name, scope)
    with httpx.Client(base_url=scoped.live.base_url, timeout=REQUEST_TIMEOUT) as anonymous:
        assert mcp(anonymous, "tools/list", {}).status_code == 401


def test_created_and_revoked_tokens_take_effect_without_a_restart(scoped: Scoped) -> None:
    store = TokenStore(scoped.live.settings.tokens_path)
    token = store.create("late-reader", (Scope.READ,))
    with scoped.live.client(token=token) as client:
        assert client.get("/environments").status_code == 200
        store.revoke("late-reader")
        assert client.get("/environments").status_code == 401


def test_the_access_log_names_the_token_never_the_token(scoped: Scoped, caplog: pytest.LogCaptureFixture) -> None:
    def logged() -> dict[str, logging.LogRecord] | None:
        # The line is written once the response has gone: wait for it rather than race it.
        by_path = {r.__dict__["path"]: r for r in caplog.records if r.name == "rlctl.access"}
        return by_path if {"/jobs", "/mcp"} <= set(by_path) else None

    with caplog.at_level(logging.INFO, logger="rlctl.access"), scoped.client(Scope.OPERATE) as client:
        client.get("/jobs")
        client.post("/mcp", content="{}", headers=MCP_HEADERS)
        by_path = wait_until(logged, timeout=30, message="access log lines")
    lines = list(by_path.values())
    assert by_path["/jobs"].__dict__["token"] == "t-operate" and "token=t-operate" in by_path["/jobs"].getMessage()
    assert by_path["/mcp"].__dict__["token"] == "t-operate"
    for record in lines:
        assert all(token not in record.getMessage() for token in scoped.tokens.values())


def test_a_broken_tokens_file_fails_closed_but_the_env_token_still_works(scoped: Scoped) -> None:
    scoped.live.settings.tokens_path.write_text("{not json")
    with scoped.client(Scope.ADMIN) as client:
        response = client.get("/runs")
        assert response.status_code == 503 and "tokens file" in response.json()["error"]["message"]
    with httpx.Client(base_url=scoped.live.base_url, timeout=REQUEST_TIMEOUT) as anonymous:
        assert anonymous.get("/runs").status_code == 503  # never open
    with scoped.live.client(token=ADMIN_TOKEN) as admin:
        assert admin.get("/runs").status_code == 200
