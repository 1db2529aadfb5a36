"""Middleware: header-only refusals before the body is read, and the Content-Security-Policy header."""

from __future__ import annotations

import secrets
from collections.abc import Callable

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, JsonResponse

from dispatchlab.security.early import BODY_METHODS, Refusal, chunked_refusal, refusal_for

Handler = Callable[[HttpRequest], HttpResponse]


def _refusal_response(refused: Refusal) -> JsonResponse:
    response = JsonResponse({"error": refused.message}, status=refused.status)
    # The body was not read: the connection cannot carry another request.
    response["Connection"] = "close"
    for name, value in refused.headers:
        response[name] = value
    return response


class EarlyRefusalMiddleware:
    """Answers 302/400/401/404/411/413 from the request's headers before request.body, POST or FILES is
    touched (under WSGI Django reads nothing until then)."""

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        method = request.method or "GET"
        headers = {name.lower(): value for name, value in request.headers.items()}
        refused = refusal_for(method, request.path, headers, request.GET)
        if refused is not None:
            return _refusal_response(refused)
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if (
            method in BODY_METHODS
            and chunked
            and not headers.get("content-length")
            and not isinstance(request, ASGIRequest)  # ASGI reads it (capped by EarlyRefusalASGI)
        ):
            refused = chunked_refusal(request.path)
            return _refusal_response(refused)
        return self.get_response(request)


class ContentSecurityPolicyMiddleware:
    """Sets DISPATCHLAB_CSP as Content-Security-Policy (or -Report-Only); '{nonce}' in it becomes a
    fresh nonce per request, offered to templates as request.csp_nonce."""

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        nonce = secrets.token_urlsafe(16)
        request.csp_nonce = nonce  # type: ignore[attr-defined]
        response = self.get_response(request)
        policy: str = settings.DISPATCHLAB_CSP
        if policy:
            header = (
                "Content-Security-Policy-Report-Only"
                if settings.DISPATCHLAB_CSP_REPORT_ONLY
                else "Content-Security-Policy"
            )
            if header not in response:
                response[header] = policy.replace("{nonce}", nonce)
        return response
