"""Parsing a stored report: `report_analyze` (the task's service) claims the row with a conditional
UPDATE, runs the core on the stored files, and stores the document (or a failure reason a person
understands). The claim carries a token and a heartbeat (`claimed_at`, refreshed with the progress), so
a dead worker's report is picked up again once its claim is stale, and never parsed by two workers at
once. Storing places the report in its failure group and announces a new or recurring group
(dispatchlab.events), except for a re-match or the re-parse of a redaction.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.files.storage import default_storage
from django.db import DatabaseError, connections, transaction
from django.db.models import F, Q
from django.utils import timezone

from dispatchlab.reports.groups import _group_title, failuregroup_refresh, report_columns
from dispatchlab.reports.models import FailureGroup, Report

logger = logging.getLogger(__name__)

PROGRESS_EVERY_SECONDS = 0.5
# Share of the progress bar spent parsing; the rest is the line index.
PARSE_SHARE = 90.0


class Outcome(enum.StrEnum):
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"  # already done or failed: nothing to do
    BUSY = "busy"  # another worker holds a fresh claim
    LOST = "lost"  # our claim was taken over while we worked (we were too slow to heartbeat)
    MISSING = "missing"  # the report was deleted


class ClaimLost(Exception):
    """Raised from the progress callback when another worker took over the report."""


# ---------------------------------------------------------------- analysis


def report_claim(*, report_id: int, token: str) -> bool:
    """Take the report for parsing. True for exactly one caller: the row must be queued, or parsing
    under a claim whose heartbeat is older than DISPATCHLAB_STALE_CLAIM_SECONDS, or whose process is
    known to be dead (killed on this machine: its task came back at once, and need not wait)."""
    from dispatchlab.reports.claims import claim_holder_is_dead

    now = timezone.now()
    stale = now - timedelta(seconds=settings.DISPATCHLAB_STALE_CLAIM_SECONDS)
    claim = {
        "status": Report.Status.PARSING,
        "claimed_at": now,
        "claim_token": token,
        "started_at": now,
        "progress": 0.0,
        "error": "",
        "attempts": F("attempts") + 1,
    }
    claimable = Q(status=Report.Status.QUEUED) | Q(status=Report.Status.PARSING, claimed_at__lt=stale)
    if Report.objects.filter(claimable, id=report_id).update(**claim) == 1:
        return True
    held = Report.objects.filter(id=report_id, status=Report.Status.PARSING).values_list(
        "claim_token", flat=True
    )
    holder = held.first()
    if holder is None or not claim_holder_is_dead(holder):
        return False
    # Conditional on the dead holder's token: of two workers seeing it dead, one gets the report.
    taken = Report.objects.filter(id=report_id, status=Report.Status.PARSING, claim_token=holder).update(
        **claim
    )
    return taken == 1


def report_busy_seconds(*, report_id: int) -> float:
    """How long until the report's claim goes stale (and another worker may take it), plus a second."""
    claimed_at = Report.objects.filter(id=report_id).values_list("claimed_at", flat=True).first()
    window = settings.DISPATCHLAB_STALE_CLAIM_SECONDS
    if claimed_at is None:
        return float(window + 1)
    left = (claimed_at + timedelta(seconds=window) - timezone.now()).total_seconds()
    return min(float(window), max(0.0, left)) + 1.0


def _heartbeat(*, report_id: int, token: str, progress: float) -> None:
    updated = Report.objects.filter(id=report_id, claim_token=token, status=Report.Status.PARSING).update(
        progress=round(progress, 1), claimed_at=timezone.now()
    )
    if updated != 1:
        raise ClaimLost(f"report {report_id} was claimed by another worker")


class _Heartbeat(threading.Thread):
    """Keeps the claim fresh while the core works, whether or not it reports progress (compiling
    the knowledge base, matching). Dies with the process, so a killed worker's claim goes stale."""

    def __init__(self, *, report_id: int, token: str) -> None:
        super().__init__(name=f"heartbeat-report-{report_id}", daemon=True)
        self.report_id = report_id
        self.token = token
        self.every = max(0.5, settings.DISPATCHLAB_STALE_CLAIM_SECONDS / 3)
        self.stopped = threading.Event()
        self.lost = False

    def run(self) -> None:
        try:
            while not self.stopped.wait(self.every):
                try:
                    updated = Report.objects.filter(
                        id=self.report_id, claim_token=self.token, status=Report.Status.PARSING
                    ).update(claimed_at=timezone.now())
                except DatabaseError as failure:
                    logger.warning("report %s: heartbeat failed: %s", self.report_id, failure)
                    continue
                if updated != 1:
                    self.lost = True
                    return
        finally:
            connections.close_all()  # this thread's connections only

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=5)


@contextlib.contextmanager
def _local_copies(report: Report, workdir: Path) -> Iterator[list[Path]]:
    """Paths the core can open, named as uploaded: links to local storage, downloads otherwise."""
    paths: list[Path] = []
    for item in report.files.order_by("position"):
        folder = workdir / str(item.position)
        folder.mkdir()
        target = folder / item.original_name
        source: Path | None = None
        with contextlib.suppress(NotImplementedError):
            local_path = Path(default_storage.path(item.file.name))
            source = local_path if local_path.is_file() else None
        if source is not None:
            target.symlink_to(source)
        elif default_storage.exists(item.file.name):
            with default_storage.open(item.file.name, "rb") as remote, target.open("wb") as local:
                shutil.copyfileobj(remote, local, 4 * 1024 * 1024)
        else:
            raise FileNotFoundError(f"stored upload {item.file.name} is missing")
        paths.append(target)
    yield paths


def _readable(text: str, workdir: Path) -> str:
    """Strip our temporary folders from the core's messages: people uploaded `crash.log`."""
    prefix = str(workdir) + os.sep
    if prefix not in text:
        return text
    out = text
    for entry in sorted(workdir.iterdir(), key=lambda p: -len(str(p))):
        out = out.replace(str(entry) + os.sep, "")
    return out.replace(prefix, "")


def _reports_folder() -> Path:
    return Path(settings.MEDIA_ROOT) / "reports"


def _line_index_paths(report_id: int) -> tuple[Path, Path]:
    folder = _reports_folder() / str(report_id)
    return folder / "text.log", folder / "lines.idx"


def _is_leftover(path: Path) -> bool:
    """A parse's temporary text copy or index, or its scan workers' parts folder."""
    return path.name.endswith(".tmp") or path.name.startswith(".parts-")


def _leftovers_remove(folder: Path) -> int:
    """Remove what a parse that stopped (killed, refused, failed) left in a report's folder; bytes freed."""
    freed = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in folder.iterdir():
            if not _is_leftover(entry):
                continue
            if entry.is_dir() and not entry.is_symlink():
                freed += sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    freed += entry.stat().st_size
                    entry.unlink()
    return freed


@contextlib.contextmanager
def _upload_limits() -> Iterator[None]:
    """The expansion caps of DISPATCHLAB_MAX_* for the logs read inside: one report's budget."""
    from dispatchlab.core.reading import expansion_limit

    with expansion_limit(
        settings.DISPATCHLAB_MAX_EXPANDED_BYTES,
        report_bytes=settings.DISPATCHLAB_MAX_REPORT_EXPANDED_BYTES,
        zip_members=settings.DISPATCHLAB_MAX_ZIP_MEMBERS,
    ):
        yield


def _fail(*, report_id: int, token: str, reason: str) -> Outcome:
    updated = Report.objects.filter(id=report_id, claim_token=token, status=Report.Status.PARSING).update(
        status=Report.Status.FAILED, error=reason[:4000], finished_at=timezone.now(), progress=0.0
    )
    logger.info("report %s: failed: %s", report_id, reason)
    return Outcome.FAILED if updated else Outcome.LOST


def report_analyze(*, report_id: int) -> Outcome:
    """Claim the report, parse and match its files, store the document or the reason it failed."""
    from celery.exceptions import SoftTimeLimitExceeded

    from dispatchlab.core import LogReadError, analyze_paths
    from dispatchlab.reports.claims import new_claim_token

    token = new_claim_token()
    if not report_claim(report_id=report_id, token=token):
        status = Report.objects.filter(id=report_id).values_list("status", flat=True).first()
        if status is None:
            return Outcome.MISSING
        return Outcome.BUSY if status in (Report.Status.PARSING, Report.Status.QUEUED) else Outcome.SKIPPED

    report = Report.objects.select_related("project").get(id=report_id)
    if report.attempts > settings.DISPATCHLAB_MAX_ATTEMPTS:
        return _fail(
            report_id=report_id,
            token=token,
            reason=(
                f"gave up after {report.attempts - 1} attempts: the worker parsing this log stopped each time "
                "(killed, out of memory, or over the time limit)"
            ),
        )
    total_bytes = max(1, report.total_bytes)
    last_beat = 0.0

    def progress(done: int, total: int | None) -> None:
        nonlocal last_beat
        if heartbeat.lost:
            raise ClaimLost(f"report {report_id} was claimed by another worker")
        now = time.monotonic()
        if now - last_beat < PROGRESS_EVERY_SECONDS:
            return
        last_beat = now
        share = min(1.0, done / (total or total_bytes))
        _heartbeat(report_id=report_id, token=token, progress=PARSE_SHARE * share)

    workdir = Path(tempfile.mkdtemp(prefix=f"dispatchlab-report-{report_id}-"))
    text_path, index_path = _line_index_paths(report_id)
    # One read: the parse writes the log viewer's copy and index aside, swapped in after, so a page
    # reading the old copy during a re-match never sees half a file.
    tmp_text, tmp_index = text_path.with_suffix(".log.tmp"), index_path.with_suffix(".idx.tmp")
    # A worker killed mid-parse left its copy and its scan workers' parts here: ours now (we hold the claim).
    freed = _leftovers_remove(text_path.parent)
    if freed:
        logger.info("report %s: removed %d bytes a stopped parse left behind", report_id, freed)
    heartbeat = _Heartbeat(report_id=report_id, token=token)
    heartbeat.start()
    try:
        try:
            with _local_copies(report, workdir) as paths, _upload_limits():
                started = time.monotonic()
                text_path.parent.mkdir(parents=True, exist_ok=True)
                document = analyze_paths(paths, progress=progress, line_index=(tmp_text, tmp_index))
                parse_seconds = time.monotonic() - started
                _heartbeat(report_id=report_id, token=token, progress=PARSE_SHARE)
                line_count = int(document.get("line_count") or 0)
                os.replace(tmp_text, text_path)
                os.replace(tmp_index, index_path)
                _clean_source_names(document, workdir)
        finally:
            # Before any outcome is recorded: a report that reads `failed` has nothing left on disk (a
            # refused bomb wrote up to its cap); on success the copies were swapped in already.
            heartbeat.stop()
            for leftover in (tmp_text, tmp_index):
                with contextlib.suppress(OSError):
                    leftover.unlink(missing_ok=True)
    except ClaimLost:
        logger.warning("report %s: claim lost while parsing; leaving it to the new owner", report_id)
        return Outcome.LOST
    except LogReadError as error:
        return _fail(report_id=report_id, token=token, reason=_readable(str(error), workdir))
    except SoftTimeLimitExceeded:
        return _fail(
            report_id=report_id,
            token=token,
            reason=f"parsing took longer than {settings.DISPATCHLAB_TASK_SOFT_TIME_LIMIT} s and was stopped",
        )
    except DatabaseError:
        # Infrastructure, not the log: give the claim back and let the task retry.
        with contextlib.suppress(DatabaseError):
            Report.objects.filter(id=report_id, claim_token=token).update(status=Report.Status.QUEUED)
        raise
    except Exception as error:
        logger.exception("report %s: internal error while parsing", report_id)
        message = _readable(str(error), workdir)
        return _fail(
            report_id=report_id,
            token=token,
            reason=f"internal error while parsing: {type(error).__name__}: {message}",
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)  # links to the stored files, named in the errors above

    outcome = _report_store(
        report_id=report_id,
        token=token,
        document=document,
        text_path=text_path,
        index_path=index_path,
        line_count=line_count,
        parse_seconds=parse_seconds,
    )
    logger.info(
        "report %s: parsed in %.2fs (attempt %d): %s, %s",
        report_id,
        parse_seconds,
        report.attempts,
        document.get("failure_class"),
        outcome.value,
    )
    return outcome


def _clean_source_names(document: dict[str, Any], workdir: Path) -> None:
    for source in document.get("sources") or []:
        if isinstance(source, dict) and isinstance(source.get("name"), str):
            source["name"] = _readable(source["name"], workdir)


def _report_store(
    *,
    report_id: int,
    token: str,
    document: dict[str, Any],
    text_path: Path,
    index_path: Path,
    line_count: int,
    parse_seconds: float,
) -> Outcome:
    columns = report_columns(document)
    now = timezone.now()
    with transaction.atomic():
        report = Report.objects.select_for_update().filter(id=report_id).first()
        if report is None:
            return Outcome.MISSING
        if report.claim_token != token or report.status != Report.Status.PARSING:
            return Outcome.LOST
        old_group_id = report.group_id
        # A re-match (the knowledge base changed) moves old reports between groups, and a redacted log is
        # parsed again: no news for webhooks.
        from dispatchlab.reports.redaction import report_was_redacted

        reanalysis = report.document is not None or report_was_redacted(report_id)
        group, group_created = None, False
        if columns["failure_class"] != "none" and columns["fingerprint"]:
            group, group_created = FailureGroup.objects.get_or_create(
                project_id=report.project_id,
                fingerprint=columns["fingerprint"],
                defaults={
                    "title": _group_title(document, columns),
                    "failure_class": columns["failure_class"],
                    "first_seen": report.created_at,
                    "last_seen": report.created_at,
                },
            )
        for field, value in columns.items():
            setattr(report, field, value)
        report.document = document
        report.group = group
        report.status = Report.Status.DONE
        report.progress = 100.0
        report.error = ""
        report.finished_at = now
        report.parse_seconds = round(parse_seconds, 3)
        report.text_path = str(text_path)
        report.index_path = str(index_path)
        report.line_count = line_count
        report.save()
        # In id order, so two workers moving reports between the same groups lock them alike.
        touched = {old_group_id, group.id if group is not None else None}
        for group_id in sorted(gid for gid in touched if gid is not None):
            failuregroup_refresh(group_id=group_id)
        if group is not None:
            # The newest diagnosis names the group.
            FailureGroup.objects.filter(id=group.id).update(
                title=_group_title(document, columns), failure_class=columns["failure_class"]
            )
            if not reanalysis:
                from dispatchlab.events import FailureGroupOpened, FailureGroupRecurred, announce

                # A new group, or one seen again (notify tells webhooks when it had been closed): on commit.
                landed = FailureGroupOpened if group_created else FailureGroupRecurred
                announce(landed(group_id=group.id, report_id=report.id))
    return Outcome.DONE
