"""Taking an upload in and queueing its analysis.

`report_submit` stores the upload (one or several files, one report) and enqueues `reports.analyze` on
commit; the same bytes or CI delivery again answer with the existing report. A finished report is
queued again by a re-match (the knowledge base changed), and `reports_requeue_stale` sends the task
again for reports a broker may have lost.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Sequence
from datetime import timedelta
from pathlib import PurePath

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import SuspiciousFileOperation, ValidationError
from django.core.files import File
from django.core.files.storage import default_storage
from django.db import IntegrityError, transaction
from django.db.models import Q, Sum
from django.utils import timezone
from django.utils.text import get_valid_filename

from dispatchlab.reports.models import Project, Report, ReportFile

logger = logging.getLogger(__name__)

MAX_FILES_PER_REPORT = 100
# Room for the multipart envelope (boundaries, other fields) around files of the maximum upload size.
UPLOAD_ENVELOPE_BYTES = 1024 * 1024


class UploadRejected(ValidationError):
    """The upload cannot become a report (no file, too large, too many files). Message for people."""


class UploadTooLarge(UploadRejected):
    """The upload is over DISPATCHLAB_MAX_UPLOAD_BYTES."""


class QuotaExceeded(UploadRejected):
    """The upload would take the project's stored uploads past its quota (HTTP 507)."""


# ---------------------------------------------------------------- uploads


def _original_name(file: File, position: int) -> str:
    raw = PurePath(str(file.name or "").replace("\\", "/")).name
    try:
        name = get_valid_filename(raw)
    except SuspiciousFileOperation:  # "." and ".."
        name = ""
    return (name or f"upload-{position}.log")[-200:]


def _file_size(file: File) -> int:
    size = getattr(file, "size", None)
    if size is None:
        file.seek(0, os.SEEK_END)
        size = file.tell()
        file.seek(0)
    return int(size)


def _checksum(files: Sequence[File]) -> str:
    digest = hashlib.sha256()
    for file in files:
        file.seek(0)
        for chunk in file.chunks():
            digest.update(chunk)
        file.seek(0)
    return digest.hexdigest()


def upload_refuse_by_length(
    *,
    content_length: str | None,
    limit: int | None = None,
    envelope: int = UPLOAD_ENVELOPE_BYTES,
    what: str = "the upload",
) -> None:
    """Refuse a request by its declared Content-Length, before a byte of the body is read.

    UploadTooLarge when it is over `limit` (default DISPATCHLAB_MAX_UPLOAD_BYTES) plus `envelope`;
    UploadRejected when the header is not a number. Without the header nothing is refused here: the
    body is then counted as it streams.
    """
    raw = (content_length or "").strip()
    if not raw:
        return
    if not (raw.isascii() and raw.isdigit()):
        raise UploadRejected("bad Content-Length")
    limit = settings.DISPATCHLAB_MAX_UPLOAD_BYTES if limit is None else limit
    length = int(raw)
    if length > limit + envelope:
        raise UploadTooLarge(f"{what} is {length:,} bytes; the limit is {limit:,} bytes")


def _enqueue(report_id: int) -> None:
    from dispatchlab.reports.tasks import report_analyze_task

    Report.objects.filter(id=report_id).update(enqueued_at=timezone.now())
    report_analyze_task.delay(report_id)


def report_enqueue_on_commit(*, report_id: int) -> None:
    # robust: a broker that is down must not turn a stored upload into an error page; the report
    # stays queued and reports.requeue_stale sends it again.
    transaction.on_commit(lambda: _enqueue(report_id), robust=True)


def report_submit(
    *,
    project: Project,
    user: AbstractBaseUser | None,
    files: Sequence[File],
    title: str = "",
    launch_command: str = "",
    ci_job: str = "",
    ci_url: str = "",
    ci_commit: str = "",
    delivery_id: str | None = None,
) -> tuple[Report, bool]:
    """Store an upload (one or several files making one report) and enqueue its analysis.

    Returns (report, created). The same bytes uploaded again to the same project, or the same CI
    delivery id, return the existing report and store nothing; a failed one is queued again.
    """
    if not files:
        raise UploadRejected("no file was uploaded")
    # PostgreSQL stores no NUL in text; a CI system that sends one in a field loses only that character.
    title, launch_command, ci_job, ci_url, ci_commit = (
        text.replace("\x00", "") for text in (title, launch_command, ci_job, ci_url, ci_commit)
    )
    delivery_id = delivery_id.replace("\x00", "") if delivery_id else delivery_id
    if len(files) > MAX_FILES_PER_REPORT:
        raise UploadRejected(f"{len(files)} files in one report; at most {MAX_FILES_PER_REPORT}")
    sizes = [_file_size(file) for file in files]
    limit = settings.DISPATCHLAB_MAX_UPLOAD_BYTES
    if sum(sizes) > limit:
        raise UploadTooLarge(f"the upload is {sum(sizes):,} bytes; the limit is {limit:,} bytes")

    if delivery_id:
        existing = Report.objects.filter(project=project, delivery_id=delivery_id).first()
        if existing is not None:
            return existing, False
    checksum = _checksum(files)
    existing = Report.objects.filter(project=project, checksum=checksum).first()
    if existing is not None:
        if delivery_id and existing.delivery_id is None:
            Report.objects.filter(id=existing.id, delivery_id__isnull=True).update(delivery_id=delivery_id)
        if existing.status == Report.Status.FAILED:
            # Uploading a failed log again is asking to try again (the core may have been fixed).
            report_rematch(report_id=existing.id)
            existing.refresh_from_db()
        return existing, False
    project_quota_check(project=project, adding=sum(sizes))

    names = [_original_name(file, position) for position, file in enumerate(files)]
    # Files go to storage before the transaction: a 2 GiB upload must not hold a database lock.
    stored: list[str] = []
    try:
        for position, (file, name) in enumerate(zip(files, names, strict=True)):
            file.seek(0)
            key = f"uploads/{project.slug}/{checksum[:2]}/{checksum[:16]}/{position}-{name}"
            stored.append(default_storage.save(key, file))
        with transaction.atomic():
            report = Report.objects.create(
                project=project,
                title=(title or ci_job or names[0])[:300],
                created_by=user if user is not None and user.is_authenticated else None,
                checksum=checksum,
                total_bytes=sum(sizes),
                launch_command=launch_command,
                ci_job=ci_job[:300],
                ci_url=ci_url[:1000],
                ci_commit=ci_commit[:100],
                delivery_id=delivery_id or None,
            )
            ReportFile.objects.bulk_create(
                ReportFile(report=report, file=key, original_name=name, size=size, position=position)
                for position, (key, name, size) in enumerate(zip(stored, names, sizes, strict=True))
            )
            report_enqueue_on_commit(report_id=report.id)
    except IntegrityError:
        # Someone stored the same upload (or delivery) at the same moment: theirs wins.
        _delete_stored(stored)
        existing = (
            Report.objects.filter(project=project, checksum=checksum).first()
            or Report.objects.filter(project=project, delivery_id=delivery_id).first()
        )
        if existing is None:
            raise
        return existing, False
    except BaseException:
        _delete_stored(stored)
        raise
    return report, True


def project_quota(project: Project) -> int:
    """The most bytes of uploads the project may store; 0: no quota."""
    if project.quota_bytes is not None:
        return project.quota_bytes
    return int(settings.DISPATCHLAB_PROJECT_QUOTA_BYTES)


def project_usage(project: Project) -> int:
    """Bytes of uploads the project stores (as uploaded, before the worker's text copy)."""
    return int(Report.objects.filter(project=project).aggregate(total=Sum("total_bytes"))["total"] or 0)


def project_quota_check(*, project: Project, adding: int) -> None:
    """QuotaExceeded when `adding` more bytes would take the project past its quota."""
    quota = project_quota(project)
    if not quota:
        return
    usage = project_usage(project)
    if usage + adding > quota:
        raise QuotaExceeded(
            f"project {project.slug} stores {usage:,} bytes of uploads; this upload of {adding:,} bytes "
            f"would pass its quota of {quota:,} bytes (DISPATCHLAB_PROJECT_QUOTA_BYTES); delete old "
            "reports or ask for a larger quota"
        )


def report_create(
    *, project: Project, user: AbstractBaseUser | None, files: Sequence[File], **text: str
) -> Report:
    """report_submit's report alone (`text`: its title, launch_command and CI fields); a duplicate (same
    bytes, same project) returns the existing report."""
    report, _ = report_submit(project=project, user=user, files=files, **text)  # type: ignore[arg-type]
    return report


def _delete_stored(names: Sequence[str]) -> None:
    for name in names:
        with contextlib.suppress(Exception):
            default_storage.delete(name)


# ---------------------------------------------------------------- re-matching and recovery


def report_rematch(*, report_id: int) -> bool:
    """Queue a finished report for another analysis (after the knowledge base changed). The old
    document stays visible until the new one replaces it."""
    updated = Report.objects.filter(
        id=report_id, status__in=[Report.Status.DONE, Report.Status.FAILED]
    ).update(status=Report.Status.QUEUED, progress=0.0, attempts=0, claimed_at=None, claim_token="")
    if updated:
        report_enqueue_on_commit(report_id=report_id)
    return updated == 1


def reports_rematch(
    *, project: Project | None = None, include_failed: bool = False, outdated_for: str | None = None
) -> int:
    """Queue done reports (of one project, or all) for another analysis; with outdated_for, only
    those matched by another knowledge-base digest. Returns how many were queued."""
    statuses = [Report.Status.DONE] + ([Report.Status.FAILED] if include_failed else [])
    reports = Report.objects.filter(status__in=statuses)
    if project is not None:
        reports = reports.filter(project=project)
    if outdated_for is not None:
        reports = reports.exclude(status=Report.Status.DONE, kb_digest=outdated_for)
    count = 0
    for report_id in reports.values_list("id", flat=True).iterator():
        with transaction.atomic():
            count += report_rematch(report_id=report_id)
    return count


def reports_requeue_stale() -> int:
    """Send the task again for reports a broker may have lost: queued without a task for longer than
    the stale-claim time, or parsing under a stale claim. The claim makes duplicates harmless."""
    now = timezone.now()
    stale = now - timedelta(seconds=settings.DISPATCHLAB_STALE_CLAIM_SECONDS)
    stuck = Report.objects.filter(
        Q(status=Report.Status.QUEUED, enqueued_at__lt=stale)
        | Q(status=Report.Status.QUEUED, enqueued_at__isnull=True, created_at__lt=stale)
        | Q(status=Report.Status.PARSING, claimed_at__lt=stale)
    ).values_list("id", flat=True)
    from dispatchlab.reports.claims import claim_holder_is_dead

    # Held under a fresh claim by a process that died on this machine (the worker was killed whole, so
    # its message waits in the broker's unacknowledged set): no need to wait for the claim to go stale.
    fresh = Report.objects.filter(status=Report.Status.PARSING, claimed_at__gte=stale)
    dead = [
        rid for rid, token in fresh.values_list("id", "claim_token")[:1000] if claim_holder_is_dead(token)
    ]
    count = 0
    for report_id in [*stuck[:1000], *dead]:
        with transaction.atomic():
            report_enqueue_on_commit(report_id=report_id)
        count += 1
    if count:
        logger.info("re-enqueued %d stale reports", count)
    return count
