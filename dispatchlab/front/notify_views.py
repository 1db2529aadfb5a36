"""Notification pages: a project's webhook endpoints, adding one, an endpoint with its recent deliveries
and their attempts, sending a test event, pausing, resuming and deleting.

Scoping as in views.py: a project the user is not a member of is a 404 on every page; members manage
the endpoints, viewers read them (without the secret or the full URL, which for Slack carries a token).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from dispatchlab.notify import selectors as notify_selectors
from dispatchlab.notify import services
from dispatchlab.notify.models import Delivery, Endpoint
from dispatchlab.notify.payloads import SUBSCRIBABLE, EndpointKind, EventKind
from dispatchlab.reports import selectors
from dispatchlab.reports.models import Project

View = Callable[..., HttpResponse]
RECENT_DELIVERIES = 50
EVENT_NAMES: dict[str, str] = {
    EventKind.GROUP_NEW: "new failure group",
    EventKind.GROUP_RETURNED: "failure group came back",
    EventKind.DECISION_STALE: "decision turned stale",
    EventKind.TEST: "test event",
}
DELIVERY_BADGE = {
    Delivery.Status.DELIVERED: "ok",
    Delivery.Status.FAILED: "fails",
    Delivery.Status.SKIPPED: "skipped",
}


def _project_or_404(request: HttpRequest, slug: str) -> Project:
    return get_object_or_404(selectors.projects_of(request.user), slug=slug)


def _endpoint_or_404(request: HttpRequest, slug: str, endpoint_id: int) -> Endpoint:
    project = _project_or_404(request, slug)
    return get_object_or_404(
        Endpoint.objects.select_related("project", "created_by"), project=project, pk=endpoint_id
    )


def _can_manage(request: HttpRequest, project: Project) -> bool:
    return selectors.user_can_upload(user=request.user, project=project)


def _require_manager(request: HttpRequest, project: Project) -> None:
    if not _can_manage(request, project):
        raise PermissionDenied("Viewers of a project read its notification settings; members change them.")


def _local(moment: Any) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M")


def masked_url(url: str) -> str:
    """Scheme, host and the first path segment: a Slack webhook's path is its token."""
    parts = urlsplit(url)
    segments = [s for s in parts.path.split("/") if s]
    shown = f"{parts.scheme}://{parts.netloc}"
    if segments:
        shown += f"/{segments[0]}"
    if len(segments) > 1 or parts.query:
        shown += "/…"
    return shown


def endpoint_state(endpoint: Endpoint) -> dict[str, str]:
    """What the endpoint is doing, in a sentence, and the class of its banner."""
    last_error = f"; last error: {endpoint.last_error}" if endpoint.last_error else ""
    if endpoint.paused_at is not None:
        return {
            "css": "paused",
            "badge": "paused",
            "sentence": f"Paused {endpoint.paused_reason} since {_local(endpoint.paused_at)}{last_error}. "
            "New events are recorded as skipped until it is resumed.",
        }
    limit = settings.DISPATCHLAB_NOTIFY_PAUSE_AFTER
    if endpoint.consecutive_failures:
        n = endpoint.consecutive_failures
        return {
            "css": "failing",
            "badge": "failing",
            "sentence": f"{n} failed deliver{'y' if n == 1 else 'ies'} in a row (it pauses after {limit})"
            f"{last_error}.",
        }
    if endpoint.last_success_at is not None:
        return {
            "css": "ok",
            "badge": "active",
            "sentence": f"Last delivered {_local(endpoint.last_success_at)}.",
        }
    return {
        "css": "new",
        "badge": "active",
        "sentence": "Nothing delivered yet: send a test event to check it.",
    }


def event_summary(payload: dict[str, Any]) -> str:
    """The event in a few words, for the deliveries table."""
    group = payload.get("group") or {}
    if payload.get("event") in (EventKind.GROUP_NEW, EventKind.GROUP_RETURNED):
        report = payload.get("report") or {}
        return f"{group.get('title') or group.get('fingerprint')} (report {report.get('id')})"
    if payload.get("event") == EventKind.DECISION_STALE:
        decision = payload.get("decision") or {}
        return f"{decision.get('label')} {decision.get('title')}: {decision.get('reason')}"
    return str(payload.get("message") or "")


def _events_label(events: list[str]) -> list[str]:
    return [EVENT_NAMES.get(event, event) for event in events]


@login_required
@require_GET
def index(request: HttpRequest) -> HttpResponse:
    projects = list(
        selectors.projects_of(request.user)
        .annotate(
            endpoints=Count("notify_endpoints", distinct=True),
            paused=Count(
                "notify_endpoints", filter=Q(notify_endpoints__paused_at__isnull=False), distinct=True
            ),
        )
        .order_by("name")
    )
    if len(projects) == 1:
        return redirect("front:notify_project", projects[0].slug)
    return render(request, "front/notify/index.html", {"projects": projects})


def _form_defaults() -> dict[str, Any]:
    return {
        "name": "",
        "url": "",
        "kind": EndpointKind.GENERIC.value,
        "events": [k.value for k in SUBSCRIBABLE],
    }


@login_required
@require_http_methods(["GET", "POST"])
def project_endpoints(request: HttpRequest, project_slug: str) -> HttpResponse:
    project = _project_or_404(request, project_slug)
    can_manage = _can_manage(request, project)
    form = _form_defaults()
    errors: dict[str, str] = {}
    status = 200
    if request.method == "POST":
        _require_manager(request, project)
        form = {
            "name": request.POST.get("name", "")[:100],
            "url": request.POST.get("url", "").strip(),
            "kind": request.POST.get("kind", ""),
            "events": request.POST.getlist("events"),
        }
        try:
            endpoint = services.endpoint_create(project=project, user=request.user, **form)
        except ValidationError as invalid:
            errors = {field: " ".join(texts) for field, texts in invalid.message_dict.items()}
            status = 400
        else:
            messages.success(
                request,
                f"Endpoint added: {project.name} sends {', '.join(_events_label(endpoint.events))} to it.",
            )
            return redirect(reverse("front:notify_endpoint", args=[project.slug, endpoint.pk]) + "?created=1")
    rows = [
        {
            "endpoint": endpoint,
            "state": endpoint_state(endpoint),
            "url": endpoint.url if can_manage else masked_url(endpoint.url),
            "events": _events_label(endpoint.events),
        }
        for endpoint in notify_selectors.endpoints_of_project(project.id)
    ]
    return render(
        request,
        "front/notify/project.html",
        {
            "project": project,
            "rows": rows,
            "can_manage": can_manage,
            "form": form,
            "errors": errors,
            "kinds": [(k.value, k.label) for k in EndpointKind],
            "events": [(k.value, EVENT_NAMES[k], k.label) for k in SUBSCRIBABLE],
            "pause_after": settings.DISPATCHLAB_NOTIFY_PAUSE_AFTER,
            "max_attempts": settings.DISPATCHLAB_NOTIFY_MAX_ATTEMPTS,
        },
        status=status,
    )


@login_required
@require_GET
def endpoint_detail(request: HttpRequest, project_slug: str, endpoint_id: int) -> HttpResponse:
    endpoint = _endpoint_or_404(request, project_slug, endpoint_id)
    can_manage = _can_manage(request, endpoint.project)
    deliveries = [
        {
            "delivery": delivery,
            "event": EVENT_NAMES.get(delivery.event.kind, delivery.event.kind),
            "summary": event_summary(delivery.event.payload),
            "badge": DELIVERY_BADGE.get(delivery.status, "pending"),
            "attempts": list(delivery.attempt_rows.all()),
        }
        for delivery in notify_selectors.endpoint_deliveries(endpoint, limit=RECENT_DELIVERIES)
    ]
    return render(
        request,
        "front/notify/endpoint.html",
        {
            "project": endpoint.project,
            "endpoint": endpoint,
            "state": endpoint_state(endpoint),
            "url": endpoint.url if can_manage else masked_url(endpoint.url),
            "events": _events_label(endpoint.events),
            "kind_label": EndpointKind(endpoint.kind).label,
            "deliveries": deliveries,
            # the table refreshes itself while a delivery is on its way
            "in_flight": any(row["delivery"].status not in Delivery.FINISHED for row in deliveries),
            "can_manage": can_manage,
            "created": request.GET.get("created") == "1" and can_manage,
            "max_attempts": settings.DISPATCHLAB_NOTIFY_MAX_ATTEMPTS,
        },
    )


def _managed_endpoint(request: HttpRequest, project_slug: str, endpoint_id: int) -> Endpoint:
    endpoint = _endpoint_or_404(request, project_slug, endpoint_id)
    _require_manager(request, endpoint.project)
    return endpoint


def _back(endpoint: Endpoint) -> HttpResponse:
    return redirect("front:notify_endpoint", endpoint.project.slug, endpoint.pk)


def _endpoint_action(name: str, act: Callable[[Endpoint, Any], bool], done: str) -> View:
    """A manager's POST on an endpoint: `act(endpoint, user)`, then back to the endpoint's page with
    `done` when it changed something."""

    @login_required
    @require_POST
    def view(request: HttpRequest, project_slug: str, endpoint_id: int) -> HttpResponse:
        endpoint = _managed_endpoint(request, project_slug, endpoint_id)
        if act(endpoint, request.user):
            messages.success(request, done)
        return _back(endpoint)

    view.__name__ = view.__qualname__ = name
    return view


def _send_test(endpoint: Endpoint, user: Any) -> bool:
    services.endpoint_send_test(endpoint=endpoint, user=user)
    return True  # a test event is queued even while the endpoint is paused


endpoint_test = _endpoint_action(
    "endpoint_test",
    _send_test,
    "Test event queued: its attempts appear below in a moment.",
)
endpoint_pause = _endpoint_action(
    "endpoint_pause",
    lambda endpoint, user: services.endpoint_pause(endpoint=endpoint, user=user),
    "Paused: new events are recorded as skipped until you resume it.",
)
endpoint_resume = _endpoint_action(
    "endpoint_resume",
    lambda endpoint, user: services.endpoint_resume(endpoint=endpoint),
    "Resumed: new events are sent again (skipped ones are not re-sent).",
)


@login_required
@require_POST
def endpoint_delete(request: HttpRequest, project_slug: str, endpoint_id: int) -> HttpResponse:
    endpoint = _managed_endpoint(request, project_slug, endpoint_id)
    label = endpoint.name or masked_url(endpoint.url)
    project = endpoint.project
    services.endpoint_delete(endpoint=endpoint)
    messages.success(request, f"Deleted the endpoint {label} and its delivery history.")
    return redirect("front:notify_project", project.slug)
