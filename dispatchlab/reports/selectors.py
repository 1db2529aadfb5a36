"""Read-only queries, always scoped to what the user may see (their projects' rows)."""

from __future__ import annotations

from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from dispatchlab.core.reading import LineIndex
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


def groups_visible_to(user: AbstractBaseUser | AnonymousUser) -> QuerySet[FailureGroup]:
    if not user.is_authenticated:
        return FailureGroup.objects.none()
    return FailureGroup.objects.filter(project__memberships__user=user).select_related("project")


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
