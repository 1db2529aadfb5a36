"""Read-only queries of decision records, scoped to what the caller may see, and their core form."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Q, QuerySet

from dispatchlab.core.decisions import (
    DecisionRecord,
    DecisionRef,
    DecisionStatus,
    decision_ref,
    document_versions,
    order_records,
)
from dispatchlab.core.decisions import linked_to_document as core_linked
from dispatchlab.decisions.models import Decision, DecisionLink
from dispatchlab.reports.models import FailureGroup, Project, Report
from dispatchlab.reports.selectors import projects_of

User = AbstractBaseUser | AnonymousUser
PLURAL = {
    DecisionLink.Kind.GROUP: "groups",
    DecisionLink.Kind.SIGNATURE: "signatures",
    DecisionLink.Kind.REPORT: "reports",
    DecisionLink.Kind.UPSTREAM: "upstream",
}


def decisions_visible_to(user: User) -> QuerySet[Decision]:
    if not user.is_authenticated:
        return Decision.objects.none()
    return Decision.objects.filter(project__in=projects_of(user)).select_related("project", "author")


def decision_links(decision: Decision) -> dict[str, list[Any]]:
    """{"groups": [fingerprint], "signatures": [id], "reports": [id], "upstream": [url]} in the order
    people gave them (uses prefetched links when there are)."""
    out: dict[str, list[Any]] = {"groups": [], "signatures": [], "reports": [], "upstream": []}
    for link in sorted(decision.links.all(), key=lambda item: (item.kind, item.position, item.id)):
        kind = PLURAL[DecisionLink.Kind(link.kind)]
        out[kind].append(int(link.target) if kind == "reports" else link.target)
    return out


def core_record(decision: Decision) -> DecisionRecord:
    links = decision_links(decision)
    return DecisionRecord(
        id=decision.id,
        number=decision.number,
        title=decision.title,
        status=DecisionStatus(decision.status),
        groups=tuple(links["groups"]),
        signatures=tuple(links["signatures"]),
        reports=tuple(links["reports"]),
        revisit_when=dict(decision.revisit_when or {}),
        stale=decision.stale,
        stale_reason=decision.stale_reason,
        status_since=decision.status_changed_at.date().isoformat(),
    )


def _records(decisions: QuerySet[Decision]) -> list[DecisionRecord]:
    return [core_record(d) for d in decisions.distinct().prefetch_related("links")]


def records_for_document(
    *, project_id: int, document: Mapping[str, Any], report_id: int | None = None
) -> list[DecisionRecord]:
    """The project's records linked to any of the document's signatures, its fingerprint or the report."""
    signatures = [str(m["id"]) for m in document.get("matches") or [] if isinstance(m, dict) and m.get("id")]
    query = Q(links__kind=DecisionLink.Kind.SIGNATURE, links__target__in=signatures)
    fingerprint = document.get("fingerprint")
    if fingerprint:
        query |= Q(links__kind=DecisionLink.Kind.GROUP, links__target=str(fingerprint))
    if report_id is not None:
        query |= Q(links__kind=DecisionLink.Kind.REPORT, links__target=str(report_id))
    return _records(Decision.objects.filter(project_id=project_id).filter(query))


def report_decision_refs(report: Report) -> list[DecisionRef]:
    """What the report page shows above the diagnosis: the records linked to its fingerprint, top
    signature or id, read now (not from the stored document, which a refresh may not have reached)."""
    document = report.document if isinstance(report.document, dict) else {}
    records = records_for_document(project_id=report.project_id, document=document, report_id=report.id)
    versions = document_versions(document)
    return [
        decision_ref(r, versions, source=f"report {report.id}")
        for r in core_linked(document, records, report_id=report.id)
    ]


def group_decision_refs(group: FailureGroup, signatures: Iterable[str]) -> list[DecisionRef]:
    """Records linked to the group's fingerprint or to the top signature of its reports."""
    query = Q(links__kind=DecisionLink.Kind.GROUP, links__target=group.fingerprint) | Q(
        links__kind=DecisionLink.Kind.SIGNATURE, links__target__in=list(signatures)
    )
    records = _records(Decision.objects.filter(project_id=group.project_id).filter(query))
    # The group's reports differ in versions: the group page shows staleness as the records hold it.
    return [decision_ref(r) for r in order_records(records)]


def signature_decision_refs(signature_id: str, projects: QuerySet[Project]) -> list[DecisionRef]:
    """Records of these projects linked to the signature, accepted first."""
    decisions = Decision.objects.filter(
        project__in=projects, links__kind=DecisionLink.Kind.SIGNATURE, links__target=signature_id
    )
    return [decision_ref(r) for r in order_records(_records(decisions))]
