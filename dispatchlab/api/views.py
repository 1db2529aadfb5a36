"""The JSON API of CONTRACT.md: reports (upload, read, list), the CI webhook, the OpenAPI schema.

Views only translate HTTP to service calls: authentication, parameters, status codes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import tempfile
import time
from dataclasses import dataclass
from typing import IO, Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.uploadedfile import UploadedFile
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParser, MultiPartParserError
from django.urls import NoReverseMatch, reverse
from django.utils.text import slugify

from dispatchlab.api.auth import Caller, authenticate, caller_and_report, error, json_body, pick_project
from dispatchlab.api.pagination import page_answer
from dispatchlab.api.schema import openapi_schema, operation, route
from dispatchlab.api.shapes import (
    Created,
    Error,
    HookHeaders,
    HookJson,
    HookMultipart,
    HookQuery,
    Invalid,
    RedactBody,
    Redacted,
    Redactions,
    RedactionShape,
    ReportListQuery,
    ReportPage,
    ReportSummary,
    ReportWaited,
    SimilarGroup,
    Upload,
)
from dispatchlab.api.shapes import Report as ReportShape
from dispatchlab.reports.intake import upload_check_readable
from dispatchlab.reports.models import Project, Redaction, Report
from dispatchlab.reports.redaction import RedactionRefused, redaction_from, redaction_request
from dispatchlab.reports.selectors import report_similar_cases, report_similar_groups, reports_filtered
from dispatchlab.reports.submit import (
    UPLOAD_ENVELOPE_BYTES,
    QuotaExceeded,
    UploadRejected,
    UploadTooLarge,
    report_submit,
    upload_refuse_by_length,
)
from dispatchlab.security.early import HOOK_PATH, hook_refusal
from dispatchlab.security.early import body_limit as body_limit_for

MAX_WAIT_SECONDS = 60
MAX_REDACT_BODY = 64 * 1024
WAIT_POLL_SECONDS = 0.2
ENVELOPE_BYTES = UPLOAD_ENVELOPE_BYTES


def _report_url(request: HttpRequest, report: Report) -> str:
    try:
        path = reverse("front:report", args=[report.id])
    except NoReverseMatch:
        path = f"/reports/{report.id}/"
    return request.build_absolute_uri(path)


def _created(request: HttpRequest, report: Report, *, created: bool) -> Created:
    return Created(
        id=report.id, url=_report_url(request, report), status=report.status, duplicate=not created
    )


def _detail(request: HttpRequest, report: Report) -> ReportShape:
    return ReportShape(
        id=report.id,
        url=_report_url(request, report),
        project=report.project.slug,
        title=report.title,
        status=report.status,  # type: ignore[typeddict-item]
        progress=report.progress,
        error=report.error or None,
        created_at=report.created_at.isoformat(),
        started_at=report.started_at.isoformat() if report.started_at else None,
        finished_at=report.finished_at.isoformat() if report.finished_at else None,
        parse_seconds=report.parse_seconds,
        failure_class=report.failure_class or None,
        document=_with_similar(request, report),
    )


def _with_similar(request: HttpRequest, report: Report) -> Any:
    """The stored document with `similar` as of now: its known cases, and the failure groups of the
    report's own project most like it (ranked on each read: groups come and go)."""
    document = report.document
    if not isinstance(document, dict):
        return document
    groups = [
        SimilarGroup(
            id=group.id,
            title=group.title,
            failure_class=group.failure_class or None,
            count=group.count,
            last_seen=group.last_seen.isoformat(),
            score=score,
            url=request.build_absolute_uri(reverse("front:group", args=[group.id])),
        )
        for group, score in report_similar_groups(report)
    ]
    return {**document, "similar": {"cases": report_similar_cases(document), "groups": groups}}


def report_summary(request: HttpRequest, report: Report) -> ReportSummary:
    return ReportSummary(
        id=report.id,
        url=_report_url(request, report),
        project=report.project.slug,
        title=report.title,
        status=report.status,  # type: ignore[typeddict-item]
        failure_class=report.failure_class or None,
        top_match_title=report.top_match_title or None,
        server=report.server or None,
        arch=report.arch or None,
        created_at=report.created_at.isoformat(),
        group=report.group_id,
    )


def _too_large(
    request: HttpRequest,
    *,
    limit: int | None = None,
    envelope: int = ENVELOPE_BYTES,
    what: str = "the upload",
    hint: str = "",
) -> JsonResponse | None:
    """413 (or 400 for a Content-Length that is not a number) by the declared length, before reading."""
    try:
        upload_refuse_by_length(
            content_length=request.META.get("CONTENT_LENGTH"), limit=limit, envelope=envelope, what=what
        )
    except UploadTooLarge as rejected:
        return error(" ".join(rejected.messages) + hint, 413)
    except UploadRejected as rejected:
        return error(" ".join(rejected.messages), 400)
    return None


def _rejected(rejected: UploadRejected) -> JsonResponse:
    """An upload the services refused: 413 too large, 507 over the project's quota, 400 otherwise."""
    status = (
        413 if isinstance(rejected, UploadTooLarge) else 507 if isinstance(rejected, QuotaExceeded) else 400
    )
    return error(" ".join(rejected.messages), status)


def _pick_project(caller: Caller, requested: str) -> Project | JsonResponse:
    return pick_project(
        caller,
        requested,
        several=error("you are in several projects: send the 'project' field (its slug)", 400),
        reader="you may read this project's reports but not upload",
        by_id=True,
    )


def _wait_for(report: Report, seconds: float) -> Report:
    deadline = time.monotonic() + seconds
    while not report.is_finished and time.monotonic() < deadline:
        time.sleep(WAIT_POLL_SECONDS)
        report.refresh_from_db()
    return report


# ---------------------------------------------------------------- /api/v1/reports


# the list never loads the (large) document column
LIST_DEFER = ("document", "backend_values", "launch_command")


@operation(
    "GET",
    "reports_list",
    summary="The newest reports the caller may see, a page at a time, with the dashboard's filters",
    description=(
        "The filters of the reports page: a value no report has yet lists nothing. `reports` repeats "
        "`results` for the clients of the list's first shape."
    ),
    query=ReportListQuery,
    answers={200: (ReportPage, "Reports, newest first.")},
    tags=("reports",),
)
def reports_list(request: HttpRequest, *, query: ReportListQuery) -> HttpResponse:
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    found = reports_filtered(
        caller.reports(), **{k: v for k, v in query.items() if k not in ("page", "limit")}
    )
    ordered = found.defer(*LIST_DEFER).order_by("-created_at", "-id")
    page = page_answer(request, query, ordered, lambda report: report_summary(request, report))
    return JsonResponse(ReportPage(**page, reports=page["results"]))


@operation(
    "POST",
    "reports_create",
    summary="Upload a log; parsing happens in a worker",
    description=(
        "The same bytes uploaded again to the project return the same report (`duplicate: true`); a "
        "failed one is parsed again."
    ),
    body={"multipart/form-data": Upload},
    answers={
        201: (Created, "Stored (or found, when duplicate is true)."),
        400: (
            Error,
            "No file, or a file that cannot be a log (empty, binary, a broken .gz): nothing stored.",
        ),
        403: Error,
        404: (Error, "No such project among the caller's."),
        411: (Error, "Sent with Transfer-Encoding: chunked to a WSGI server: send a Content-Length."),
        413: (Error, "The upload is larger than DISPATCHLAB_MAX_UPLOAD_BYTES."),
        507: (Error, "The project's stored uploads would pass its quota (usage and quota named)."),
    },
    tags=("reports",),
)
def reports_create(request: HttpRequest) -> HttpResponse:
    too_large = _too_large(request)
    if too_large is not None:
        return too_large
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    if caller.read_only:
        return error("this token is read-only", 403)
    project = _pick_project(caller, request.POST.get("project", "").strip())
    if isinstance(project, JsonResponse):
        return project
    if not caller.can_write(project):
        return error("you may read this project's reports but not upload", 403)
    files = request.FILES.getlist("file")
    if not files:
        return error("send the log in the multipart field 'file'", 400)
    try:
        upload_check_readable(files=files)
        report, created = report_submit(
            project=project,
            user=caller.user,
            files=files,
            title=request.POST.get("title", "").strip(),
            launch_command=request.POST.get("launch_command", "").strip(),
        )
    except UploadRejected as rejected:
        return _rejected(rejected)
    return JsonResponse(_created(request, report, created=created), status=201)


reports = route(reports_list, reports_create)


@operation(
    "GET",
    "reports_read",
    summary="A report's status and, once done, its document",
    answers={
        200: (ReportShape, "The report."),
        404: (Error, "No such report, or not in the caller's projects."),
    },
    tags=("reports",),
)
def report_detail(request: HttpRequest, report_id: int) -> HttpResponse:
    found = caller_and_report(request, report_id)
    if isinstance(found, JsonResponse):
        return found
    return JsonResponse(_detail(request, found[1]))


def _redaction_shape(redaction: Redaction) -> RedactionShape:
    return RedactionShape(
        id=redaction.id,
        status=redaction.status,  # type: ignore[typeddict-item]
        what=redaction.what,
        reason=redaction.reason,
        redacted_lines=redaction.redacted_lines,
        created_at=redaction.created_at.isoformat(),
        finished_at=redaction.finished_at.isoformat() if redaction.finished_at else None,
    )


@operation(
    "POST",
    "reports_redact",
    summary="Redact a report's log by a pattern or a line range; it is parsed again",
    description=(
        "The redaction is queued and run by a worker, after the report's earlier redactions and any parse "
        "in progress; the pattern runs in a child process stopped after DISPATCHLAB_REDACT_TIME_LIMIT "
        "seconds (the redaction is then refused, saying so). It replaces the stored upload by the redacted "
        "text and redacts every stored copy (text copy, document, title, launch command, failure group, "
        "notification events, confirm runs); the re-parse notifies no one. Only members of the report's "
        "project with write access (not viewers, not read-only tokens) may redact."
    ),
    body={"application/json": RedactBody},
    answers={
        202: (Redacted, "Queued: GET this path to follow it."),
        400: (Error, "Not a regular expression, or not a line range."),
        403: Error,
        404: (Error, "No such report, or not in the caller's projects."),
        409: (Error, "The report has no stored log."),
        413: Error,
    },
    tags=("reports",),
)
def report_redact_create(request: HttpRequest, report_id: int) -> HttpResponse:
    found = caller_and_report(request, report_id)
    if isinstance(found, JsonResponse):
        return found
    caller, report = found
    if not caller.can_write(report.project):
        return error("you may read this project's reports but not redact them", 403)
    body = json_body(request, limit=MAX_REDACT_BODY, what=" (pattern, or first_line and last_line)")
    if isinstance(body, JsonResponse):
        return body
    try:
        spec = redaction_from(
            pattern=body.get("pattern"), first_line=body.get("first_line"), last_line=body.get("last_line")
        )
        redaction = redaction_request(report=report, spec=spec, user=caller.user)
    except RedactionRefused as refused:
        return error(str(refused), 409 if refused.conflict else 400)
    report.refresh_from_db()
    redaction.refresh_from_db()
    answer = Redacted(
        id=report.id,
        url=_report_url(request, report),
        status=report.status,  # type: ignore[typeddict-item]
        redacted_lines=redaction.redacted_lines,
        redaction=_redaction_shape(redaction),
    )
    return JsonResponse(answer, status=202)


@operation(
    "GET",
    "reports_redactions",
    summary="A report's redactions: queued, running, done or refused (with the reason)",
    answers={
        200: (Redactions, "Oldest first."),
        404: (Error, "No such report, or not in the caller's projects."),
    },
    tags=("reports",),
)
def report_redactions(request: HttpRequest, report_id: int) -> HttpResponse:
    found = caller_and_report(request, report_id)
    if isinstance(found, JsonResponse):
        return found
    redactions = found[1].redactions.order_by("id")
    return JsonResponse(Redactions(redactions=[_redaction_shape(item) for item in redactions]))


report_redact = route(report_redactions, report_redact_create)


# ---------------------------------------------------------------- /api/v1/hooks/ci


@dataclass
class _SignedBody:
    """The raw request body (spooled to disk past a few MB) and its HMAC under each candidate secret."""

    file: IO[bytes]
    size: int
    digests: dict[int, str]

    def project_signed(self, signature: str) -> int | None:
        for pid, digest in self.digests.items():
            if hmac.compare_digest(digest, signature):
                return pid
        return None


def _read_signed(
    request: HttpRequest, spool: IO[bytes], secrets: dict[int, str], prefix: bytes, limit: int
) -> _SignedBody:
    size = 0
    macs = {pid: hmac.new(secret.encode(), prefix, hashlib.sha256) for pid, secret in secrets.items()}
    while True:
        chunk = request.read(1024 * 1024)
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            raise UploadRejected(f"the delivery is larger than {limit:,} bytes")
        spool.write(chunk)
        for mac in macs.values():
            mac.update(chunk)
    spool.seek(0)
    return _SignedBody(spool, size, {pid: mac.hexdigest() for pid, mac in macs.items()})


def _hook_fields(
    request: HttpRequest, body: _SignedBody
) -> tuple[dict[str, str], list[UploadedFile | ContentFile]]:
    content_type = request.META.get("CONTENT_TYPE", "")
    if content_type.startswith("multipart/form-data"):
        meta = {**request.META, "CONTENT_LENGTH": str(body.size)}
        try:
            post, files = MultiPartParser(meta, body.file, request.upload_handlers, request.encoding).parse()
        except MultiPartParserError as failure:
            raise UploadRejected(f"unreadable multipart body: {failure}") from None
        fields = {key: str(post.get(key, "")).strip() for key in post}
        return fields, list(files.getlist("file"))
    try:
        payload = json.load(body.file)
    except (json.JSONDecodeError, UnicodeDecodeError) as failure:
        raise UploadRejected(f"the body is neither JSON nor multipart: {failure}") from None
    except RecursionError:
        raise UploadRejected("the JSON body is nested too deeply to read") from None
    if not isinstance(payload, dict):
        raise UploadRejected("the JSON body must be an object")
    log = payload.get("log")
    if not isinstance(log, str) or not log:
        raise UploadRejected("the JSON body needs the log text in 'log'")
    fields = {key: str(value).strip() for key, value in payload.items() if key != "log" and value is not None}
    name = f"{slugify(fields.get('job', ''))[:80] or 'ci'}.log"
    return fields, [ContentFile(log.encode("utf-8", "replace"), name=name)]


def _hook_candidates(request: HttpRequest, named: str) -> dict[int, str]:
    """The projects whose secret may have signed the delivery: the one the sender names (?project=<slug>
    or X-Dispatchlab-Project), or unnamed, every project with a secret (at most
    DISPATCHLAB_HOOK_UNNAMED_MAX_PROJECTS: hook_refusal answers 400 past that). Each candidate costs an
    HMAC over the body, all computed in the one pass that reads it."""
    wanted = named or request.headers.get("X-Dispatchlab-Project", "")
    projects = Project.objects.exclude(webhook_secret="").order_by("id")
    if wanted:
        projects = projects.filter(slug=wanted)
    return dict(projects.values_list("id", "webhook_secret"))


@operation(
    "POST",
    "hooks_ci",
    summary="A CI job reports a failed run",
    description=(
        "Signed with X-Dispatchlab-Signature: sha256=<hex HMAC-SHA256 under the project's webhook secret> "
        "over the raw body, or over '<timestamp>.<raw body>' when X-Dispatchlab-Timestamp (unix seconds) is "
        "sent; then deliveries older than 5 minutes are refused. X-Dispatchlab-Delivery makes a repeat "
        "return the first delivery's report. The project is named by ?project=<slug> or "
        "X-Dispatchlab-Project; unnamed, it is the project whose secret signed the body, among at most "
        "DISPATCHLAB_HOOK_UNNAMED_MAX_PROJECTS projects with a secret (400 past that). A JSON body is limited to "
        "DISPATCHLAB_MAX_JSON_BYTES (413 above it); send larger logs as multipart."
    ),
    query=HookQuery,
    headers=HookHeaders,
    body={"application/json": HookJson, "multipart/form-data": HookMultipart},
    answers={
        201: (
            Created | ReportWaited,
            "Stored; with ?wait, the report as GET answers it once parsed (or when the wait ends).",
        ),
        400: (Invalid, "Unreadable, or no project named while too many have a webhook secret."),
        401: (
            Error,
            "Missing, malformed or bad signature, a delivery too old, or a project without a secret.",
        ),
        404: (Error, "The project named by ?project or X-Dispatchlab-Project does not exist."),
        408: (Error, "The body came too slowly (DISPATCHLAB_BODY_MIN_BYTES_PER_SECOND)."),
        429: (Error, "This client has too many bytes on their way (DISPATCHLAB_MAX_SPOOL_BYTES_PER_CLIENT)."),
        503: (Error, "Too many requests in flight (DISPATCHLAB_WEB_MAX_IN_FLIGHT); see Retry-After."),
        411: (Error, "Sent with Transfer-Encoding: chunked to a WSGI server: send a Content-Length."),
        413: (
            Error,
            "The body is larger than the limit (multipart: DISPATCHLAB_MAX_HOOK_BYTES, JSON: "
            "DISPATCHLAB_MAX_JSON_BYTES), by its Content-Length before it is read.",
        ),
        507: (Error, "The project's stored uploads would pass its quota."),
    },
    public=True,
    tags=("reports",),
)
def ci_hook(request: HttpRequest, *, query: HookQuery) -> HttpResponse:
    """A CI job reports a failure: verify the signature, store the log, optionally wait for the parse."""
    # The checks the headers allow come first (EarlyRefusalMiddleware makes them too, before Django
    # reads anything); the body is then read once, capped, with an HMAC per candidate project.
    headers = {name.lower(): value for name, value in request.headers.items()}
    refused = hook_refusal(headers, {"project": query.get("project", "")})
    if refused is not None:
        return error(refused.message, refused.status)
    if request.META.get("CONTENT_TYPE", "").startswith("multipart/form-data"):
        body_limit = body_limit_for(HOOK_PATH)
    else:
        body_limit = settings.DISPATCHLAB_MAX_JSON_BYTES
    signature = headers["x-dispatchlab-signature"].strip().removeprefix("sha256=").lower()
    timestamp = headers.get("x-dispatchlab-timestamp")
    prefix = f"{int(timestamp.strip())}.".encode() if timestamp is not None else b""
    wait_seconds = min(MAX_WAIT_SECONDS, max(0, query.get("wait", 0)))

    candidates = _hook_candidates(request, query.get("project", ""))
    with tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024) as spool:
        try:
            body = _read_signed(
                request,
                spool,  # type: ignore[arg-type]
                candidates,
                prefix,
                body_limit,
            )
        except UploadRejected as rejected:
            return error(" ".join(rejected.messages), 413)
        project_id = body.project_signed(signature)
        if project_id is None:
            return error("bad signature", 401)
        project = Project.objects.get(id=project_id)
        delivery = request.headers.get("X-Dispatchlab-Delivery", "").strip()[:200] or None
        try:
            fields, files = _hook_fields(request, body)
            upload_check_readable(files=files)
            report, created = report_submit(
                project=project,
                user=None,
                files=files,
                title=fields.get("title", ""),
                launch_command=fields.get("launch_command", ""),
                ci_job=fields.get("job", ""),
                ci_url=fields.get("url", ""),
                ci_commit=fields.get("commit", ""),
                delivery_id=delivery,
            )
        except UploadRejected as rejected:
            return _rejected(rejected)
    if not wait_seconds:
        return JsonResponse(_created(request, report, created=created), status=201)
    report = _wait_for(report, wait_seconds)
    return JsonResponse(ReportWaited(**_detail(request, report), duplicate=not created), status=201)


# ---------------------------------------------------------------- /api/schema/


@operation(
    "GET",
    "schema",
    summary="This document",
    answers={200: (dict[str, Any], "The OpenAPI 3.1 document of the API, generated from its code.")},
    public=True,
    tags=("meta",),
)
def schema(request: HttpRequest) -> HttpResponse:
    return JsonResponse(openapi_schema(server_url=request.build_absolute_uri("/")))
