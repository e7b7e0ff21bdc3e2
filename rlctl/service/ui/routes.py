"""Serves the page at /ui. It is static: all data comes from the public API, called by the browser with the
token the user typed (kept in the browser). The page itself holds nothing secret, so it needs no token."""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

PAGE = Path(__file__).with_name("index.html")
router = APIRouter()


@router.get("/ui", include_in_schema=False)
def ui_page() -> HTMLResponse:
    html, policy = _page()
    return HTMLResponse(html, headers={"Content-Security-Policy": policy, "Cache-Control": "no-cache"})


@cache
def _page() -> tuple[str, str]:
    """The page and a content security policy that allows its own inline script and style, and nothing else."""
    html = PAGE.read_text(encoding="utf-8")
    scripts = " ".join(_hash(body) for body in re.findall(r"<script>(.*?)</script>", html, re.S))
    styles = " ".join(_hash(body) for body in re.findall(r"<style>(.*?)</style>", html, re.S))
    policy = (
        f"default-src 'none'; script-src {scripts}; style-src {styles}; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return html, policy


def _hash(body: str) -> str:
    digest = base64.b64encode(hashlib.sha256(body.encode("utf-8")).digest()).decode()
    return f"'sha256-{digest}'"
