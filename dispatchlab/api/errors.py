"""Django's error views, in JSON under /api/: a client of the API never gets an HTML page, whether the URL
is unknown, the request is refused before a view runs (a body Django will not read) or a view fails."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

API_PREFIX = "/api/"


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIX)


def bad_request(request: HttpRequest, exception: Any = None) -> HttpResponse:
    if _is_api(request):
        return JsonResponse(
            {"error": "the request cannot be read (a malformed or too large body?)"}, status=400
        )
    return defaults.bad_request(request, exception)


def permission_denied(request: HttpRequest, exception: Any = None) -> HttpResponse:
    if _is_api(request):
        return JsonResponse({"error": "not allowed"}, status=403)
    return defaults.permission_denied(request, exception)


def page_not_found(request: HttpRequest, exception: Any = None) -> HttpResponse:
    if _is_api(request):
        return JsonResponse(
            {"error": f"no such API endpoint: {request.path} (the endpoints: {API_PREFIX}schema/)"},
            status=404,
        )
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if _is_api(request):
        return JsonResponse({"error": "the server failed to answer; the error is in its log"}, status=500)
    return defaults.server_error(request)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: a JSON 403 under /api/, Django's page elsewhere."""
    if _is_api(request):
        return JsonResponse(
            {"error": "CSRF check failed; send the X-CSRFToken header or use a Bearer token"}, status=403
        )
    from django.views.csrf import csrf_failure as django_csrf_failure

    return django_csrf_failure(request, reason=reason)


def json_not_allowed(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Wrap a plain Django view under /api/ so that a method it does not take is a JSON 405."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = view(request, *args, **kwargs)
        if response.status_code == 405 and response.get("Content-Type", "") != "application/json":
            allowed = response.get("Allow", "")
            answer = JsonResponse(
                {"error": f"this endpoint answers {allowed or 'other methods'}, not {request.method}"},
                status=405,
            )
            answer["Allow"] = allowed
            return answer
        return response

    return wrapped
