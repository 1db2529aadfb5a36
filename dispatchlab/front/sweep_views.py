"""The backend sweep's pages: asking for a sweep from a report, the sweep run's page (waiting for a host,
then the ranked table, the chart, the shapes and where each came from, the proposed fix), and the one
click that confirms the full launch with that fix (the confirm service does the confirming).

Scoping as in gpu_views.py: a sweep of another project is a 404; starting work needs a member.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from dispatchlab.core.launch import apply_patch, launch_diff
from dispatchlab.front import sweep_figures
from dispatchlab.front.gpu_figures import _number, probe_status_word
from dispatchlab.gpu.models import SweepRun
from dispatchlab.gpu.sweep_selectors import sweeps_of_report, sweeps_visible_to
from dispatchlab.messaging.sweep import COMPONENTS
from dispatchlab.reports import selectors
from dispatchlab.reports.models import Report

STATUS_POLL = "every 2s"
COMPONENT_NAMES = {
    "moe": "MoE runner",
    "attention": "attention",
    "gemm": "dense or quantized GEMM",
    "sampling": "sampling",
}
# ShapeFact.source -> where the value came from, in words
SOURCE_WORDS = {
    "args": "read from the launch's args dump",
    "config": "read from the model config in the log",
    "inferred": "inferred",
    "default": "default: the log does not say",
}
SUMMARY_ROWS = 5
VIEWER = "You may read this project's reports but not start runs on its behalf (you are a viewer)."


def _can_start(request: HttpRequest, report: Report) -> bool:
    return selectors.user_can_upload(user=request.user, project=report.project)


def _sweep_or_404(request: HttpRequest, sweep_id: int) -> SweepRun:
    # the report's document is read: the proposed fix is applied to the launch it holds
    return get_object_or_404(sweeps_visible_to(request.user).select_related("report", "project"), pk=sweep_id)


# ---- what the page shows


def sweep_sentence(sweep: SweepRun, host_status: dict[str, Any]) -> str:
    arch = sweep.arch or "any arch"
    if sweep.status == SweepRun.Status.QUEUED:
        if not host_status.get("available"):
            return (
                f"Waiting in queue {sweep.queue}: no live host of {arch}. It starts by itself when "
                f"`python -m worker` runs on one."
            )
        return (
            f"Queued in {sweep.queue}: a live host of {arch} takes it when it is free; this page says "
            "when it starts."
        )
    if sweep.status == SweepRun.Status.RUNNING:
        since = f" since {sweep.started_at:%H:%M:%S} UTC" if sweep.started_at else ""
        return (
            f"Running on {sweep.host_name or 'a host of ' + arch}{since}: each candidate is built, "
            "checked against the reference and timed; the table appears when all are done."
        )
    if sweep.status == SweepRun.Status.FAILED:
        return f"The sweep did not run: {sweep.error}" if sweep.error else "The sweep did not run."
    result = sweep.result or {}
    ranked = sum(1 for c in result.get("candidates") or [] if isinstance(c, dict) and c.get("rank"))
    total = len(result.get("candidates") or [])
    where = f" on {sweep.host_name}" if sweep.host_name else ""
    device = " on CPU (no GPU on the host: no % of peak)" if result.get("device") == "cpu" else ""
    return f"Done{where}{device}: {ranked} of {total} candidates ran and were correct."


def _correct_text(candidate: dict[str, Any]) -> str:
    if candidate.get("correct") is True:
        return "yes"
    if _number(candidate.get("ms")) is None and not candidate.get("checked"):
        return "—"
    if str(candidate.get("status") or "").upper() == "UNCHECKED" or not candidate.get("checked"):
        return "unchecked"
    return "no"


def tolerance_text(tolerance: Any) -> str:
    """{"atol": 0.01, "rtol": 0.01, "required_match": 0.95} -> "atol 0.01, rtol 0.01, 95% of elements"."""
    if not isinstance(tolerance, dict):
        return ""
    parts = [
        f"{key} {tolerance[key]:g}" for key in ("atol", "rtol") if _number(tolerance.get(key)) is not None
    ]
    share = _number(tolerance.get("required_match"))
    if share is not None:
        parts.append("every element" if share >= 1 else f"{share * 100:.0f}% of elements")
    return ", ".join(parts)


def jit_text(jit: Any) -> str:
    """{"state": "built", "seconds": 41.2} -> "built in 41 s"; {"state": "cached"} -> "cached"."""
    if not isinstance(jit, dict) or not jit.get("state"):
        return ""
    state = str(jit["state"])
    seconds = _number(jit.get("seconds"))
    if seconds is None:
        return state
    took = f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    return f"{state} in {took}" if state in ("built", "loaded") else f"{state} ({took})"


def candidate_row(candidate: dict[str, Any], *, proposed: str | None) -> dict[str, Any]:
    ms = _number(candidate.get("ms"))
    max_error = _number(candidate.get("max_error"))
    matched = _number(candidate.get("matched_ratio"))
    return {
        "rank": candidate.get("rank") if isinstance(candidate.get("rank"), int) else None,
        "name": str(candidate.get("name") or ""),
        "backend": str(candidate.get("backend") or ""),
        "flag_value": candidate.get("flag_value"),
        "status": probe_status_word(candidate),
        "verdict": sweep_figures.candidate_verdict(candidate, proposed),
        "correct": _correct_text(candidate),
        "max_error": f"{max_error:.3g}" if max_error is not None else "",
        "matched": f"{matched * 100:.1f}%" if matched is not None else "",
        "tolerance": tolerance_text(candidate.get("tolerance")),
        "ms": f"{ms:.4g}" if ms is not None else "",
        "rate": sweep_figures.rate_text(candidate),
        "peak": sweep_figures.percent_text(candidate.get("peak_fraction")),
        "anchor": sweep_figures.percent_text(candidate.get("anchor_fraction")),
        "jit": jit_text(candidate.get("jit")),
        "error": str(candidate.get("error") or ""),
        "available": candidate.get("available") is not False,
    }


def candidate_rows(sweep: SweepRun) -> list[dict[str, Any]]:
    result = sweep.result or {}
    fix = sweep.proposed_fix or {}
    proposed = str(fix.get("candidate") or "") or None
    return [
        candidate_row(c, proposed=proposed) for c in result.get("candidates") or [] if isinstance(c, dict)
    ]


def shape_rows(sweep: SweepRun) -> list[dict[str, Any]]:
    """Each shape value, where it came from in words, and what one rank's kernels ran at."""
    result = sweep.result or {}
    provenance = result.get("provenance") if isinstance(result.get("provenance"), dict) else sweep.shapes
    facts = (provenance or {}).get("facts") or {}
    ran = result.get("shapes") if isinstance(result.get("shapes"), dict) else {}
    ran = ran or (provenance or {}).get("per_rank") or {}
    rows = []
    for name, fact in facts.items():
        if not isinstance(fact, dict):
            continue
        source = str(fact.get("source") or "default")
        words = SOURCE_WORDS.get(source, source)
        if source in ("args", "config") and isinstance(fact.get("line"), int):
            words += f", line {fact['line']}"
        if fact.get("note") and source != "default":
            words += f": {fact['note']}"
        value = fact.get("value")
        per_rank = ran.get(name)
        rows.append(
            {
                "name": name,
                "value": "none" if value is None else str(value),
                "source": source,
                "words": words,
                "per_rank": str(per_rank) if per_rank is not None and per_rank != value else "",
            }
        )
    if isinstance(ran.get("tokens"), int):
        rows.append(
            {
                "name": "tokens",
                "value": str(ran["tokens"]),
                "source": "default",
                "words": "the sweep's batch of tokens per call (not from the log)",
                "per_rank": "",
            }
        )
    return rows


def proposed_confirm(sweep: SweepRun) -> dict[str, Any] | None:
    """The proposed fix, the button's words, and the full launch it confirms (with what changes)."""
    from dispatchlab.gpu.services import confirm_plan

    fix = sweep.proposed_fix
    if sweep.status != SweepRun.Status.DONE or not fix or not isinstance(fix.get("args_patch"), dict):
        return None
    flag_value = f"{fix.get('flag') or ''} {fix.get('value') or ''}".strip()
    plan = confirm_plan(report=sweep.report)
    launch = apply_patch(plan.launch, args=fix["args_patch"], env={}) if plan.launch is not None else None
    return {
        "fix": fix,
        "flag_value": flag_value,
        "button": f"Confirm the full launch with {flag_value}",
        "command": launch.command() if launch is not None else "",
        "diff": [line for line in launch_diff(plan.launch, launch) if line.kind != "same"]
        if launch is not None and plan.launch is not None
        else [],
        "reason": "" if launch is not None else plan.reason,
    }


def _status_context(request: HttpRequest, sweep: SweepRun) -> dict[str, Any]:
    from dispatchlab.gpu.services import host_status_for_arch

    host_status = host_status_for_arch(sweep.arch or None)
    return {
        "sweep": sweep,
        "component_name": COMPONENT_NAMES.get(sweep.component, sweep.component),
        "host_status": host_status,
        "sentence": sweep_sentence(sweep, host_status),
        "poll": STATUS_POLL if sweep.status in SweepRun.WAITING else "",
    }


# ---- the report page's panel (front/gpu/partials/sweep_panel.html, through sweep_tags)


def report_panel_context(request: HttpRequest, report: Report) -> dict[str, Any]:
    """What the report page's "Sweep backends" panel needs: the form with the component the crash
    names pre-selected, and the newest sweep's ranked summary. Empty before the report is parsed."""
    from dispatchlab.gpu.sweep_services import sweep_component_for

    if report.status != Report.Status.DONE:
        return {}
    guess = sweep_component_for(dict(report.document or {}))
    latest = sweeps_of_report(report).first()
    summary: list[dict[str, Any]] = []
    if latest is not None and latest.status == SweepRun.Status.DONE:
        summary = [row for row in candidate_rows(latest) if row["rank"] is not None][:SUMMARY_ROWS]
    return {
        "report": report,
        "guess": guess,
        "choices": [
            {"value": c, "name": COMPONENT_NAMES.get(c, c), "selected": c == guess.component}
            for c in COMPONENTS
        ],
        "can_start": _can_start(request, report),
        "latest": latest,
        "summary": summary,
        "latest_fix": latest.proposed_fix if latest is not None else None,
        "count": sweeps_of_report(report).count(),
    }


# ---- views


@login_required
@require_POST
def sweep_new(request: HttpRequest, report_id: int) -> HttpResponse:
    from dispatchlab.gpu.sweep_services import SweepRejected, sweep_create

    report = get_object_or_404(selectors.reports_visible_to(request.user), pk=report_id)
    if not _can_start(request, report):
        return HttpResponse(VIEWER, status=403, content_type="text/plain; charset=utf-8")
    try:
        sweep = sweep_create(
            report=report, component=request.POST.get("component", "")[:40], user=request.user
        )
    except SweepRejected as rejected:
        return HttpResponse(str(rejected), status=400, content_type="text/plain; charset=utf-8")
    return redirect("front:sweep", sweep_id=sweep.pk)


@login_required
@require_GET
def sweep(request: HttpRequest, sweep_id: int) -> HttpResponse:
    sweep = _sweep_or_404(request, sweep_id)
    result = sweep.result or {}
    fix = sweep.proposed_fix or {}
    candidates = [c for c in result.get("candidates") or [] if isinstance(c, dict)]
    context = {
        **_status_context(request, sweep),
        "report": sweep.report,
        "rows": candidate_rows(sweep),
        "fig": sweep_figures.sweep_figure(
            candidates, proposed=str(fix.get("candidate") or "") or None, gpu_name=result.get("gpu")
        ),
        "shapes": shape_rows(sweep),
        "proposed": proposed_confirm(sweep),
        "can_start": _can_start(request, sweep.report),
        "result": result,
        "tolerance": tolerance_text(result.get("tolerance")),
    }
    return render(request, "front/gpu/sweep.html", context)


@login_required
@require_GET
def sweep_status(request: HttpRequest, sweep_id: int) -> HttpResponse:
    """The polled fragment. Once the sweep is done or failed it sends the browser to the sweep page."""
    sweep = _sweep_or_404(request, sweep_id)
    response = render(request, "front/gpu/partials/sweep_status.html", _status_context(request, sweep))
    if sweep.status not in SweepRun.WAITING and request.headers.get("HX-Request"):
        response["HX-Redirect"] = reverse("front:sweep", args=[sweep.pk])
    return response


@login_required
@require_POST
def sweep_confirm(request: HttpRequest, sweep_id: int) -> HttpResponse:
    """The one click: a confirm run of the report's full launch with the proposed backend."""
    from dispatchlab.gpu.services import ConfirmRejected
    from dispatchlab.gpu.sweep_services import SweepRejected
    from dispatchlab.gpu.sweep_services import sweep_confirm as confirm_with_fix

    sweep = _sweep_or_404(request, sweep_id)
    if not _can_start(request, sweep.report):
        return HttpResponse(VIEWER, status=403, content_type="text/plain; charset=utf-8")
    try:
        confirm = confirm_with_fix(sweep=sweep, user=request.user)
    except (SweepRejected, ConfirmRejected) as rejected:
        return HttpResponse(str(rejected), status=400, content_type="text/plain; charset=utf-8")
    return redirect("front:confirm", confirm_id=confirm.pk)
