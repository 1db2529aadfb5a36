"""Refuse a request from its headers alone, before a byte of its body is read.

The same checks serve the Django middleware (WSGI: Django reads the body lazily, so a middleware runs
first) and the ASGI wrapper (Django's ASGI handler reads the whole body before any middleware, so the
check has to sit in front of it). A body without Content-Length is counted as it arrives (ASGI) or
answered 411 (WSGI, where Django cannot read it at all).
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings

from dispatchlab.reports.models import Project

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
HOOK_PATH = "/api/v1/hooks/ci"
SIGNATURE = re.compile(r"sha256=[0-9a-fA-F]{64}")


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str


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
    projects = Project.objects.filter(slug=named) if named else Project.objects.all()
    if not projects.exists():
        return Refusal(404, f"no project {named!r}" if named else "no project takes deliveries yet")
    return None


def refusal_for(
    method: str, path: str, headers: Mapping[str, str], query: Mapping[str, str]
) -> Refusal | None:
    """The refusal for a request from its method, path, lower-cased headers and query, or None."""
    if method.upper() not in BODY_METHODS:
        return None
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
    return None


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
    import json

    body = json.dumps({"error": refused.message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": refused.status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class EarlyRefusalASGI:
    """Wrap Django's ASGI application: `application = EarlyRefusalASGI(get_asgi_application())`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from asgiref.sync import sync_to_async

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        query = {k: v[0] for k, v in parse_qs(scope.get("query_string", b"").decode("latin-1")).items()}
        path, method = scope.get("path", ""), scope.get("method", "GET")
        refused = await sync_to_async(refusal_for)(method, path, headers, query)
        if refused is not None:
            await _send_refusal(send, refused)
            return
        if method.upper() in BODY_METHODS and not headers.get("content-length"):
            await self._capped(scope, receive, send, body_limit(path))
            return
        await self.app(scope, receive, send)

    async def _capped(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        """A body of unknown length: count it as it arrives; past the limit Django sees a disconnect
        (and stops reading) and the client gets a 413."""
        seen = 0
        over = False

        async def counted() -> Message:
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        await self.app(scope, counted, send)
        if over:
            await _send_refusal(
                send,
                Refusal(413, f"the request body passed {limit:,} bytes, the limit for {scope.get('path')}"),
            )
