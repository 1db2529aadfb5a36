"""Redacting a secret out of a report, everywhere it was stored.

A person asks (page or API): `redaction_request` checks the shape, stores a Redaction row and enqueues
`reports.redact` on commit; the web process never runs the pattern. The task calls `redaction_run`,
which takes the report's redactions one at a time, oldest first (a claim under the report's row lock),
waits while the report is being parsed, and runs the pattern in a child process
(`dispatchlab.core.redact`) that is killed after DISPATCHLAB_REDACT_TIME_LIMIT seconds. The answer
replaces every stored copy in one transaction: the upload files (by one redacted file), the text copy
and line index (deleted, the re-parse writes them again), the document, the title, launch command
and other searched columns, the failure group's title, and the copies other apps registered
(dispatchlab.reports.copies: stored notification events; the confirm runs of the report, whose own
output reports get the same redaction). The re-parse that follows is quiet: no event announces its
group (reports.analysis._report_store asks `report_was_redacted`).
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.files import File
from django.core.files.storage import default_storage
from django.db import transaction
from django.utils import timezone

import dispatchlab
from dispatchlab.core.redact import RedactionError, compile_pattern
from dispatchlab.reports.copies import quoted_copies
from dispatchlab.reports.models import FailureGroup, Redaction, Report, ReportFile

# The Report columns a secret may reach (from the upload form, the CI job, or the parsed log) and that
# the list's search reads; each is redacted with the log. Their lengths bound what is written back.
REPORT_TEXT_COLUMNS = {
    "title": 300,
    "launch_command": None,
    "ci_job": 300,
    "ci_url": 1000,
    "ci_commit": 100,
    "error": None,
    "top_match_id": 200,
    "top_match_title": 300,
    "model_name": 300,
    "gpu_name": 200,
    "server_version": 100,
}


class RedactionRefused(Exception):
    """The redaction cannot be done (bad pattern or range, no stored log, ran too long). For people."""

    def __init__(self, message: str, *, conflict: bool = False) -> None:
        super().__init__(message)
        self.conflict = conflict  # the report's state, not the request, is in the way (HTTP 409)


@dataclass(frozen=True)
class RedactionSpec:
    """What to blank out: every match of `pattern`, or lines first_line..last_line (1-based)."""

    pattern: str = ""
    first_line: int | None = None
    last_line: int | None = None


def redaction_from(*, pattern: Any = None, first_line: Any = None, last_line: Any = None) -> RedactionSpec:
    """A RedactionSpec from what a person sent. Only the shape is checked here (the pattern compiles;
    compiling is bounded by its 500 characters): matching, even against empty text, can backtrack for
    ever and is left to the worker's child process."""
    if pattern not in (None, ""):
        if first_line is not None or last_line is not None:
            raise RedactionRefused("send a pattern or a line range, not both")
        if not isinstance(pattern, str):
            raise RedactionRefused("the pattern must be a regular expression (a string)")
        try:
            compile_pattern(pattern)
        except RedactionError as problem:
            raise RedactionRefused(str(problem)) from None
        return RedactionSpec(pattern=pattern)
    if first_line is None:
        raise RedactionRefused("send a pattern, or first_line (and last_line) of the lines to remove")
    last_line = first_line if last_line is None else last_line
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (first_line, last_line)):
        raise RedactionRefused("first_line and last_line must be whole numbers")
    if not 1 <= first_line <= last_line:
        raise RedactionRefused("the lines must satisfy 1 <= first_line <= last_line")
    return RedactionSpec(first_line=first_line, last_line=last_line)


def _enqueue(redaction_id: int) -> None:
    from dispatchlab.reports.tasks import redaction_run_task

    redaction_run_task.delay(redaction_id)


def redaction_request(
    *, report: Report, spec: RedactionSpec, user: AbstractBaseUser | AnonymousUser | None = None
) -> Redaction:
    """Store the request and enqueue it after commit; it runs after the report's earlier redactions."""
    if not report.files.exists():
        raise RedactionRefused("this report has no stored log to redact", conflict=True)
    with transaction.atomic():
        redaction = Redaction.objects.create(
            report=report,
            requested_by=user if user is not None and user.is_authenticated else None,
            pattern=spec.pattern,
            first_line=spec.first_line,
            last_line=spec.last_line,
        )
        transaction.on_commit(lambda: _enqueue(redaction.id), robust=True)
    return redaction


def report_was_redacted(report_id: int) -> bool:
    """Whether a redaction replaced this report's log: its next parse is a re-parse, told no one."""
    return Redaction.objects.filter(report_id=report_id, status=Redaction.Status.DONE).exists()


# ---------------------------------------------------------------- the run


class RunOutcome(enum.StrEnum):
    DONE = "done"
    REFUSED = "refused"
    WAITING = "waiting"  # an earlier redaction or a parse of the report goes first: ask again later
    SKIPPED = "skipped"  # already finished
    MISSING = "missing"


def _stale_before() -> Any:
    return timezone.now() - timedelta(seconds=settings.DISPATCHLAB_REDACT_TIME_LIMIT + 120)


def _claim(redaction_id: int, token: str) -> RunOutcome | None:
    """Take the redaction (None) or say why not. Under the report's row lock, so two workers cannot
    both find the report free; a running claim older than the time limit belongs to a dead worker."""
    with transaction.atomic():
        redaction = Redaction.objects.filter(id=redaction_id).first()
        if redaction is None:
            return RunOutcome.MISSING
        report = Report.objects.select_for_update().filter(id=redaction.report_id).first()
        redaction.refresh_from_db()
        if report is None:
            return RunOutcome.MISSING
        if redaction.status in Redaction.FINISHED:
            return RunOutcome.SKIPPED
        ahead = Redaction.objects.filter(report_id=report.id, id__lt=redaction.id).exclude(
            status__in=Redaction.FINISHED
        )
        others_running = Redaction.objects.filter(
            report_id=report.id, status=Redaction.Status.RUNNING, claimed_at__gte=_stale_before()
        ).exclude(id=redaction.id)
        ours_fresh = (
            redaction.status == Redaction.Status.RUNNING
            and redaction.claimed_at is not None
            and redaction.claimed_at >= _stale_before()
        )
        if ahead.exists() or others_running.exists() or ours_fresh or not report.is_finished:
            return RunOutcome.WAITING
        Redaction.objects.filter(id=redaction.id).update(
            status=Redaction.Status.RUNNING, claim_token=token, claimed_at=timezone.now()
        )
    return None


def _finish(
    redaction_id: int, token: str, *, status: str, reason: str = "", lines: int | None = None
) -> None:
    # The pattern usually spells the secret: it is not kept once it ran.
    Redaction.objects.filter(id=redaction_id, claim_token=token).update(
        status=status,
        reason=reason[:4000],
        redacted_lines=lines,
        pattern="",
        finished_at=timezone.now(),
        claim_token="",
    )


def _child_environment() -> dict[str, str]:
    """The worker's environment, with the folder this dispatchlab was imported from first on the path,
    so the child runs the same code."""
    root = str(Path(dispatchlab.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def run_limited(request: dict[str, Any], *, limit: float) -> dict[str, Any]:
    """`dispatchlab.core.redact` in a child process, killed (its whole session) after `limit` seconds:
    CPython's `re` holds its thread until it is done, so only a process boundary bounds it."""
    command = [sys.executable, "-m", "dispatchlab.core.redact"]
    with subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # a traceback could quote the log
        env=_child_environment(),
        start_new_session=True,
    ) as child:
        try:
            out, _ = child.communicate(json.dumps(request).encode(), timeout=limit)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            raise RedactionRefused(
                f"the redaction ran longer than {limit:g} s and was stopped; a pattern with nested "
                "repeats such as (a+)+ can backtrack for ever: use a simpler one (or a line range)"
            ) from None
    if child.returncode != 0:
        raise RedactionRefused(f"the redaction stopped unexpectedly (exit status {child.returncode})")
    answer: dict[str, Any] = json.loads(out)
    if not answer.get("ok"):
        raise RedactionRefused(str(answer.get("reason") or "the redaction was refused"))
    return answer


def _stored_values(report: Report) -> dict[str, Any]:
    """Every stored text of the report except its log, as JSON, to go through the same redaction: its
    columns, file names and group title, and the copies other apps keep (dispatchlab.reports.copies)."""
    return {
        "report": {column: getattr(report, column) for column in REPORT_TEXT_COLUMNS}
        | {"backend_values": report.backend_values},
        "files": [item.original_name for item in report.files.order_by("position")],
        "group": report.group.title if report.group_id is not None and report.group else "",
        "copies": {name: holder.read(report) for name, holder in quoted_copies().items()},
    }


def _changed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in after.items() if before.get(key) != value}


def _store_values(report: Report, before: dict[str, Any], after: dict[str, Any]) -> None:
    """Write back the redacted texts that changed (inside the caller's transaction)."""
    columns = _changed(before["report"], after["report"])
    for column, limit in REPORT_TEXT_COLUMNS.items():
        if column in columns and limit is not None:
            columns[column] = columns[column][:limit]
    if columns:
        Report.objects.filter(id=report.id).update(**columns)
    if after["group"] != before["group"] and report.group_id is not None:
        FailureGroup.objects.filter(id=report.group_id).update(title=after["group"][:300])
    for name, holder in quoted_copies().items():
        holder.write(before["copies"][name], after["copies"][name])


def redaction_run(*, redaction_id: int) -> RunOutcome:
    """Run one redaction (see the module's docstring). WAITING: call again later."""
    from dispatchlab.reports.analysis import _local_copies, _readable
    from dispatchlab.reports.retention import _text_copy_delete
    from dispatchlab.reports.submit import _delete_stored, report_enqueue_on_commit

    token = uuid.uuid4().hex
    refusal = _claim(redaction_id, token)
    if refusal is not None:
        return refusal
    redaction = Redaction.objects.select_related("report__project", "report__group").get(id=redaction_id)
    report = redaction.report
    old_files = list(report.files.order_by("position"))
    spec = RedactionSpec(redaction.pattern, redaction.first_line, redaction.last_line)
    before = _stored_values(report)
    workdir = Path(tempfile.mkdtemp(prefix=f"dispatchlab-redact-{report.id}-"))
    try:
        try:
            with _local_copies(report, workdir) as paths:
                answer = run_limited(
                    {
                        "pattern": spec.pattern,
                        "first_line": spec.first_line or 0,
                        "last_line": spec.last_line or 0,
                        "paths": [str(path) for path in paths],
                        "target": str(workdir / "redacted.log"),
                        "max_expanded_bytes": settings.DISPATCHLAB_MAX_EXPANDED_BYTES,
                        "max_report_expanded_bytes": settings.DISPATCHLAB_MAX_REPORT_EXPANDED_BYTES,
                        "max_zip_members": settings.DISPATCHLAB_MAX_ZIP_MEMBERS,
                        "values": before,
                    },
                    limit=settings.DISPATCHLAB_REDACT_TIME_LIMIT,
                )
        except (FileNotFoundError, RedactionRefused) as refused:
            reason = _readable(str(refused), workdir)
            if isinstance(refused, FileNotFoundError):
                reason = f"the stored log cannot be read: {reason}"
            _finish(redaction_id, token, status=Redaction.Status.REFUSED, reason=reason)
            return RunOutcome.REFUSED
        after: dict[str, Any] = answer["values"]
        changed = int(answer["changed"])
        if not changed and after == before:
            _finish(redaction_id, token, status=Redaction.Status.DONE, lines=0)
            return RunOutcome.DONE
        name = (after["files"][0] if after["files"] else "upload.log") or "upload.log"
        folder = f"uploads/{report.project.slug}/{report.checksum[:2]}/{report.checksum[:16]}"
        redacted = workdir / "redacted.log"
        size = redacted.stat().st_size
        with redacted.open("rb") as handle:
            key = default_storage.save(f"{folder}/redacted-{redaction.id}.log", File(handle))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    with transaction.atomic():
        locked = Report.objects.select_for_update().filter(id=report.id).first()
        still_ours = Redaction.objects.filter(id=redaction_id, claim_token=token).exists()
        same_files = locked is not None and [f.id for f in locked.files.order_by("position")] == [
            f.id for f in old_files
        ]
        if locked is None or not still_ours or not locked.is_finished or not same_files:
            # A parse (a re-match) started meanwhile, or the report is gone: the claim goes back.
            _delete_stored([key])
            Redaction.objects.filter(id=redaction_id, claim_token=token).update(
                status=Redaction.Status.QUEUED, claim_token="", claimed_at=None
            )
            return RunOutcome.MISSING if locked is None else RunOutcome.WAITING
        # The text copy holds the old lines; the re-parse writes its own once this commits.
        _text_copy_delete(locked)
        _store_values(report, before, after)
        Report.objects.filter(id=report.id).update(
            status=Report.Status.QUEUED,
            document=None,
            progress=0.0,
            attempts=0,
            claimed_at=None,
            claim_token="",
            total_bytes=size,
            text_path="",
            index_path="",
            line_count=None,
        )
        ReportFile.objects.filter(report_id=report.id).delete()
        ReportFile.objects.create(
            report_id=report.id, file=key, original_name=f"redacted-{name}"[-300:], size=size, position=0
        )
        followers = _follow_into_copies(report.id, spec)
        _finish(redaction_id, token, status=Redaction.Status.DONE, lines=changed)
        report_enqueue_on_commit(report_id=report.id)
        for follower in followers:
            transaction.on_commit(lambda follower=follower: _enqueue(follower), robust=True)
    _delete_stored([item.file.name for item in old_files])
    return RunOutcome.DONE


def _follow_into_copies(report_id: int, spec: RedactionSpec) -> list[int]:
    """The same redaction for the reports other apps made of this one (a confirm run's output: it ran
    its launch, so it may print the same secret). A line range says nothing about their lines."""
    if not spec.pattern:
        return []
    followers = [
        output_id for holder in quoted_copies().values() for output_id in holder.followers(report_id)
    ]
    return [
        Redaction.objects.create(report_id=output_id, pattern=spec.pattern).id
        for output_id in followers
        if ReportFile.objects.filter(report_id=output_id).exists()
    ]


def redaction_give_up(*, redaction_id: int) -> None:
    """The report stayed busy for every retry: the request is refused so the person can send it again."""
    Redaction.objects.filter(id=redaction_id).exclude(status__in=Redaction.FINISHED).update(
        status=Redaction.Status.REFUSED,
        reason="the report stayed busy (parsing, or other redactions) for too long; send the redaction again",
        pattern="",
        finished_at=timezone.now(),
        claim_token="",
    )
