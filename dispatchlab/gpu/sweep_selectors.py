"""Which sweeps a user may see: those of the projects they belong to (another project's is a 404)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from dispatchlab.gpu.models import SweepRun
from dispatchlab.reports.models import Report
from dispatchlab.reports.selectors import projects_of


def sweeps_visible_to(user: Any) -> QuerySet[SweepRun]:
    if not user.is_authenticated:
        return SweepRun.objects.none()
    return SweepRun.objects.filter(project__in=projects_of(user))


def sweeps_of_report(report: Report) -> QuerySet[SweepRun]:
    """The report's sweeps, newest first."""
    return SweepRun.objects.filter(report=report, project=report.project).order_by("-created_at", "-id")
