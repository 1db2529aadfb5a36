"""Failure groups: the reports of one fingerprint in a project, counted from their reports, and the
denormalised report columns a match document gives."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models import Count, Max, Min

from dispatchlab.reports.models import FailureGroup, Report

logger = logging.getLogger(__name__)


def _text(value: Any, limit: int) -> str:
    return "" if value is None else str(value)[:limit]


def report_columns(document: dict[str, Any]) -> dict[str, Any]:
    """The denormalised Report columns of a match document."""
    matches = document.get("matches") or []
    top = matches[0] if matches and isinstance(matches[0], dict) else {}
    gpu = document.get("gpu") or {}
    backends: dict[str, Any] = {}
    for key, value in (document.get("backends") or {}).items():
        backends[key] = value
    for key, value in (document.get("draft_backends") or {}).items():
        backends[f"draft_{key}"] = value
    return {
        "failure_class": _text(document.get("failure_class") or "none", 40),
        "top_match_id": _text(top.get("id"), 200),
        "top_match_title": _text(top.get("title"), 300),
        "fingerprint": _text(document.get("fingerprint"), 64),
        "server": _text(document.get("server"), 20),
        "server_version": _text(document.get("server_version"), 100),
        "gpu_name": _text(gpu.get("name"), 200),
        "arch": _text(gpu.get("arch"), 20),
        "model_name": _text(document.get("model"), 300),
        "outcome": _text(document.get("outcome"), 20),
        "kb_digest": _text(document.get("kb_digest"), 64),
        "backend_values": backends,
    }


def _group_title(document: dict[str, Any], columns: dict[str, Any]) -> str:
    if columns["top_match_title"]:
        return str(columns["top_match_title"])
    crash = document.get("crash") or {}
    parts = [str(crash.get("exception") or ""), str(crash.get("message") or "")]
    title = ": ".join(part for part in parts if part)
    return (title or str(columns["failure_class"]))[:300]


def failuregroup_refresh(*, group_id: int) -> None:
    """Recount a group from its reports; a group left without reports is deleted.

    The group row is locked before counting: two workers moving reports into the same group would
    otherwise each count without the other's uncommitted report, and the later write would be short.
    Waiting for the lock lets the count see the other transaction once it has committed.
    """
    with transaction.atomic():
        if FailureGroup.objects.select_for_update().filter(id=group_id).first() is None:
            return
        stats = Report.objects.filter(group_id=group_id).aggregate(
            count=Count("id"), first_seen=Min("created_at"), last_seen=Max("created_at")
        )
        if not stats["count"]:
            FailureGroup.objects.filter(id=group_id).delete()
            return
        FailureGroup.objects.filter(id=group_id).update(
            count=stats["count"], first_seen=stats["first_seen"], last_seen=stats["last_seen"]
        )
