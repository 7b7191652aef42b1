"""GET/POST /login (only with --api-key): a browser gives the key once and gets a session cookie
that every route takes in place of the Authorization header (HttpOnly, SameSite=Strict: a page of
another site cannot send it along)."""
from __future__ import annotations

import html
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from runtime.server.guards.auth import COOKIE, LOGIN_PATH, KeyCheck
from runtime.server.guards.rate_limit import client_address
from runtime.server.state import ServerState, server_state

router = APIRouter()

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>cute-serve: sign in</title>
<style>body{{font-family:sans-serif;max-width:26em;margin:5em auto}}input{{font-size:1em;padding:.3em}}</style></head>
<body><h2>cute-serve</h2><p>This server wants its API key (<code>--api-key</code>).</p>
<form method="post" action="{path}"><input type="password" name="key" id="key" autofocus placeholder="API key">
<button type="submit" id="sign-in">Sign in</button></form><p style="color:#b00" id="error">{error}</p></body></html>"""


def page(error: str = "", status: int = 200, headers: dict[str, str] | None = None) -> HTMLResponse:
    return HTMLResponse(PAGE.format(path=LOGIN_PATH, error=html.escape(error)), status, headers)


@router.get(LOGIN_PATH, include_in_schema=False)
async def login_page() -> HTMLResponse:
    return page()


@router.post(LOGIN_PATH, include_in_schema=False)
async def login(request: Request, state: ServerState = Depends(server_state)) -> Response:
    address = client_address(request.scope)
    wait = state.auth_throttle.retry_after(address) if state.auth_throttle is not None else 0
    if wait:
        return page(f"too many wrong keys: try again in {wait} s", 429, {"Retry-After": str(wait)})
    given = parse_qs((await request.body()).decode("utf-8", "replace")).get("key", [""])[0]
    check = KeyCheck(state.options.api_key or "")
    if not state.options.api_key or not check.key(given):
        if state.auth_throttle is not None:
            state.auth_throttle.failed(address)
        return page("wrong key", 401)
    done = RedirectResponse("/", status_code=303)
    done.set_cookie(COOKIE, check.session, httponly=True, samesite="strict", path="/")
    return done
