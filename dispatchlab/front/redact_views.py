"""Redacting a report's log from its page: a pattern or a line range, queued for a worker (which runs
the pattern under a time limit, then parses the redacted copy again); the page lists the report's
redactions and why any was refused."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from dispatchlab.reports import selectors
from dispatchlab.reports.redaction import RedactionRefused, redaction_from, redaction_request


def _number(raw: str) -> int | str | None:
    raw = raw.strip()
    if not raw:
        return None
    return int(raw) if raw.isascii() and raw.isdigit() else raw  # a non-number is refused by name


@login_required
@require_http_methods(["GET", "POST"])
def redact(request: HttpRequest, report_id: int) -> HttpResponse:
    report = selectors.reports_visible_to(request.user).filter(id=report_id).first()
    if report is None:
        raise Http404("No such report")
    if not selectors.user_can_upload(user=request.user, project=report.project):
        raise PermissionDenied("Only a project's members redact its logs; viewers read them.")
    values = {key: request.POST.get(key, "") for key in ("mode", "pattern", "first_line", "last_line")}
    problem, status = "", 200
    if request.method == "POST":
        by_lines = values["mode"] == "lines"
        try:
            spec = redaction_from(
                pattern=None if by_lines else values["pattern"],
                first_line=_number(values["first_line"]) if by_lines else None,
                last_line=_number(values["last_line"]) if by_lines else None,
            )
            redaction_request(report=report, spec=spec, user=request.user)
        except RedactionRefused as refused:
            problem, status = str(refused), 409 if refused.conflict else 400
        else:
            messages.success(
                request,
                "Redaction queued: a worker replaces the stored log and every copy, then parses it again. "
                "Its outcome is listed on the Redact page.",
            )
            return redirect("front:report", report_id=report.id)
    context = {
        "report": report,
        "values": values,
        "problem": problem,
        "redactions": report.redactions.order_by("-id")[:20],
    }
    return render(request, "front/redact.html", context, status=status)
