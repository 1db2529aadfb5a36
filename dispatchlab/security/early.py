"""Refuse a request from its headers alone, before a byte of its body is read.

The same checks serve the Django middleware (WSGI: Django reads the body lazily, so a middleware runs
first) and the ASGI wrapper (Django's ASGI handler reads the whole body before any middleware, so the
check has to sit in front of it). A body without Content-Length is counted as it arrives (ASGI) or
answered 411 (WSGI, where Django cannot read it at all).

Refused from the headers, for POST/PUT/PATCH: a path no view answers (404), a body larger than its
path's limit (413), a body for anything but the public forms and the webhook without a valid API token
or session (401; a page's form: 302 to the login), a webhook delivery without a well-formed signature,
for a project that does not exist or has no secret, or naming no project while more than
DISPATCHLAB_HOOK_UNNAMED_MAX_PROJECTS could have signed it (its body would be hashed under each). The ASGI wrapper adds what needs the
connection: bytes one client may have spooled at once (429), a body that arrives too slowly (408),
and requests in flight per process (a wait, then 503).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote

from django.conf import settings
from django.db import close_old_connections
from django.http import HttpRequest
from django.http.cookie import parse_cookie
from django.urls import Resolver404, resolve

from dispatchlab.reports.models import Project
from dispatchlab.security import clients

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
HOOK_PATH = "/api/v1/hooks/ci"
SIGNATURE = re.compile(r"sha256=[0-9a-fA-F]{64}")


# Paths whose bodies anyone may send: the login and password-reset forms (small: their limit is
# 64 KB) and the webhook, whose signature is checked instead.
PUBLIC_BODY_PREFIXES = ("/accounts/", "/admin/login/", HOOK_PATH)
BEARER = (("WWW-Authenticate", "Bearer"),)


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str
    headers: tuple[tuple[str, str], ...] = ()


def body_limit(path: str) -> int:
    """The most bytes a request body to `path` may have: the longest matching prefix's limit."""
    limits: Mapping[str, int] = settings.DISPATCHLAB_BODY_LIMITS
    prefix = max((p for p in limits if path.startswith(p)), key=len, default=None)
    return limits[prefix] if prefix is not None else settings.DISPATCHLAB_MAX_REQUEST_BYTES


def _is_chunked(headers: Mapping[str, str]) -> bool:
    return "chunked" in headers.get("transfer-encoding", "").lower()


def _length_refusal(
    path: str,
    raw: str,
    limit: int,
    *,
    what: str = "the request body",
    hint: str = "",
    shown: int | None = None,
) -> Refusal | None:
    raw = raw.strip()
    if not (raw.isascii() and raw.isdigit()):
        return Refusal(400, "Content-Length must be a number of bytes")
    length = int(raw)
    if length > limit:
        # the upload's own wording is the one `dispatchlab report` and the README show
        return Refusal(413, f"{what} is {length:,} bytes; the limit is {shown or limit:,} bytes{hint}")
    return None


def hook_refusal(headers: Mapping[str, str], query: Mapping[str, str]) -> Refusal | None:
    """What the CI webhook refuses without its body: too large, no well-formed signature, a stale or
    malformed timestamp, a named project that does not exist (or no project at all)."""
    raw_length = headers.get("content-length", "")
    if raw_length:
        if headers.get("content-type", "").startswith("multipart/form-data"):
            refused = _length_refusal(HOOK_PATH, raw_length, body_limit(HOOK_PATH))
        else:
            # A JSON body is decoded whole in memory: it gets its own, lower limit.
            refused = _length_refusal(
                HOOK_PATH,
                raw_length,
                settings.DISPATCHLAB_MAX_JSON_BYTES,
                what="the JSON body",
                hint="; send a larger log as multipart, in the field 'file'",
            )
        if refused is not None:
            return refused
    if not SIGNATURE.fullmatch(headers.get("x-dispatchlab-signature", "").strip()):
        return Refusal(401, "missing X-Dispatchlab-Signature: sha256=<64 hex digits>")
    timestamp = headers.get("x-dispatchlab-timestamp")
    if timestamp is not None:
        try:
            sent = int(timestamp.strip())
        except ValueError:
            return Refusal(400, "X-Dispatchlab-Timestamp must be unix seconds")
        max_age = settings.DISPATCHLAB_WEBHOOK_MAX_AGE_SECONDS
        if abs(time.time() - sent) > max_age:
            return Refusal(401, f"the delivery is older than {max_age} seconds (or from the future); refused")
    named = query.get("project", "") or headers.get("x-dispatchlab-project", "")
    if named:
        secret = Project.objects.filter(slug=named).values_list("webhook_secret", flat=True).first()
        if secret is None:
            return Refusal(404, f"no project {named!r}")
        if not secret:
            return Refusal(
                401, f"project {named!r} has no webhook secret (manage.py webhooksecret --project)"
            )
        return None
    # Unnamed, the body is hashed under every project's secret (in its one pass): past a few the sender
    # must say which, or one anonymous delivery would cost an HMAC of 2 GiB per project.
    most: int = settings.DISPATCHLAB_HOOK_UNNAMED_MAX_PROJECTS
    signers = Project.objects.exclude(webhook_secret="")[: most + 1].count()
    if signers == 0:
        return Refusal(404, "no project takes deliveries yet")
    if signers > most:
        return Refusal(
            400,
            "name the project the delivery is for: X-Dispatchlab-Project: <slug> or ?project=<slug> "
            f"(this server has more than {most} projects with a webhook secret)",
        )
    return None


def _path_refusal(method: str, path: str) -> Refusal | None:
    """A 404 for a path no view answers (not even with the slash appended, which would be a redirect
    that drops the body); a 405 for an API view that does not take the method."""
    try:
        match = resolve(path)
    except Resolver404:
        hint = ""
        if not path.endswith("/"):
            try:
                resolve(path + "/")
                hint = f"; did you mean {path}/ ?"
            except Resolver404:
                pass
        return Refusal(404, f"no such path: {path}{hint}")
    operations = getattr(match.func, "operations", None)  # the API's views list their methods
    if operations and method not in operations:
        allowed = ", ".join(operations)
        return Refusal(405, f"this endpoint answers {allowed}, not {method}", (("Allow", allowed),))
    return None


def _session_user_id(headers: Mapping[str, str]) -> Any:
    """The id of the user whose valid session the request's cookie names, or None."""
    from importlib import import_module

    from django.contrib.auth import get_user

    session_key = parse_cookie(headers.get("cookie", "")).get(settings.SESSION_COOKIE_NAME)
    if not session_key:
        return None
    request = HttpRequest()
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = get_user(request)  # checks the session's hash against the user's password, as a view would
    return user.pk if user.is_authenticated else None


def credentials_refusal(path: str, headers: Mapping[str, str]) -> Refusal | None:
    """A body for anything but a public form or the webhook needs a valid Bearer token or session."""
    from dispatchlab.reports.accounts import TokenRefused, apitoken_verify

    if path.startswith(PUBLIC_BODY_PREFIXES):
        return None
    authorization = headers.get("authorization", "")
    if authorization:
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return Refusal(401, "use 'Authorization: Bearer <token>'", BEARER)
        try:
            apitoken_verify(key=key.strip())
        except TokenRefused as refused:
            return Refusal(401, str(refused), BEARER)
        return None
    if _session_user_id(headers) is not None:
        return None
    if path.startswith("/api/"):
        return Refusal(401, "authentication required: send 'Authorization: Bearer <token>'", BEARER)
    return Refusal(302, "log in first", headers=(("Location", f"{settings.LOGIN_URL}?next={quote(path)}"),))


def refusal_for(
    method: str, path: str, headers: Mapping[str, str], query: Mapping[str, str]
) -> Refusal | None:
    """The refusal for a request from its method, path, lower-cased headers and query, or None."""
    if method.upper() not in BODY_METHODS:
        return None
    refused = _path_refusal(method.upper(), path)
    if refused is not None:
        return refused
    raw_length = headers.get("content-length", "")
    if raw_length:
        if path.rstrip("/") == "/api/v1/reports":  # the limit users set is the upload's, not its envelope's
            upload = min(settings.DISPATCHLAB_MAX_UPLOAD_BYTES, body_limit(path))
            refused = _length_refusal(path, raw_length, body_limit(path), what="the upload", shown=upload)
        else:
            refused = _length_refusal(path, raw_length, body_limit(path))
        if refused is not None:
            return refused
    if path == HOOK_PATH and method.upper() == "POST":  # other methods: the view's 405
        return hook_refusal(headers, query)
    return credentials_refusal(path, headers)


def checked_refusal(
    method: str, path: str, headers: Mapping[str, str], query: Mapping[str, str]
) -> Refusal | None:
    """refusal_for from a thread outside any request: its database connection goes back (to the pool)
    when the check ends."""
    try:
        return refusal_for(method, path, headers, query)
    finally:
        close_old_connections()


def chunked_refusal(path: str) -> Refusal:
    return Refusal(
        411,
        f"{path} needs a Content-Length: this server does not read bodies sent with "
        "Transfer-Encoding: chunked (curl sends a file with -F 'file=@crash.log' or --data-binary @file "
        "with its length)",
    )


# ---------------------------------------------------------------- ASGI

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def _send_refusal(send: Send, refused: Refusal) -> None:
    body = json.dumps({"error": refused.message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        # The body was not read (or not all of it): the connection cannot carry another request.
        (b"connection", b"close"),
    ]
    headers += [(name.lower().encode(), value.encode("latin-1")) for name, value in refused.headers]
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _SpoolAccount:
    """Bytes of large bodies each client has in flight in this process."""

    def __init__(self) -> None:
        self.by_client: dict[str, int] = {}

    def take(self, client: str, size: int) -> Refusal | None:
        limit: int = settings.DISPATCHLAB_MAX_SPOOL_BYTES_PER_CLIENT
        if size > limit:
            return Refusal(
                413, f"the body is {size:,} bytes; DISPATCHLAB_MAX_SPOOL_BYTES_PER_CLIENT is {limit:,} bytes"
            )
        held = self.by_client.get(client, 0)
        if held + size > limit:
            return Refusal(
                429,
                f"this client already sends {held:,} bytes in other requests; at most {limit:,} bytes "
                "(DISPATCHLAB_MAX_SPOOL_BYTES_PER_CLIENT) may be on their way at once",
                headers=(("Retry-After", "10"),),
            )
        self.by_client[client] = held + size
        return None

    def give_back(self, client: str, size: int) -> None:
        left = self.by_client.get(client, 0) - size
        if left > 0:
            self.by_client[client] = left
        else:
            self.by_client.pop(client, None)


class _BodyTooSlow(Exception):
    pass


class EarlyRefusalASGI:
    """Wrap Django's ASGI application: `application = EarlyRefusalASGI(get_asgi_application())`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.spooled = _SpoolAccount()
        self._turns: asyncio.Semaphore | None = None

    def _client(self, scope: Scope, headers: Mapping[str, str]) -> str:
        peer = (scope.get("client") or ("", 0))[0] or ""
        header: str = settings.DISPATCHLAB_CLIENT_IP_HEADER
        return clients.client_address(peer, headers.get(header.lower(), "") if header else "")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from asgiref.sync import sync_to_async

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        query = {k: v[0] for k, v in parse_qs(scope.get("query_string", b"").decode("latin-1")).items()}
        path, method = scope.get("path", ""), scope.get("method", "GET").upper()
        # Not in Django's one request thread: a thread of the loop's pool, its connection closed after.
        refused = await sync_to_async(checked_refusal, thread_sensitive=False)(method, path, headers, query)
        if refused is not None:
            await _send_refusal(send, refused)
            return
        has_body = method in BODY_METHODS and (
            headers.get("content-length", "0").strip() not in ("", "0") or "transfer-encoding" in headers
        )
        declared = int(headers.get("content-length", "0").strip() or 0)
        spooled = declared if declared > settings.FILE_UPLOAD_MAX_MEMORY_SIZE else 0
        client = self._client(scope, headers)
        if spooled:
            refused = self.spooled.take(client, spooled)
            if refused is not None:
                await _send_refusal(send, refused)
                return
        try:
            await self._in_turn(scope, self._deadlined(receive, has_body), send, path)
        finally:
            if spooled:
                self.spooled.give_back(client, spooled)

    async def _in_turn(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        """Serve the request once fewer than DISPATCHLAB_WEB_MAX_IN_FLIGHT are served; after waiting
        DISPATCHLAB_WEB_QUEUE_SECONDS for a turn, 503 with Retry-After."""
        if self._turns is None:
            self._turns = asyncio.Semaphore(settings.DISPATCHLAB_WEB_MAX_IN_FLIGHT)
        queue_seconds: float = settings.DISPATCHLAB_WEB_QUEUE_SECONDS
        try:
            await asyncio.wait_for(self._turns.acquire(), timeout=queue_seconds)
        except TimeoutError:
            busy = Refusal(
                503,
                f"the server is busy: {settings.DISPATCHLAB_WEB_MAX_IN_FLIGHT} requests in flight "
                "(DISPATCHLAB_WEB_MAX_IN_FLIGHT); try again",
                headers=(("Retry-After", str(max(1, int(queue_seconds)))),),
            )
            await _send_refusal(send, busy)
            return
        try:
            await self._served(scope, receive, send, path)
        finally:
            self._turns.release()

    def _deadlined(self, receive: Receive, has_body: bool) -> Receive:
        """`receive` with the body's deadline: it must arrive at DISPATCHLAB_BODY_MIN_BYTES_PER_SECOND
        once DISPATCHLAB_BODY_GRACE_SECONDS have passed; past that the body is _BodyTooSlow."""
        if not has_body:
            return receive
        grace: float = settings.DISPATCHLAB_BODY_GRACE_SECONDS
        rate: int = settings.DISPATCHLAB_BODY_MIN_BYTES_PER_SECOND
        started = time.monotonic()
        seen = 0
        done = False

        async def deadlined() -> Message:
            nonlocal seen, done
            if done:
                return await receive()
            remaining = started + grace + seen / rate - time.monotonic()
            try:
                message = await asyncio.wait_for(receive(), timeout=max(0.0, remaining))
            except TimeoutError:
                raise _BodyTooSlow from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                done = not message.get("more_body", False)
            return message

        return deadlined

    async def _served(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        """Django, with a body of unknown length counted as it arrives (past its path's limit Django
        sees a disconnect and the client a 413), and a body too slow answered 408."""
        limit = body_limit(path)
        seen = 0
        refused: Refusal | None = None
        started = False

        async def watched() -> Message:
            nonlocal seen, refused
            try:
                message = await receive()
            except _BodyTooSlow:
                refused = Refusal(
                    408,
                    "the request body came too slowly: it must arrive at "
                    f"{settings.DISPATCHLAB_BODY_MIN_BYTES_PER_SECOND:,} bytes a second after "
                    f"{settings.DISPATCHLAB_BODY_GRACE_SECONDS:g} seconds",
                )
                return {"type": "http.disconnect"}
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    refused = Refusal(413, f"the request body passed {limit:,} bytes, the limit for {path}")
                    return {"type": "http.disconnect"}
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        await self.app(scope, watched, sending)
        if refused is not None and not started:
            await _send_refusal(send, refused)
