"""Read-only queries, always scoped to what the user may see (their projects' rows)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Max, Q, QuerySet, TextField
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from dispatchlab.core.lineindex import LineIndex
from dispatchlab.reports.models import FailureGroup, Membership, Project, Report


def projects_of(user: AbstractBaseUser | AnonymousUser) -> QuerySet[Project]:
    if not user.is_authenticated:
        return Project.objects.none()
    return Project.objects.filter(memberships__user=user)


def projects_uploadable_by(user: AbstractBaseUser | AnonymousUser) -> QuerySet[Project]:
    """Projects where the user may upload (members; viewers only read)."""
    if not user.is_authenticated:
        return Project.objects.none()
    return Project.objects.filter(memberships__user=user, memberships__role=Membership.Role.MEMBER)


def reports_visible_to(user: AbstractBaseUser | AnonymousUser) -> QuerySet[Report]:
    if not user.is_authenticated:
        return Report.objects.none()
    return Report.objects.filter(project__memberships__user=user).select_related("project", "group")


def report_hidden_from(user: AbstractBaseUser | AnonymousUser, report_id: int) -> str | None:
    """Why a signed-in user cannot see report `report_id` that exists: "you are not a member of project
    NAME" (only the project's name, nothing of the report). None when there is no such report, or for
    an anonymous caller (who is sent to log in and learns nothing)."""
    if not user.is_authenticated:
        return None
    name = Report.objects.filter(pk=report_id).values_list("project__name", flat=True).first()
    return None if name is None else f"you are not a member of project {name}"


def _spells_id(text: str) -> bool:
    """Whether a search text may be a row's id (ASCII digits, short enough for a bigint)."""
    return text.isascii() and text.isdigit() and len(text) <= 12


def project_named(projects: QuerySet[Project], name: str, *, by_id: bool = False) -> Project | None:
    """The project of `projects` whose slug or name is `name` (or, with `by_id`, whose id it spells)."""
    match = Q(slug=name) | Q(name=name)
    if by_id and _spells_id(name):
        match |= Q(id=int(name))
    return projects.filter(match).first()


def groups_visible_to(user: AbstractBaseUser | AnonymousUser) -> QuerySet[FailureGroup]:
    if not user.is_authenticated:
        return FailureGroup.objects.none()
    return FailureGroup.objects.filter(project__memberships__user=user).select_related("project")


# ---------------------------------------------------------------- filters (the pages' and the API's)

BACKEND_KEY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,80}$")
BACKEND_KEY_PROBLEM = "key=value: the key is a backend name such as attention_backend"


def backend_filter_problem(value: str) -> str | None:
    """Why a backend filter cannot be read, or None."""
    if "=" in value and not BACKEND_KEY_RE.match(value.split("=", 1)[0].strip()):
        return BACKEND_KEY_PROBLEM
    return None


def _backend_filter(reports: QuerySet[Report], value: str) -> QuerySet[Report]:
    """key=value matches that key of the main or the draft model; a bare value matches the value of
    any key (never a key's name)."""
    if "=" in value:
        key, wanted = (part.strip() for part in value.split("=", 1))
        key = key.removeprefix("draft_")
        return reports.alias(
            _main=KeyTextTransform(key, "backend_values"),
            _draft=KeyTextTransform(f"draft_{key}", "backend_values"),
        ).filter(Q(_main__iexact=wanted) | Q(_draft__iexact=wanted))
    # The column's JSON text ({"key": "value", ...}, as json.dumps and PostgreSQL's jsonb both write
    # it) holds each string value after a colon and a space; a key is preceded by "{" or ", ".
    # A colon inside a string is written escaped before its quote, so it cannot fake the pattern.
    needle = json.dumps(value, ensure_ascii=False)
    return reports.alias(_backends=Cast("backend_values", TextField())).filter(
        _backends__icontains=f": {needle}"
    )


def _text_filter(reports: QuerySet[Report], text: str) -> QuerySet[Report]:
    query = Q()
    for column in (
        "title",
        "top_match_title",
        "top_match_id",
        "model_name",
        "gpu_name",
        "server_version",
        "failure_class",
        "launch_command",
        "ci_job",
        "files__original_name",
    ):
        query |= Q(**{f"{column}__icontains": text})
    query |= Q(fingerprint__istartswith=text)
    if _spells_id(text):
        query |= Q(pk=int(text))
    # the join on files can repeat a report: keep ids in a subquery instead of .distinct() on big rows
    return reports.filter(pk__in=Report.objects.filter(query).values("pk"))


# The filters that keep the rows whose column equals the value: filter name -> column.
REPORT_COLUMNS = {
    "project": "project__slug",
    "server": "server",
    "arch": "arch",
    "failure_class": "failure_class",
    "signature": "top_match_id",
    "status": "status",
}
GROUP_COLUMNS = {"project": "project__slug", "failure_class": "failure_class"}


def _where_equal(found: QuerySet[Any], columns: dict[str, str], values: dict[str, str]) -> QuerySet[Any]:
    """Each non-empty value keeps the rows whose column equals it; an empty value is no filter."""
    unknown = values.keys() - columns.keys()
    if unknown:
        raise TypeError(f"no such filter: {', '.join(sorted(unknown))}")
    for name, value in values.items():
        if value:
            found = found.filter(**{columns[name]: value})
    return found


def reports_filtered(
    reports: QuerySet[Report], *, q: str = "", backend: str = "", **equal: str
) -> QuerySet[Report]:
    """The reports list's filters (the page's form and GET /api/v1/reports): q, backend and the names of
    REPORT_COLUMNS. An empty value is no filter; a value no report has lists nothing. A backend value
    that backend_filter_problem() refuses must be refused by the caller before (it is read here as
    given)."""
    reports = _where_equal(reports, REPORT_COLUMNS, equal)
    if backend:
        reports = _backend_filter(reports, backend)
    if q:
        reports = _text_filter(reports, q)
    return reports


def groups_filtered(
    groups: QuerySet[FailureGroup], *, q: str = "", arch: str = "", **equal: str
) -> QuerySet[FailureGroup]:
    """The failure groups list's filters (the page's form and GET /api/v1/groups): q, arch and the names
    of GROUP_COLUMNS."""
    groups = _where_equal(groups, GROUP_COLUMNS, equal)
    if arch:
        groups = groups.filter(pk__in=Report.objects.filter(arch=arch).values("group_id"))
    if q:
        groups = groups.filter(Q(title__icontains=q) | Q(fingerprint__istartswith=q))
    return groups


def user_can_upload(*, user: AbstractBaseUser | AnonymousUser, project: Project) -> bool:
    return projects_uploadable_by(user).filter(id=project.id).exists()


def report_line_index(report: Report) -> LineIndex | None:
    """Random access to the report's normalised log text, or None before it is parsed."""
    if not report.text_path or not report.index_path:
        return None
    text, index = Path(report.text_path), Path(report.index_path)
    if not text.exists() or not index.exists():
        return None
    return LineIndex(text, index)


# ---------------------------------------------------------------- similar failure groups

# the most recently seen groups of a project that a report is compared with (a bound on the page's cost)
SIMILAR_GROUPS_SCANNED = 300


def report_similar_groups(report: Report) -> list[tuple[FailureGroup, float]]:
    """The other failure groups of the report's own project whose newest report's failure evidence reads
    most like this report's, best first, with the similarity (the known cases' measure, same floor).

    Ranked when the page or the API answer is made, not when the report is parsed: groups appear, are
    merged by a re-match and are pruned after the report was parsed, and a list frozen then would miss
    the newer ones and link to deleted ones."""
    from dispatchlab.core.similar import EVIDENCE_KEYS, evidence_of, load_index

    document = report.document if isinstance(report.document, dict) else None
    text = evidence_of(document) if document else ""
    if not text:
        return []
    groups = {
        g.id: g
        for g in FailureGroup.objects.filter(project_id=report.project_id)
        .exclude(id=report.group_id)
        .order_by("-last_seen", "-id")[:SIMILAR_GROUPS_SCANNED]
    }
    newest = (
        Report.objects.filter(group_id__in=list(groups), project_id=report.project_id, document__isnull=False)
        .values("group_id")
        .annotate(newest=Max("id"))
        .values_list("newest", flat=True)
    )
    keys = {key: f"document__{key}" for key in EVIDENCE_KEYS if key != "matches"}
    rows = Report.objects.filter(id__in=list(newest)).values(
        "group_id", "document__matches__0", *keys.values()
    )
    texts: dict[int, str] = {}
    for row in rows:
        parts = {key: row[column] for key, column in keys.items()}
        parts["matches"] = [row["document__matches__0"]] if row["document__matches__0"] else []
        texts[row["group_id"]] = evidence_of(parts)
    # the most recently seen first, so that of two groups alike the one seen last wins
    candidates = [(group_id, texts[group_id]) for group_id in groups if group_id in texts]
    ranked = load_index().rank_texts(text, candidates)
    return [(groups[group_id], score) for group_id, score in ranked]


def report_similar_cases(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The known cases of the document (`similar.cases`); a document parsed before they existed gets
    them now, from the same index."""
    from dispatchlab.core.similar import similar_cases

    stored = document.get("similar")
    if isinstance(stored, dict) and isinstance(stored.get("cases"), list):
        return [c for c in stored["cases"] if isinstance(c, dict)]
    return [c.to_dict() for c in similar_cases(document)]
