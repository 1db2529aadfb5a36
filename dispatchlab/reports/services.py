"""Everything that changes reports, projects and tokens. Views, tasks and commands call these.

The parsing pipeline: `report_submit` stores the upload and enqueues `reports.analyze` on commit; the
task calls `report_analyze`, which claims the row with a conditional UPDATE, runs the core on the
stored files, and stores the document (or a failure reason a person understands). The claim carries
a token and a heartbeat (`claimed_at`, refreshed with the progress), so a dead worker's report is
picked up again once its claim is stale, and never parsed by two workers at once.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import logging
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path, PurePath
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import SuspiciousFileOperation, ValidationError
from django.core.files import File
from django.core.files.storage import default_storage
from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import Count, F, Max, Min, Q, Sum
from django.utils import timezone
from django.utils.text import get_valid_filename, slugify

from dispatchlab.reports.models import ApiToken, FailureGroup, Membership, Project, Report, ReportFile

logger = logging.getLogger(__name__)

MAX_FILES_PER_REPORT = 100
# Room for the multipart envelope (boundaries, other fields) around files of the maximum upload size.
UPLOAD_ENVELOPE_BYTES = 1024 * 1024
PROGRESS_EVERY_SECONDS = 0.5
# Share of the progress bar spent parsing; the rest is the line index.
PARSE_SHARE = 90.0


class UploadRejected(ValidationError):
    """The upload cannot become a report (no file, too large, too many files). Message for people."""


class UploadTooLarge(UploadRejected):
    """The upload is over DISPATCHLAB_MAX_UPLOAD_BYTES."""


class QuotaExceeded(UploadRejected):
    """The upload would take the project's stored uploads past its quota (HTTP 507)."""


class Outcome(enum.StrEnum):
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"  # already done or failed: nothing to do
    BUSY = "busy"  # another worker holds a fresh claim
    LOST = "lost"  # our claim was taken over while we worked (we were too slow to heartbeat)
    MISSING = "missing"  # the report was deleted


class ClaimLost(Exception):
    """Raised from the progress callback when another worker took over the report."""


# ---------------------------------------------------------------- projects, members, tokens


def project_create(*, name: str, slug: str = "") -> Project:
    slug = slug or slugify(name) or "project"
    base, n = slug, 2
    while Project.objects.filter(slug=slug).exists():
        slug = f"{base}-{n}"
        n += 1
    return Project.objects.create(name=name, slug=slug)


def membership_ensure(
    *, user: AbstractBaseUser, project: Project, role: str = Membership.Role.MEMBER
) -> Membership:
    membership, _ = Membership.objects.get_or_create(user=user, project=project, defaults={"role": role})
    return membership


def project_rotate_webhook_secret(*, project: Project) -> str:
    project.webhook_secret = secrets.token_urlsafe(32)
    project.save(update_fields=["webhook_secret"])
    return project.webhook_secret


TOKEN_PREFIX = "dl_"


def _token_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def apitoken_create(
    *, user: AbstractBaseUser, project: Project, read_only: bool = False, days: int | None = None
) -> tuple[ApiToken, str]:
    """A new token; the key itself is returned once and only its hash is stored. It expires after
    `days` (default DISPATCHLAB_API_TOKEN_DAYS; 0: never)."""
    days = settings.DISPATCHLAB_API_TOKEN_DAYS if days is None else days
    key = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user,
        project=project,
        key_hash=_token_hash(key),
        prefix=key[: len(TOKEN_PREFIX) + 8],
        read_only=read_only,
        expires_at=timezone.now() + timedelta(days=days) if days else None,
    )
    return token, key


class TokenRefused(Exception):
    """The key names no usable token. str(error) is the answer for the caller."""


def apitoken_verify(*, key: str) -> ApiToken:
    """The token for this key, if it exists, is neither revoked nor expired, and its user is active and
    still in the project; TokenRefused (saying which) otherwise."""
    if not key.startswith(TOKEN_PREFIX):
        raise TokenRefused("invalid or revoked token")
    token = ApiToken.objects.select_related("user", "project").filter(key_hash=_token_hash(key)).first()
    if token is None or token.revoked_at is not None or not token.user.is_active:
        raise TokenRefused("invalid or revoked token")
    now = timezone.now()
    if token.is_expired(now):
        assert token.expires_at is not None
        raise TokenRefused(
            f"token expired on {token.expires_at:%Y-%m-%d %H:%M} UTC; ask for a new one (manage.py apitoken)"
        )
    if not Membership.objects.filter(user=token.user, project=token.project).exists():
        raise TokenRefused("invalid or revoked token")
    # One write a minute is enough to tell used tokens from forgotten ones.
    if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
        ApiToken.objects.filter(id=token.id).update(last_used_at=now)
        token.last_used_at = now
    return token


def apitoken_authenticate(*, key: str) -> ApiToken | None:
    """The token for this key, or None when apitoken_verify refuses it."""
    try:
        return apitoken_verify(key=key)
    except TokenRefused:
        return None


def apitoken_revoke(*, prefix: str) -> int:
    """Revoke the live tokens with this shown prefix (`dl_` and 8 more characters) or this full key;
    returns how many. A shorter prefix is refused (ValueError): it could name many people's tokens."""
    shown = len(TOKEN_PREFIX) + 8
    if not prefix.startswith(TOKEN_PREFIX) or len(prefix) < shown:
        raise ValueError(f"give the token's prefix as listed ({TOKEN_PREFIX} and 8 characters) or its key")
    if len(prefix) > shown:
        tokens = ApiToken.objects.filter(key_hash=_token_hash(prefix))
    else:
        tokens = ApiToken.objects.filter(prefix=prefix)
    return tokens.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())


@dataclass(frozen=True)
class Bootstrap:
    username: str
    password: str | None  # None when the user already existed
    project: Project


def user_bootstrap(
    *, username: str = "admin", password: str = "", project_name: str = "default"
) -> Bootstrap | None:
    """Create the first user (a superuser), a project and the membership, when there is no user yet."""
    user_model = get_user_model()
    if user_model.objects.exists():
        return None
    password = password or secrets.token_urlsafe(12)
    with transaction.atomic():
        user = user_model.objects.create_superuser(username=username, email="", password=password)
        project = Project.objects.filter(name=project_name).first() or project_create(name=project_name)
        membership_ensure(user=user, project=project)
    return Bootstrap(username=username, password=password, project=project)


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


def _text(value: Any, limit: int) -> str:
    return "" if value is None else str(value)[:limit]


def report_columns(document: dict[str, Any]) -> dict[str, Any]:
    """The denormalised Report columns of a match document."""
    matches = document.get("matches") or []
    top = matches[0] if matches and isinstance(matches[0], dict) else {}
    gpu = document.get("gpu") or {}
    backends: dict[str, Any] = {}
    for key, value in (document.get("backends") or {}).items():
        backends[key] = value
    for key, value in (document.get("draft_backends") or {}).items():
        backends[f"draft_{key}"] = value
    return {
        "failure_class": _text(document.get("failure_class") or "none", 40),
        "top_match_id": _text(top.get("id"), 200),
        "top_match_title": _text(top.get("title"), 300),
        "fingerprint": _text(document.get("fingerprint"), 64),
        "server": _text(document.get("server"), 20),
        "server_version": _text(document.get("server_version"), 100),
        "gpu_name": _text(gpu.get("name"), 200),
        "arch": _text(gpu.get("arch"), 20),
        "model_name": _text(document.get("model"), 300),
        "outcome": _text(document.get("outcome"), 20),
        "kb_digest": _text(document.get("kb_digest"), 64),
        "backend_values": backends,
    }


def _group_title(document: dict[str, Any], columns: dict[str, Any]) -> str:
    if columns["top_match_title"]:
        return str(columns["top_match_title"])
    crash = document.get("crash") or {}
    parts = [str(crash.get("exception") or ""), str(crash.get("message") or "")]
    title = ": ".join(part for part in parts if part)
    return (title or str(columns["failure_class"]))[:300]


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


def failuregroup_refresh(*, group_id: int) -> None:
    """Recount a group from its reports; a group left without reports is deleted.

    The group row is locked before counting: two workers moving reports into the same group would
    otherwise each count without the other's uncommitted report, and the later write would be short.
    Waiting for the lock lets the count see the other transaction once it has committed.
    """
    with transaction.atomic():
        if FailureGroup.objects.select_for_update().filter(id=group_id).first() is None:
            return
        stats = Report.objects.filter(group_id=group_id).aggregate(
            count=Count("id"), first_seen=Min("created_at"), last_seen=Max("created_at")
        )
        if not stats["count"]:
            FailureGroup.objects.filter(id=group_id).delete()
            return
        FailureGroup.objects.filter(id=group_id).update(
            count=stats["count"], first_seen=stats["first_seen"], last_seen=stats["last_seen"]
        )


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
