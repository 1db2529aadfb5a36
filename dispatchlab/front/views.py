"""The pages. Thin function views: scope to the user's projects, call a presenter, render.

Every query starts from `_reports(user)` / `_groups(user)`, so a report of a project the user is not
a member of is a 404 on every page; the report page and its log say whose project it is ("you are not
a member of project NAME"), and nothing else of it.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import BooleanField, Count, ExpressionWrapper, Max, Min, Q, QuerySet, TextField, Value
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Coalesce, NullIf, TruncDate
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods

from dispatchlab.front import decision_views, figures, gpu_views, presenters, report_page
from dispatchlab.front.compare import compare_documents
from dispatchlab.front.filters import GroupFilterForm, ReportFilterForm, filter_groups, filter_reports
from dispatchlab.front.logview import log_window, render_rows
from dispatchlab.reports import selectors
from dispatchlab.reports.last_good import last_good_context
from dispatchlab.reports.models import FailureGroup, Project, Report

PAGE_SIZE = 50
SPARK_DAYS = 30
# list pages never load the (large) document column
LIST_DEFER = ("document", "backend_values", "launch_command")
# Whether a report has a stored document, without loading it. A report keeps its document while it
# is analysed again, so pages branch on this, not on the status.
HAS_DOCUMENT = ExpressionWrapper(Q(document__isnull=False), output_field=BooleanField())
# The log's own time: its first event's or first phase's (an ISO string; vLLM's year-less times read
# 1900-...). The upload time says when someone sent the log, which may be days after the run.
# SQLite reads a JSON null as the text 'null'.
LOG_TIME = Coalesce(
    NullIf(
        KeyTextTransform("time", KeyTransform("0", KeyTransform("timeline", "document"))),
        Value("null", output_field=TextField()),
    ),
    NullIf(
        KeyTextTransform("start", KeyTransform("0", KeyTransform("phases", "document"))),
        Value("null", output_field=TextField()),
    ),
)


def _projects(user: Any) -> QuerySet[Project]:
    return selectors.projects_of(user)


def _upload_projects(user: Any) -> QuerySet[Project]:
    return selectors.projects_uploadable_by(user)


def _reports(user: Any) -> QuerySet[Report]:
    return selectors.reports_visible_to(user)


def _groups(user: Any) -> QuerySet[FailureGroup]:
    return selectors.groups_visible_to(user)


def _report_or_404(request: HttpRequest, report_id: int, *, with_document: bool = True) -> Report:
    reports = _reports(request.user).select_related("project", "group")
    if not with_document:
        reports = reports.defer(*LIST_DEFER).annotate(has_document=HAS_DOCUMENT)
    return get_object_or_404(reports, pk=report_id)


def _report_or_refusal(
    request: HttpRequest, report_id: int, *, with_document: bool = True
) -> Report | HttpResponse:
    """The report, or for another project's report a page saying whose it is (the links that the
    command line prints land here), with nothing of the report; a missing one is a plain 404."""
    try:
        return _report_or_404(request, report_id, with_document=with_document)
    except Http404:
        reason = selectors.report_hidden_from(request.user, report_id)
        if reason is None:
            raise
    context = {"reason": reason, "report_id": report_id, "projects": list(_projects(request.user))}
    return render(request, "front/not_member.html", context, status=404)


def _rows(reports: QuerySet[Report]) -> QuerySet[Report]:
    """Reports as list rows: without the large columns, with `has_document`."""
    return reports.defer(*LIST_DEFER).annotate(has_document=HAS_DOCUMENT, log_time=LOG_TIME)


def _int_param(request: HttpRequest, name: str) -> int | None:
    raw = request.GET.get(name, "").strip()
    # isdigit() alone takes "²" and other digits int() refuses
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 12:
        return None
    return int(raw)


# ---- upload ----


def _wants_json(request: HttpRequest) -> bool:
    return request.headers.get(
        "x-requested-with"
    ) == "XMLHttpRequest" or "application/json" in request.headers.get("accept", "")


def _csrf_rejection(request: HttpRequest) -> HttpResponse | None:
    """The CSRF middleware's check, run by a view that must look at the request before its body."""

    def no_view(request: HttpRequest) -> None:
        return None

    check = CsrfViewMiddleware(no_view)  # type: ignore[arg-type]
    check.process_request(request)
    return check.process_view(request, no_view, (), {})


def _upload_page(
    request: HttpRequest,
    projects: list[Project],
    errors: list[str],
    status: int,
    kept: dict[str, str] | None = None,
) -> HttpResponse:
    """The upload form; after a refusal, with the reasons and what was typed (`kept`: the pasted text,
    title, launch command, project), so the next try starts from there."""
    if errors and _wants_json(request):
        return JsonResponse({"error": " ".join(errors)}, status=status)
    context = {
        "projects": projects,
        "errors": errors,
        "max_bytes": settings.DISPATCHLAB_MAX_UPLOAD_BYTES,
        "kept": kept or {},
    }
    return render(request, "front/upload.html", context, status=status)


# csrf_exempt: the middleware reads the whole body (looking for the token) before any view runs; this
# view first refuses a body too large by its declared length, then runs the same CSRF check itself.
@csrf_exempt
@login_required
@require_http_methods(["GET", "POST"])
def upload(request: HttpRequest) -> HttpResponse:
    from dispatchlab.reports.intake import pasted_log, upload_check_readable
    from dispatchlab.reports.submit import (
        UploadRejected,
        UploadTooLarge,
        report_submit,
        upload_refuse_by_length,
    )

    projects = list(_upload_projects(request.user))
    if request.method != "POST":
        return _upload_page(request, projects, [], 200)
    try:
        upload_refuse_by_length(content_length=request.META.get("CONTENT_LENGTH"))
    except UploadRejected as rejected:
        status = 413 if isinstance(rejected, UploadTooLarge) else 400
        return _upload_page(request, projects, list(rejected.messages), status)
    rejection = _csrf_rejection(request)
    if rejection is not None:
        return rejection
    errors: list[str] = []
    files = request.FILES.getlist("file")
    slug = request.POST.get("project", "")
    pasted_text = request.POST.get("text", "")
    kept = {
        "text": pasted_text,
        "title": request.POST.get("title", "")[:300],
        "launch_command": request.POST.get("launch_command", ""),
        "project": slug,
    }
    pasted = pasted_log(pasted_text)
    project = next((p for p in projects if p.slug == slug), None)
    if project is None and len(projects) == 1 and not slug:
        project = projects[0]
    if project is None and slug and _projects(request.user).filter(slug=slug).exists():
        # A viewer of that project: a refusal, as the API gives it (an outsider learns nothing here).
        message = "You may read this project's reports but not upload to it (ask a member to make you one)."
        return _upload_page(request, projects, [message], 403, kept)
    if project is None:
        errors.append("Choose a project you can upload to.")
    if pasted is not None:
        files.append(pasted)
    if not files:
        errors.append(
            "The pasted text is empty: paste a log, or choose a log file."
            if pasted_text
            else "Choose a log file or paste a log."
        )
    if errors:
        return _upload_page(request, projects, errors, 400, kept)
    try:
        upload_check_readable(files=files)
        report, created = report_submit(
            project=project,
            user=request.user,
            files=files,
            title=kept["title"],
            launch_command=kept["launch_command"],
        )
    except UploadRejected as rejected:  # empty, binary, too large, too many files: a message for people
        status = 413 if isinstance(rejected, UploadTooLarge) else 400
        return _upload_page(request, projects, list(rejected.messages), status, kept)
    duplicate = "" if created else report_page.duplicate_message(report)
    if duplicate:
        # shown once, on the report page the browser goes to next (with or without JavaScript)
        messages.info(request, duplicate)
    if _wants_json(request):
        return JsonResponse(
            {
                "id": report.pk,
                "status": report.status,
                "url": reverse("front:report", args=[report.pk]),
                "status_url": reverse("front:report_status", args=[report.pk]),
                "duplicate": not created,
                "message": duplicate,
            },
            status=201,
        )
    return redirect("front:report", report_id=report.pk)


# ---- a report ----


def _status_context(report: Report, *, has_document: bool) -> dict[str, Any]:
    # has_document: the report is being (or was) analysed again; the fragment is then a banner over
    # the diagnosis it already has.
    return {"report": report, "progress": round(report.progress or 0.0, 1), "has_document": has_document}


@login_required
@require_GET
def report_status(request: HttpRequest, report_id: int) -> HttpResponse:
    """The live-progress fragment. htmx polls it; once the report is done it sends the browser to
    the report page (HX-Redirect), and a failed report stops the polling by not asking again."""
    report = _report_or_404(request, report_id, with_document=False)
    context = _status_context(report, has_document=report.has_document)  # type: ignore[attr-defined]
    response = render(request, "front/partials/report_status.html", context)
    if report.status == Report.Status.DONE and request.headers.get("HX-Request"):
        response["HX-Redirect"] = reverse("front:report", args=[report.pk])
    return response


@login_required
@require_GET
def report(request: HttpRequest, report_id: int) -> HttpResponse:
    report = _report_or_refusal(request, report_id)
    if isinstance(report, HttpResponse):
        return report
    doc = report.document if isinstance(report.document, dict) else None
    # A stored document stays on show while the report is analysed again (after a knowledge-base
    # change); the status fragment becomes a banner above it.
    context: dict[str, Any] = {"report": report, **_status_context(report, has_document=doc is not None)}
    context.update(gpu_views.report_context(request, report))
    context.update(decision_views.report_context(request, report))
    if doc is None:
        return render(request, "front/report.html", context)
    matches = presenters.match_views(doc)
    top = matches[0] if matches else None
    crash_line = report_page.exception_line(doc, selectors.report_line_index(report))
    events = report_page.event_list(doc, crash_line=crash_line)
    context.update(
        doc=doc,
        head=presenters.header(doc),
        matches=matches,
        top=top,
        top_evidence=report_page.folded_evidence(top.evidence, top.facts, crash_line=crash_line)
        if top
        else [],
        backends=presenters.backend_pairs(doc),
        has_draft=bool(doc.get("draft_backends")),
        event_list=events,
        timeline_fig=None if events is not None else figures.timeline_figure(doc, crash_line=crash_line),
        throughput_fig=figures.throughput_figure(doc),
        tracebacks=[t for t in doc.get("tracebacks") or [] if isinstance(t, dict)],
        evidence_lines=presenters.evidence_lines(doc),
        crash_line=crash_line,
        files=list(report.files.all()),
        similar_cases=selectors.report_similar_cases(doc),
        similar_groups=selectors.report_similar_groups(report),
        **last_good_context(report),
        compare_with=list(
            _rows(_reports(request.user).filter(project=report.project, document__isnull=False))
            .exclude(pk=report.pk)
            .order_by("-created_at")[:30]
        ),
    )
    return render(request, "front/report.html", context)


# the parts of the document the log viewer needs, read without decoding the rest (metrics, timeline)
LOG_DOCUMENT_KEYS = ("matches", "crash", "sources", "tracebacks", "line_count")


@login_required
@require_GET
def log(request: HttpRequest, report_id: int) -> HttpResponse:
    report = _report_or_refusal(request, report_id, with_document=False)
    if isinstance(report, HttpResponse):
        return report
    parts = (
        Report.objects.filter(pk=report.pk).values(*(f"document__{key}" for key in LOG_DOCUMENT_KEYS)).first()
        or {}
    )
    doc = {key: parts.get(f"document__{key}") for key in LOG_DOCUMENT_KEYS}
    index = selectors.report_line_index(report)
    context: dict[str, Any] = {"report": report, "index_ready": index is not None}
    if index is None:
        return render(request, "front/log.html", context)
    line_count = report.line_count or int(doc.get("line_count") or 0) or 1
    line = _int_param(request, "line")
    needle = request.GET.get("q", "")[:200]
    evidence = presenters.evidence_lines(doc)
    crash = report_page.exception_line(doc, index)
    window = log_window(
        index,
        line_count,
        line=line,
        start=_int_param(request, "start"),
        evidence=set(evidence),
        crash=crash,
        needle=needle,
        sources=[s for s in doc.get("sources") or [] if isinstance(s, dict)],
    )
    search = None
    if needle.strip():
        search = index.search(needle, start=_int_param(request, "from") or 1)
    context.update(
        window=window,
        rows=render_rows(window),
        line=line,
        needle=needle,
        search=search,
        evidence_lines=evidence,
        crash_line=crash,
        tracebacks=[t.get("line") for t in doc.get("tracebacks") or [] if isinstance(t, dict)][:20],
    )
    return render(request, "front/log.html", context)


# ---- lists ----


@login_required
@require_GET
def report_list(request: HttpRequest) -> HttpResponse:
    reports = _reports(request.user)
    form = ReportFilterForm(request.GET, reports=reports, projects=_projects(request.user))
    reports = _rows(filter_reports(reports, form).select_related("project", "group"))
    page = Paginator(reports.order_by("-created_at", "-id"), PAGE_SIZE).get_page(request.GET.get("page"))
    return render(
        request,
        "front/report_list.html",
        {
            "form": form,
            "page": page,
            "filtered": any(request.GET.get(name) for name in form.fields),
            "can_upload": _upload_projects(request.user).exists(),
        },
    )


def _first_day(days: int) -> dt.date:
    """The first of the last `days` days, today included: the date of a sparkline's first bar."""
    return timezone.localdate() - dt.timedelta(days=days - 1)


def _daily_counts(reports: QuerySet[Report], group_ids: list[int], days: int) -> dict[int, list[int]]:
    since = _first_day(days)
    start = timezone.make_aware(dt.datetime.combine(since, dt.time.min))
    counts: dict[int, list[int]] = {gid: [0] * days for gid in group_ids}
    rows = (
        reports.filter(group_id__in=group_ids, created_at__gte=start)
        .annotate(day=TruncDate("created_at"))
        .values("group_id", "day")
        .annotate(n=Count("id"))
    )
    for row in rows:
        index = (row["day"] - since).days
        if 0 <= index < days:
            counts[row["group_id"]][index] = row["n"]
    return counts


def _log_time_range(reports: QuerySet[Report]) -> tuple[str, str] | None:
    """The earliest and latest of the reports' own log times; times with a year before those without."""
    timed = reports.annotate(log_time=LOG_TIME).filter(log_time__isnull=False).exclude(log_time="")
    for found in (timed.exclude(log_time__startswith=f"{figures.UNKNOWN_YEAR}-"), timed):
        span = found.aggregate(first=Min("log_time"), last=Max("log_time"))
        if span["first"]:
            return span["first"], span["last"]
    return None


def _distinct_by_group(reports: QuerySet[Report], group_ids: list[int], column: str) -> dict[int, list[str]]:
    out: dict[int, list[str]] = defaultdict(list)
    rows = (
        reports.filter(group_id__in=group_ids)
        .exclude(**{column: ""})
        .order_by("group_id", column)
        .values_list("group_id", column)
        .distinct()
    )
    for group_id, value in rows:
        out[group_id].append(value)
    return out


@login_required
@require_GET
def groups(request: HttpRequest) -> HttpResponse:
    form = GroupFilterForm(request.GET)
    queryset = filter_groups(_groups(request.user).select_related("project"), form).order_by(
        "-last_seen", "-id"
    )
    page = Paginator(queryset, PAGE_SIZE).get_page(request.GET.get("page"))
    ids = [group.pk for group in page.object_list]
    reports = _reports(request.user)
    daily = _daily_counts(reports, ids, SPARK_DAYS)
    arches = _distinct_by_group(reports, ids, "arch")
    versions = _distinct_by_group(reports, ids, "server_version")
    rows = [
        {
            "group": group,
            "spark": figures.sparkline_svg(
                daily.get(group.pk, []), width=210, height=54, first_day=_first_day(SPARK_DAYS)
            ),
            "arches": arches.get(group.pk, []),
            "versions": versions.get(group.pk, []),
        }
        for group in page.object_list
    ]
    return render(
        request, "front/groups.html", {"form": form, "page": page, "rows": rows, "spark_days": SPARK_DAYS}
    )


@login_required
@require_GET
def group(request: HttpRequest, group_id: int) -> HttpResponse:
    group = get_object_or_404(_groups(request.user).select_related("project"), pk=group_id)
    reports = _reports(request.user).filter(group=group)
    page = Paginator(
        _rows(reports.select_related("project")).order_by("-created_at", "-id"), PAGE_SIZE
    ).get_page(request.GET.get("page"))
    days = 90
    return render(
        request,
        "front/group.html",
        {
            "group": group,
            "page": page,
            "spark": figures.sparkline_svg(
                _daily_counts(reports, [group.pk], days)[group.pk],
                width=640,
                height=130,
                first_day=_first_day(days),
            ),
            "spark_days": days,
            "log_times": _log_time_range(reports),
            "arches": _distinct_by_group(reports, [group.pk], "arch").get(group.pk, []),
            "versions": _distinct_by_group(reports, [group.pk], "server_version").get(group.pk, []),
            **decision_views.group_context(request, group),
        },
    )


# ---- compare ----


@login_required
@require_GET
def compare(request: HttpRequest) -> HttpResponse:
    reports = _reports(request.user)
    a_id, b_id = _int_param(request, "a"), _int_param(request, "b")
    choices = list(_rows(reports.filter(document__isnull=False)).order_by("-created_at")[:100])
    context: dict[str, Any] = {"choices": choices, "a_id": a_id, "b_id": b_id}
    if a_id is None or b_id is None:
        return render(request, "front/compare.html", context)
    found = {r.pk: r for r in reports.select_related("project").filter(pk__in=[a_id, b_id])}
    if a_id not in found or b_id not in found:
        raise Http404("No such report")
    a, b = found[a_id], found[b_id]
    if not isinstance(a.document, dict) or not isinstance(b.document, dict):
        context.update(a=a, b=b, not_ready=True)
        return render(request, "front/compare.html", context)
    context.update(a=a, b=b, comparison=compare_documents(a.document, b.document))
    return render(request, "front/compare.html", context)
