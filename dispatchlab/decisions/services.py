"""Everything that changes decision records. Views, tasks and commands call these.

- `decision_create` / `decision_update` validate (field-level messages for people), store the record, its
  links and one history entry with every changed field (from, to), then, once committed, refresh the
  match documents of the reports the record concerns (task `decisions.refresh`).
- `decisions_report_parsed` answers the pipeline's ReportParsed event (decisions.handlers): a log that
  shows a version meeting a record's revisit-when condition makes the record stale
  (`decision_mark_stale`, a conditional UPDATE, so `on_stale` runs once however many logs show it, and
  announces DecisionTurnedStale), then the report's document gets its decisions.
- `report_attach_decisions` writes `document["decisions"]` and `document["matches"][i]["decisions"]` with
  the same core function the CLI uses (dispatchlab.core.decisions.attach_decisions).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.db.models import Max, Q
from django.utils import timezone

from dispatchlab.core.decisions import (
    attach_decisions,
    can_go_stale,
    document_versions,
    revisit_hit,
)
from dispatchlab.decisions.models import Decision, DecisionEdit, DecisionLink
from dispatchlab.decisions.selectors import core_record, decision_links, records_for_document
from dispatchlab.decisions.validation import (
    HISTORY_FIELDS,
    KIND_OF,
    LINK_KINDS,
    decision_clean,
)
from dispatchlab.reports.models import Project, Report

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------- create, update, history


def _snapshot(decision: Decision, links: Mapping[str, list[Any]]) -> dict[str, Any]:
    values: dict[str, Any] = {
        "title": decision.title,
        "status": decision.status,
        "context": decision.context,
        "decision": decision.decision,
        "consequences": decision.consequences,
        "alternatives": list(decision.alternatives or []),
        "revisit_when": dict(decision.revisit_when or {}),
        "superseded_by": decision.superseded_by_id,
    }
    for kind in LINK_KINDS:
        values[f"links.{kind}"] = list(links.get(kind, []))
    return values


def _set_links(decision: Decision, links: Mapping[str, list[Any]]) -> None:
    decision.links.all().delete()
    DecisionLink.objects.bulk_create(
        DecisionLink(decision=decision, kind=KIND_OF[kind], target=str(target), position=position)
        for kind in LINK_KINDS
        for position, target in enumerate(links.get(kind, []))
    )


def _refresh_on_commit(
    decision_id: int, previous: Mapping[str, list[Any]] | None, check_versions: bool
) -> None:
    from dispatchlab.decisions.tasks import decision_refresh_task

    payload = {kind: list(values) for kind, values in (previous or {}).items()}
    transaction.on_commit(
        lambda: decision_refresh_task.delay(decision_id, previous=payload, check_versions=check_versions)
    )


def decision_create(*, project: Project, user: AbstractBaseUser | None, data: Mapping[str, Any]) -> Decision:
    cleaned = decision_clean(data, project=project)
    links = cleaned.pop("links")
    now = timezone.now()
    with transaction.atomic():
        # The project row is the lock that hands out numbers one at a time (DR-1, DR-2, ...).
        Project.objects.select_for_update().filter(id=project.id).first()
        last = Decision.objects.filter(project=project).aggregate(last=Max("number"))["last"] or 0
        successor = cleaned.pop("superseded_by")
        decision = Decision.objects.create(
            project=project,
            number=last + 1,
            author=user,
            superseded_by_id=successor,
            created_at=now,
            updated_at=now,
            status_changed_at=now,
            **cleaned,
        )
        _set_links(decision, links)
        after = _snapshot(decision, links)
        DecisionEdit.objects.create(
            decision=decision,
            kind=DecisionEdit.Kind.CREATED,
            user=user,
            at=now,
            changes={field: {"from": None, "to": value} for field, value in after.items() if value},
        )
        _close_groups_when_accepted(decision, links)
        _refresh_on_commit(decision.id, None, check_versions=bool(decision.revisit_when))
    logger.info("decision %s of %s created by %s", decision.label, project.slug, user)
    return decision


def decision_update(
    *, decision: Decision, user: AbstractBaseUser | None, data: Mapping[str, Any]
) -> Decision:
    """Apply the fields given; a changed revisit-when condition clears the staleness (and is checked
    against the project's logs again). Returns the record; no history entry when nothing changed."""
    cleaned = decision_clean(data, project=decision.project, instance=decision)
    now = timezone.now()
    with transaction.atomic():
        decision = Decision.objects.select_for_update().select_related("project").get(id=decision.id)
        before_links = decision_links(decision)
        before = _snapshot(decision, before_links)
        links = cleaned.pop("links", before_links)
        if "superseded_by" in cleaned:
            decision.superseded_by_id = cleaned.pop("superseded_by")
        for field, value in cleaned.items():
            setattr(decision, field, value)
        after = _snapshot(decision, links)
        changes = {
            field: {"from": before[field], "to": after[field]}
            for field in HISTORY_FIELDS
            if before[field] != after[field]
        }
        if not changes:
            return decision
        if "status" in changes:
            decision.status_changed_at = now
        revisit_changed = "revisit_when" in changes
        if revisit_changed and decision.stale:
            changes["stale"] = {"from": True, "to": False}
            changes["stale_reason"] = {"from": decision.stale_reason, "to": None}
            decision.stale, decision.stale_reason = False, ""
            decision.stale_since, decision.stale_report = None, None
        decision.updated_at = now
        decision.save()
        if any(field.startswith("links.") for field in changes):
            _set_links(decision, links)
        DecisionEdit.objects.create(
            decision=decision, kind=DecisionEdit.Kind.EDITED, user=user, at=now, changes=changes
        )
        if "status" in changes or "links.groups" in changes:
            _close_groups_when_accepted(decision, links)
        _refresh_on_commit(decision.id, before_links, check_versions=revisit_changed)
    logger.info(
        "decision %s of %s edited by %s: %s", decision.label, decision.project.slug, user, sorted(changes)
    )
    return decision


# ---------------------------------------------------------------- staleness


def on_stale(record: Decision) -> None:
    """A record turned stale (once per staleness): announced, so the project's endpoints hear of it."""
    from django.urls import reverse

    from dispatchlab.events import DecisionTurnedStale, announce

    logger.info(
        "decision %s of project %s (%s) is stale: %s",
        record.label,
        record.project.slug,
        record.title,
        record.stale_reason,
    )
    announce(
        DecisionTurnedStale(
            project_id=record.project_id,
            record_id=record.id,
            number=record.number,
            title=record.title,
            reason=record.stale_reason,
            url=reverse("front:decision", args=[record.id]),
        )
    )


def _close_groups_when_accepted(decision: Decision, links: Mapping[str, Any]) -> None:
    """An accepted record closes the failure groups it links: a new report in one of them is news."""
    if decision.status != Decision.Status.ACCEPTED:
        return
    from dispatchlab.notify.models import GroupClosure
    from dispatchlab.notify.services import groups_close

    fingerprints = [str(f) for f in (links.get("groups") or [])]
    if fingerprints:
        groups_close(
            project_id=decision.project_id,
            fingerprints=fingerprints,
            kind=GroupClosure.Kind.DECISION_ACCEPTED,
            reason=f"{decision.label} accepted: {decision.title}",
        )


def decision_mark_stale(
    *, decision_id: int, reason: str, report_id: int | None, refresh: bool = True
) -> bool:
    """Mark the record stale unless it already is: a conditional UPDATE, so two workers parsing two logs
    that both show the version call `on_stale` once between them. True when this call marked it."""
    now = timezone.now()
    with transaction.atomic():
        updated = Decision.objects.filter(id=decision_id, stale=False).update(
            stale=True, stale_reason=reason[:500], stale_since=now, stale_report_id=report_id
        )
        if not updated:
            return False
        DecisionEdit.objects.create(
            decision_id=decision_id,
            kind=DecisionEdit.Kind.STALE,
            user=None,
            at=now,
            changes={
                "stale": {"from": False, "to": True},
                "stale_reason": {"from": None, "to": reason[:500]},
            },
        )
        decision = Decision.objects.select_related("project").get(id=decision_id)
        transaction.on_commit(lambda: on_stale(decision))
        if refresh:
            # The documents that list the record now say it is stale.
            _refresh_on_commit(decision_id, None, check_versions=False)
    return True


def decision_check_project_logs(*, decision: Decision) -> bool:
    """After a new revisit-when condition: the newest log of the project that already meets it makes the
    record stale. True when it did."""
    record = core_record(decision)
    if not can_go_stale(record):
        return False
    rows = (
        Report.objects.filter(
            project_id=decision.project_id, status=Report.Status.DONE, document__isnull=False
        )
        .order_by("-created_at", "-id")
        .values_list("id", "server", "server_version", "document__versions")
    )
    for report_id, server, server_version, versions in rows.iterator():
        shown = document_versions(
            {"server": server, "server_version": server_version, "versions": versions or {}}
        )
        hit = revisit_hit(record.revisit_when, shown)
        if hit is not None:
            return decision_mark_stale(
                decision_id=decision.id,
                reason=hit.reason(f"report {report_id}"),
                report_id=report_id,
                refresh=False,
            )
    return False


# ---------------------------------------------------------------- documents


def _decision_fields(document: Mapping[str, Any]) -> list[Any]:
    return [document.get("decisions")] + [
        m.get("decisions") for m in document.get("matches") or [] if isinstance(m, dict)
    ]


def report_attach_decisions(*, report_id: int) -> bool:
    """Write the records linked to the report into its stored document. True when it changed."""
    with transaction.atomic():
        report = (
            Report.objects.select_for_update()
            .filter(id=report_id)
            .only("id", "project_id", "document")
            .first()
        )
        if report is None or not isinstance(report.document, dict):
            return False
        document = report.document
        before = _decision_fields(document)
        records = records_for_document(project_id=report.project_id, document=document, report_id=report.id)
        attach_decisions(document, records, report_id=report.id, source=f"report {report.id}")
        if _decision_fields(document) == before and "decisions" in document:
            return False
        Report.objects.filter(id=report.id).update(document=document)
    return True


def decisions_report_parsed(*, report_id: int) -> None:
    """The parse pipeline's hook, once a report is done: revisit-when conditions its log meets make their
    records stale, then its document lists the records linked to it."""
    row = (
        Report.objects.filter(id=report_id, status=Report.Status.DONE)
        .values("project_id", "server", "server_version", "document__versions")
        .first()
    )
    if row is None:
        return
    shown = document_versions(
        {
            "server": row["server"],
            "server_version": row["server_version"],
            "versions": row["document__versions"] or {},
        }
    )
    if shown:
        candidates = Decision.objects.filter(project_id=row["project_id"], stale=False).exclude(
            status=Decision.Status.SUPERSEDED
        )
        for decision in candidates.only("id", "revisit_when"):
            hit = revisit_hit(decision.revisit_when or {}, shown)
            if hit is not None:
                decision_mark_stale(
                    decision_id=decision.id, reason=hit.reason(f"report {report_id}"), report_id=report_id
                )
    report_attach_decisions(report_id=report_id)


def _reports_with_signatures(reports: Any, signatures: set[str]) -> set[int]:
    """Reports with any match (not only the top one) of these signatures."""
    if not signatures:
        return set()
    if connection.vendor == "postgresql":
        query = Q()
        for signature in signatures:
            query |= Q(document__matches__contains=[{"id": signature}])
        return set(reports.filter(query).values_list("id", flat=True))
    found = set()
    for report_id, matches in reports.values_list("id", "document__matches").iterator():
        if isinstance(matches, list) and any(
            isinstance(m, dict) and m.get("id") in signatures for m in matches
        ):
            found.add(report_id)
    return found


def affected_reports(*, project_id: int, links: Iterable[Mapping[str, list[Any]]]) -> list[int]:
    """Ids of the project's reports whose documents list records with these links."""
    groups: set[str] = set()
    signatures: set[str] = set()
    report_ids: set[int] = set()
    for one in links:
        groups.update(str(g) for g in one.get("groups", []))
        signatures.update(str(s) for s in one.get("signatures", []))
        report_ids.update(int(r) for r in one.get("reports", []))
    reports = Report.objects.filter(project_id=project_id, document__isnull=False)
    found = set(
        reports.filter(
            Q(fingerprint__in=groups) | Q(id__in=report_ids) | Q(top_match_id__in=signatures)
        ).values_list("id", flat=True)
    )
    found |= _reports_with_signatures(reports.exclude(id__in=found), signatures)
    return sorted(found)


def decision_refresh(
    *, decision_id: int, previous: Mapping[str, list[Any]] | None = None, check_versions: bool = False
) -> int:
    """After a record changed: check a new revisit-when condition against the project's logs, then
    rewrite the documents of the reports it concerns (by its links now and before). Returns how many
    documents changed."""
    decision = Decision.objects.filter(id=decision_id).select_related("project").first()
    if decision is None:
        return 0
    if check_versions:
        decision_check_project_logs(decision=decision)
    current = decision_links(decision)
    changed = 0
    for report_id in affected_reports(project_id=decision.project_id, links=[current, previous or {}]):
        changed += report_attach_decisions(report_id=report_id)
    return changed
