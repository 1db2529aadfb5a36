"""Everything that changes endpoints, events and group closures. Views, tasks, commands and the other
apps' hooks call these; sending a delivery is dispatchlab.notify.delivery.

Events come from three places: `notify_report_landed` (reports' events, when a parsed report lands in a
group: a new group, or a closed group coming back), `notify_decision_stale` (decisions' event, with
primitives only), both through notify.handlers, and `endpoint_send_test` (the endpoint page).
`event_emit` stores the event and one Delivery per subscribed endpoint in the caller's transaction and
enqueues `notify.deliver` on commit; a paused endpoint's delivery is stored as skipped and never sent.

URLs: http and https only, no user name or password in them, redirects never followed, and addresses
off the public internet refused unless DISPATCHLAB_NOTIFY_ALLOW_NETWORKS allows them (addresses.py):
checked when the endpoint is added and again, after the one lookup the request uses, when it is sent.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Q
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from dispatchlab.notify.addresses import AddressRefused, IPNetwork, parse_networks
from dispatchlab.notify.models import Delivery, Endpoint, Event, GroupClosure
from dispatchlab.notify.payloads import (
    SUBSCRIBABLE,
    EndpointKind,
    EventKind,
)
from dispatchlab.notify.sender import resolve_checked
from dispatchlab.reports.models import FailureGroup, Project, Report

logger = logging.getLogger(__name__)

MAX_URL_LENGTH = 2000

# ---------------------------------------------------------------- URLs


def endpoint_url_problem(url: str) -> str | None:
    """Why this URL cannot be an endpoint, for people; None when it can."""
    if not url:
        return "Enter the URL the events are POSTed to."
    if len(url) > MAX_URL_LENGTH:
        return f"The URL is longer than {MAX_URL_LENGTH} characters."
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        return "The URL contains spaces or control characters."
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port that is not a number
    except ValueError as error:
        return f"The URL cannot be read: {error}."
    if parts.scheme.lower() not in ("http", "https"):
        shown = f"{parts.scheme}:" if parts.scheme else "no scheme"
        return f"Only http:// and https:// URLs can receive events ({shown} is refused)."
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return (
            "Put no user name or password in the URL: generic endpoints verify the "
            "X-Dispatchlab-Signature header instead, Slack-compatible ones carry their token in the path."
        )
    if not parts.hostname:
        return "The URL has no host name."
    if port == 0:
        return "The URL's port 0 cannot be connected to."
    return None


def allowed_networks() -> tuple[IPNetwork, ...]:
    return parse_networks(settings.DISPATCHLAB_NOTIFY_ALLOW_NETWORKS)


# A name that does not resolve in time is accepted like one that does not resolve: checked again when sent.
ENDPOINT_LOOKUP_SECONDS = 3.0


def endpoint_address_problem(url: str) -> str | None:
    """Why the URL's host may not receive webhooks (an internal or metadata address, or a name that
    resolves to one), for people; None when it may, or when the name does not resolve from here (the
    workers look it up again, and check it, before every attempt)."""
    parts = urlsplit(url)
    https = parts.scheme.lower() == "https"
    try:
        resolve_checked(
            parts.hostname or "",
            parts.port or (443 if https else 80),
            allowed_networks(),
            timeout=ENDPOINT_LOOKUP_SECONDS,
        )
    except AddressRefused as refused:
        return f"{refused}"
    except (OSError, UnicodeError):
        return None
    return None


def absolute_url(path: str) -> str:
    """A dashboard path as a link people can follow from a chat message."""
    if path.startswith(("http://", "https://")):
        return path
    return settings.DISPATCHLAB_NOTIFY_BASE_URL.rstrip("/") + "/" + path.lstrip("/")


def _page_url(name: str, *args: Any, query: str = "") -> str:
    try:
        path = reverse(name, args=args)
    except NoReverseMatch:  # the pages (dispatchlab.front) are optional
        return ""
    return absolute_url(path + query)


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# ---------------------------------------------------------------- endpoints


def endpoint_create(
    *,
    project: Project,
    user: AbstractBaseUser | None,
    url: str,
    kind: str,
    events: list[str],
    name: str = "",
) -> Endpoint:
    """A new endpoint; raises ValidationError with a message per field ("url", "kind", "events")."""
    url = url.strip()
    errors: dict[str, str] = {}
    problem = endpoint_url_problem(url) or endpoint_address_problem(url)
    if problem:
        errors["url"] = problem
    elif Endpoint.objects.filter(project=project, url=url).exists():
        errors["url"] = f"{project.name} already sends events to this URL."
    if kind not in {k.value for k in EndpointKind}:
        errors["kind"] = "Choose Slack-compatible or generic JSON."
    unknown = sorted(set(events) - {k.value for k in SUBSCRIBABLE})
    if unknown:
        errors["events"] = f"Unknown events: {', '.join(unknown)}."
    elif not events:
        errors["events"] = "Choose at least one event to send."
    if errors:
        raise ValidationError(errors)
    return Endpoint.objects.create(
        project=project,
        name=name.strip()[:100],
        url=url,
        kind=kind,
        events=[k.value for k in SUBSCRIBABLE if k.value in events],  # in one order
        created_by=user if user is not None and user.is_authenticated else None,
    )


def endpoint_pause(*, endpoint: Endpoint, user: AbstractBaseUser | None) -> bool:
    who = user.get_username() if user is not None and user.is_authenticated else "a person"
    updated = Endpoint.objects.filter(id=endpoint.id, paused_at__isnull=True).update(
        paused_at=timezone.now(), paused_reason=f"by {who}"[:300]
    )
    return updated == 1


def endpoint_resume(*, endpoint: Endpoint) -> bool:
    """Deliveries skipped while it was paused stay skipped; new events are sent again."""
    updated = Endpoint.objects.filter(id=endpoint.id, paused_at__isnull=False).update(
        paused_at=None, paused_reason="", consecutive_failures=0
    )
    return updated == 1


def endpoint_delete(*, endpoint: Endpoint) -> None:
    endpoint.delete()


def endpoint_send_test(*, endpoint: Endpoint, user: AbstractBaseUser | None) -> Delivery:
    """A test event to this endpoint alone, sent even while it is paused (to check it before resuming)."""
    who = user.get_username() if user is not None and user.is_authenticated else "dispatchlab"
    project = endpoint.project
    message = f"Test event from dispatchlab, sent by {who}: events of {project.name} reach this endpoint."
    event = event_emit(
        project=project, kind=EventKind.TEST, fields={"message": message}, endpoints=[endpoint]
    )
    assert event is not None
    return event.deliveries.get(endpoint=endpoint)


# ---------------------------------------------------------------- events


def _project_fields(project: Project) -> dict[str, Any]:
    return {
        "id": project.id,
        "slug": project.slug,
        "name": project.name,
        "url": _page_url("front:report_list", query=f"?project={project.slug}"),
    }


def _group_fields(group: FailureGroup) -> dict[str, Any]:
    return {
        "id": group.id,
        "title": group.title,
        "failure_class": group.failure_class,
        "fingerprint": group.fingerprint,
        "count": group.count,
        "first_seen": _iso(group.first_seen),
        "last_seen": _iso(group.last_seen),
        "url": _page_url("front:group", group.id),
    }


def _report_fields(report: Report) -> dict[str, Any]:
    return {
        "id": report.id,
        "title": report.title,
        "created_at": _iso(report.created_at),
        "server": report.server,
        "server_version": report.server_version,
        "gpu": report.gpu_name,
        "arch": report.arch,
        "model": report.model_name,
        "top_match_id": report.top_match_id,
        "url": _page_url("front:report", report.id),
    }


def _enqueue(delivery_id: int) -> None:
    from dispatchlab.notify.tasks import delivery_send_task

    # Routed to the notify queue; the task carries its own soft and hard time limits.
    delivery_send_task.delay(delivery_id)


def event_emit(
    *,
    project: Project,
    kind: EventKind,
    fields: dict[str, Any],
    group: FailureGroup | None = None,
    endpoints: list[Endpoint] | None = None,
) -> Event | None:
    """Store the event and a delivery for each endpoint subscribed to it (or for `endpoints`), sent
    after the caller's transaction commits. None when no endpoint wants it."""
    if endpoints is None:
        endpoints = [e for e in Endpoint.objects.filter(project=project) if e.subscribed(kind)]
    if not endpoints:
        return None
    now = timezone.now()
    with transaction.atomic():
        event = Event.objects.create(project=project, kind=kind, occurred_at=now, group=group)
        event.payload = {
            "event": kind.value,
            "event_id": event.id,
            "occurred_at": _iso(now),
            "project": _project_fields(project),
            **fields,
        }
        event.save(update_fields=["payload"])
        for endpoint in endpoints:
            paused = endpoint.is_paused and kind != EventKind.TEST
            delivery = Delivery.objects.create(
                endpoint=endpoint,
                event=event,
                status=Delivery.Status.SKIPPED if paused else Delivery.Status.PENDING,
                created_at=now,
                next_attempt_at=now,
                finished_at=now if paused else None,
                error=f"not sent: the endpoint is paused ({endpoint.paused_reason})" if paused else "",
            )
            if not paused:
                transaction.on_commit(lambda delivery_id=delivery.id: _enqueue(delivery_id), robust=True)
    logger.info("event %s %s of project %s: %d endpoint(s)", event.id, kind, project.slug, len(endpoints))
    return event


def notify_report_landed(*, report: Report, group_id: int, group_created: bool) -> Event | None:
    """A freshly parsed report landed in a failure group (notify.handlers, on reports' event, in a
    transaction): a new group, or a closed group coming back, becomes an event for the endpoints."""
    group = FailureGroup.objects.select_related("project").get(id=group_id)
    if group_created:
        fields = {"group": _group_fields(group), "report": _report_fields(report)}
        return event_emit(project=group.project, kind=EventKind.GROUP_NEW, fields=fields, group=group)
    closure = _group_reopen(group_id=group_id, report=report)
    if closure is None:
        return None
    group_fields = _group_fields(group)
    group_fields["closed"] = {
        "at": _iso(closure.closed_at),
        "kind": closure.closed_kind,
        "reason": closure.closed_reason,
    }
    fields = {"group": group_fields, "report": _report_fields(report)}
    return event_emit(project=group.project, kind=EventKind.GROUP_RETURNED, fields=fields, group=group)


def event_payloads_of_report(*, report_id: int, group_id: int | None) -> dict[int, dict[str, Any]]:
    """The stored payloads that may quote a report: its own events and its group's (for redaction)."""
    quoting = Q(payload__report__id=report_id)
    if group_id:
        quoting |= Q(group_id=group_id)
    return dict(Event.objects.filter(quoting).values_list("id", "payload"))


def event_payloads_replace(payloads: dict[int, dict[str, Any]]) -> int:
    """Store redacted payloads; deliveries not yet sent send these. Returns how many changed."""
    return sum(
        Event.objects.filter(id=event_id).update(payload=payload) for event_id, payload in payloads.items()
    )


def notify_decision_stale(
    *, project: Project | int, record_id: int, number: int, title: str, reason: str, url: str
) -> Event | None:
    """A decision record turned stale (called by decisions once per staleness, with primitives only).
    `url` may be a dashboard path or an absolute URL."""
    if not isinstance(project, Project):
        project = Project.objects.get(id=project)
    fields = {
        "decision": {
            "id": record_id,
            "number": number,
            "label": f"DR-{number}",
            "title": title,
            "reason": reason,
            "url": absolute_url(url) if url else "",
        }
    }
    return event_emit(project=project, kind=EventKind.DECISION_STALE, fields=fields)


# ---------------------------------------------------------------- closing and reopening groups


def group_close(*, group: FailureGroup, kind: str, reason: str) -> bool:
    """Mark the group closed: by a confirm run that ended fixed (GroupClosure.Kind.FIX_CONFIRMED) or by a
    decision record linked to it that became accepted (DECISION_ACCEPTED). A report created after this
    that lands in the group reopens it and emits group.returned. False when it was closed already (the
    first reason stays)."""
    if kind not in GroupClosure.Kind.values:
        raise ValueError(f"unknown closing kind {kind!r}; one of {', '.join(GroupClosure.Kind.values)}")
    with transaction.atomic():
        closure, _ = GroupClosure.objects.get_or_create(group=group)
        updated = GroupClosure.objects.filter(id=closure.id, closed_at__isnull=True).update(
            closed_at=timezone.now(), closed_kind=kind, closed_reason=reason[:500]
        )
    if updated:
        logger.info("failure group %s closed: %s", group.id, reason)
    return updated == 1


def groups_close(*, project_id: int, fingerprints: list[str], kind: str, reason: str) -> int:
    """group_close for the groups of these fingerprints in a project (decision records link groups by
    fingerprint). Returns how many were closed now."""
    groups = FailureGroup.objects.filter(project_id=project_id, fingerprint__in=fingerprints)
    return sum(group_close(group=group, kind=kind, reason=reason) for group in groups)


def _group_reopen(*, group_id: int, report: Report) -> GroupClosure | None:
    """Reopen the group when it is closed and the report was created after the close: the closure as
    it was (closed_at, kind, reason), or None. A report uploaded before the close that is parsed
    late is old news, not a return."""
    closure = (
        GroupClosure.objects.select_for_update().filter(group_id=group_id, closed_at__isnull=False).first()
    )
    if closure is None or closure.closed_at is None or report.created_at < closure.closed_at:
        return None
    updated = GroupClosure.objects.filter(id=closure.id, closed_at=closure.closed_at).update(
        closed_at=None, reopened_at=timezone.now(), reopened_by=report, times_reopened=F("times_reopened") + 1
    )
    if not updated:
        return None
    logger.info("failure group %s came back with report %s (%s)", group_id, report.id, closure.closed_reason)
    return closure
