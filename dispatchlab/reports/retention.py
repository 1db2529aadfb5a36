"""Deleting reports: one by hand, or those past their project's retention, and what stopped parses left
on disk."""

from __future__ import annotations

import contextlib
import logging
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from dispatchlab.reports.analysis import _leftovers_remove, _reports_folder
from dispatchlab.reports.groups import failuregroup_refresh
from dispatchlab.reports.models import Project, Report
from dispatchlab.reports.submit import _delete_stored

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------- retention


def project_retention_days(project: Project) -> int:
    """Days a project's reports are kept; 0: forever."""
    if project.retention_days is not None:
        return project.retention_days
    return int(settings.DISPATCHLAB_RETENTION_DAYS)


def _text_copy_delete(report: Report) -> None:
    """The worker's plain-text copy of the log and its line index."""
    for path in (report.text_path, report.index_path):
        if path:
            with contextlib.suppress(OSError):
                Path(path).unlink(missing_ok=True)


def _report_files_delete(report: Report) -> None:
    """The uploads in storage and the worker's text copy and line index."""
    _delete_stored([item.file.name for item in report.files.all()])
    _text_copy_delete(report)


def report_delete(*, report: Report) -> None:
    """Delete a report, its stored files and its line index; its failure group is recounted.
    Decision records that name it stay (their link keeps the id)."""
    group_id = report.group_id
    _report_files_delete(report)
    with transaction.atomic():
        report.delete()
        if group_id is not None:
            failuregroup_refresh(group_id=group_id)


def reports_prune_expired(*, now: Any = None, batch: int = 500) -> int:
    """Delete the reports older than their project's retention (reports being parsed wait for the
    next run). Returns how many were deleted."""
    now = now or timezone.now()
    deleted = 0
    for project in Project.objects.order_by("id"):
        days = project_retention_days(project)
        if not days:
            continue
        expired = Report.objects.filter(project=project, created_at__lt=now - timedelta(days=days)).exclude(
            status=Report.Status.PARSING
        )
        for report in expired.prefetch_related("files")[:batch]:
            report_delete(report=report)
            deleted += 1
    if deleted:
        logger.info("retention: deleted %d reports past their project's retention", deleted)
    reports_leftovers_sweep()
    return deleted


def reports_leftovers_sweep() -> int:
    """Remove what stopped parses left under MEDIA_ROOT/reports (temporary copies, scan workers' parts)
    of reports not being parsed, and the folders of deleted reports. Returns the bytes freed."""
    folders: dict[int, Path] = {}
    with contextlib.suppress(FileNotFoundError):
        folders = {int(f.name): f for f in _reports_folder().iterdir() if f.is_dir() and f.name.isdigit()}
    if not folders:
        return 0
    known = dict(Report.objects.filter(id__in=list(folders)).values_list("id", "status"))
    freed = 0
    for report_id, folder in folders.items():
        status = known.get(report_id)
        if status is None:
            freed += sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
            shutil.rmtree(folder, ignore_errors=True)
        elif (
            status != Report.Status.PARSING
        ):  # a running parse's files are its own; a resume clears a dead one's
            freed += _leftovers_remove(folder)
    if freed:
        logger.info("retention: removed %d bytes left by stopped parses", freed)
    return freed
