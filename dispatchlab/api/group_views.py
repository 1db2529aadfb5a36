"""The JSON API of failure groups: reports of one project with the same crash fingerprint, filtered as the
failure-groups page filters them (dispatchlab.reports.selectors.groups_filtered)."""

from __future__ import annotations

from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse

from dispatchlab.api.auth import authenticate, error
from dispatchlab.api.pagination import page_answer
from dispatchlab.api.schema import operation
from dispatchlab.api.shapes import Error, Group, GroupListQuery, GroupPage, GroupSummary
from dispatchlab.api.views import LIST_DEFER, report_summary
from dispatchlab.decisions.selectors import group_decision_refs
from dispatchlab.reports.models import FailureGroup, Report
from dispatchlab.reports.selectors import groups_filtered, groups_visible_to

RECENT_REPORTS = 20


def group_summary(request: HttpRequest, group: FailureGroup) -> GroupSummary:
    return GroupSummary(
        id=group.id,
        fingerprint=group.fingerprint,
        title=group.title,
        failure_class=group.failure_class or None,
        project=group.project.slug,
        count=group.count,
        first_seen=group.first_seen.isoformat(),
        last_seen=group.last_seen.isoformat(),
        url=request.build_absolute_uri(reverse("front:group", args=[group.id])),
    )


@operation(
    "GET",
    "groups_list",
    summary="Failure groups of the caller's projects, the most recently seen first, with the page's filters",
    query=GroupListQuery,
    answers={200: (GroupPage, "A page of groups.")},
    tags=("groups",),
)
def groups(request: HttpRequest, *, query: GroupListQuery) -> HttpResponse:
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    filters = {key: value for key, value in query.items() if key not in ("page", "limit")}
    found = groups_filtered(groups_visible_to(caller.user).filter(project__in=caller.projects()), **filters)
    ordered = found.order_by("-last_seen", "-id")
    return JsonResponse(
        GroupPage(**page_answer(request, query, ordered, lambda g: group_summary(request, g)))
    )


def _distinct(reports: QuerySet[Report], column: str) -> list[str]:
    return sorted(value for value in reports.order_by().values_list(column, flat=True).distinct() if value)


@operation(
    "GET",
    "groups_read",
    summary="A failure group: its newest reports, arches, server versions and linked decision records",
    answers={200: (Group, "The group."), 404: (Error, "No such group, or not in the caller's projects.")},
    tags=("groups",),
)
def group(request: HttpRequest, group_id: int) -> HttpResponse:
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    found = groups_visible_to(caller.user).filter(project__in=caller.projects(), id=group_id).first()
    if found is None:
        return error("no such failure group", 404)
    reports = caller.reports().filter(group=found)
    recent = reports.defer(*LIST_DEFER).order_by("-created_at", "-id")[:RECENT_REPORTS]
    signatures = _distinct(reports, "top_match_id")
    return JsonResponse(
        Group(
            **group_summary(request, found),
            arches=_distinct(reports, "arch"),
            server_versions=_distinct(reports, "server_version"),
            signatures=signatures,
            reports=[report_summary(request, report) for report in recent],
            decisions=group_decision_refs(found, signatures),  # type: ignore[typeddict-item]
        )
    )
