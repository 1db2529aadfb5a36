"""Decision records as JSON, where they leave the process (API, export): the docs/contract.md shape."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse

from dispatchlab.decisions.models import Decision, DecisionEdit
from dispatchlab.decisions.selectors import decision_links


def _absolute(request: HttpRequest | None, path: str) -> str:
    return request.build_absolute_uri(path) if request is not None else path


def _page(decision: Decision) -> str:
    try:
        return reverse("front:decision", args=[decision.id])
    except NoReverseMatch:  # a checkout without the pages
        return f"/decisions/{decision.id}/"


def decision_json(decision: Decision, *, request: HttpRequest | None = None) -> dict[str, Any]:
    return {
        "id": decision.id,
        "number": decision.number,
        "label": decision.label,
        "project": decision.project.slug,
        "title": decision.title,
        "status": decision.status,
        "context": decision.context,
        "decision": decision.decision,
        "consequences": decision.consequences,
        "alternatives": list(decision.alternatives or []),
        "links": decision_links(decision),
        "revisit_when": dict(decision.revisit_when or {}),
        "superseded_by": decision.superseded_by_id,
        "stale": decision.stale,
        "stale_reason": (decision.stale_reason or None) if decision.stale else None,
        "stale_since": decision.stale_since.isoformat() if decision.stale_since else None,
        "stale_report": decision.stale_report_id,
        "status_since": decision.status_changed_at.date().isoformat(),
        "author": decision.author.get_username() if decision.author else None,
        "created": decision.created_at.isoformat(),
        "updated": decision.updated_at.isoformat(),
        "url": _absolute(request, _page(decision)),
        "history_url": _absolute(request, reverse("api:decision_history", args=[decision.id])),
    }


def edit_json(edit: DecisionEdit) -> dict[str, Any]:
    return {
        "id": edit.id,
        "kind": edit.kind,
        "user": edit.user.get_username() if edit.user else None,
        "at": edit.at.isoformat(),
        "changes": edit.changes,
    }
