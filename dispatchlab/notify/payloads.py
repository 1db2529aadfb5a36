"""What an endpoint receives: the event vocabulary, the generic JSON body, the Slack-compatible body and
the signature. Standard library only, no database: services build an event's payload once, and each
delivery attempt turns it into bytes here.

Generic JSON (signed):

    {"event": "group.new", "event_id": 12, "occurred_at": "2026-12-01T10:02:03Z",
     "project": {"id": 1, "slug": "acme", "name": "Acme", "url": "..."},
     "group": {...}, "report": {...}}          # group.new, group.returned
     "decision": {...}                         # decision.stale
     "message": "..."                          # test

Headers on every delivery: X-Dispatchlab-Event, X-Dispatchlab-Delivery (a uuid, the same on every
retry of one delivery), X-Dispatchlab-Timestamp (unix seconds) and
X-Dispatchlab-Signature: sha256=<hex HMAC-SHA256 under the endpoint's secret over "<timestamp>.<raw body>">,
the scheme dispatchlab's own CI webhook accepts.
"""

from __future__ import annotations

import enum
import hmac
import json
from typing import Any

from dispatchlab.core.reporter import signature

SIGNATURE_HEADER = "X-Dispatchlab-Signature"
TIMESTAMP_HEADER = "X-Dispatchlab-Timestamp"
EVENT_HEADER = "X-Dispatchlab-Event"
DELIVERY_HEADER = "X-Dispatchlab-Delivery"
USER_AGENT = "dispatchlab-notify/1"


class EventKind(enum.StrEnum):
    GROUP_NEW = "group.new"
    GROUP_RETURNED = "group.returned"
    DECISION_STALE = "decision.stale"
    TEST = "test"  # "Send a test event": to one endpoint, subscribed or not

    @property
    def label(self) -> str:
        return EVENT_LABELS[self]


EVENT_LABELS = {
    EventKind.GROUP_NEW: "a new failure group (the first report of a new crash fingerprint)",
    EventKind.GROUP_RETURNED: "a closed failure group came back (a new report after a confirmed fix or an accepted decision)",
    EventKind.DECISION_STALE: "a decision record turned stale",
    EventKind.TEST: "a test event",
}
# What people can subscribe an endpoint to (the test event always goes to the endpoint it was sent to).
SUBSCRIBABLE = (EventKind.GROUP_NEW, EventKind.GROUP_RETURNED, EventKind.DECISION_STALE)


class EndpointKind(enum.StrEnum):
    SLACK = "slack"
    GENERIC = "generic"

    @property
    def label(self) -> str:
        return {
            EndpointKind.SLACK: "Slack-compatible incoming webhook (Slack, Mattermost, Rocket.Chat)",
            EndpointKind.GENERIC: "generic JSON, signed",
        }[self]


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The X-Dispatchlab-Signature value of a body sent at `timestamp` (the CI webhook's formula)."""
    return signature(secret, timestamp, body)


def verify(secret: str, timestamp: str, body: bytes, signature: str) -> bool:
    """What a receiver does (and the tests): recompute and compare in constant time."""
    try:
        expected = sign(secret, int(timestamp), body)
    except ValueError:
        return False
    return hmac.compare_digest(expected, signature.strip().lower())


def generic_body(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


# ---------------------------------------------------------------- Slack-compatible


def _escape(text: Any) -> str:
    """Slack's mrkdwn: &, < and > are control characters; '|' would end a link's label."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _link(url: str, label: Any) -> str:
    label = _escape(label).replace("|", "¦")
    return f"<{url}|{label}>" if url else label


def _report_words(report: dict[str, Any]) -> str:
    where = ", ".join(
        part
        for part in (
            " ".join(str(report.get(k) or "") for k in ("server", "server_version")).strip(),
            " ".join(str(report.get(k) or "") for k in ("gpu", "arch")).strip(),
        )
        if part
    )
    name = _link(str(report.get("url") or ""), report.get("title") or f"report {report.get('id')}")
    return f"{name} ({_escape(where)})" if where else name


def slack_text(payload: dict[str, Any]) -> str:
    """One message a person reads in a channel (also the fallback text of the blocks)."""
    event = payload.get("event")
    project = payload.get("project") or {}
    project_name = _escape(project.get("name") or project.get("slug") or "")
    group = payload.get("group") or {}
    report = payload.get("report") or {}
    group_link = _link(str(group.get("url") or ""), group.get("title") or group.get("fingerprint") or "")
    failure_class = f" (`{_escape(group['failure_class'])}`)" if group.get("failure_class") else ""
    if event == EventKind.GROUP_NEW:
        return f"*New failure group* in {project_name}: {group_link}{failure_class}. First report: {_report_words(report)}"
    if event == EventKind.GROUP_RETURNED:
        closed = group.get("closed") or {}
        why = f" ({_escape(closed['reason'])})" if closed.get("reason") else ""
        when = f" on {_escape(closed['at'][:16].replace('T', ' '))}" if closed.get("at") else ""
        return (
            f"*Failure group came back* in {project_name}: {group_link}{failure_class} had been closed"
            f"{when}{why}. New report: {_report_words(report)}"
        )
    if event == EventKind.DECISION_STALE:
        decision = payload.get("decision") or {}
        label = decision.get("label") or f"DR-{decision.get('number')}"
        title = _link(str(decision.get("url") or ""), f"{label}: {decision.get('title') or ''}")
        reason = f" {_escape(decision['reason'])}" if decision.get("reason") else ""
        return f"*Decision record turned stale* in {project_name}: {title}.{reason} Time to revisit it."
    return _escape(payload.get("message") or f"dispatchlab event {event} in {project.get('name') or ''}")


def slack_body(payload: dict[str, Any]) -> bytes:
    """What an incoming webhook accepts: `text` (shown by every Slack-compatible server, and by Slack in
    notifications) and `blocks` (Slack's layout; servers that do not know blocks ignore them)."""
    text = slack_text(payload)
    project = payload.get("project") or {}
    context = " · ".join(
        part
        for part in (
            "dispatchlab",
            _link(str(project.get("url") or ""), project.get("name") or project.get("slug") or ""),
            f"`{payload.get('event')}`",
            str(payload.get("occurred_at") or "")[:19].replace("T", " ") + " UTC",
        )
        if part
    )
    body = {
        "text": text,
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": text[:3000]}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": context[:3000]}]},
        ],
    }
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def render_body(kind: str, payload: dict[str, Any]) -> bytes:
    return slack_body(payload) if kind == EndpointKind.SLACK else generic_body(payload)
