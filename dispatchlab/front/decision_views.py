"""Decision-record pages: the list, a record (rendered Markdown, alternatives, links, history), the create
and edit forms, and the banner that report and failure-group pages show above the diagnosis.

Scoping as in views.py: a record of another project is a 404; recording and editing need a member of the
record's project, a viewer reads only (403).
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from dispatchlab.core.decisions import (
    REVISIT_PACKAGES,
    DecisionRef,
    decision_sentence,
    draft_from_document,
)
from dispatchlab.decisions.markdown import render_markdown, render_markdown_excerpt
from dispatchlab.decisions.models import Decision, DecisionEdit
from dispatchlab.decisions.selectors import (
    decision_links,
    decisions_visible_to,
    group_decision_refs,
    report_decision_refs,
)
from dispatchlab.decisions.services import decision_create, decision_update
from dispatchlab.decisions.validation import LINK_KINDS, DecisionInvalid
from dispatchlab.reports import selectors
from dispatchlab.reports.models import FailureGroup, Project, Report

PAGE_SIZE = 50
BLANK_ALTERNATIVES = 3
TEXT_FIELDS = ("context", "decision", "consequences")
FIELD_NAMES = {
    "title": "title",
    "status": "status",
    "context": "context",
    "decision": "decision",
    "consequences": "consequences",
    "alternatives": "alternatives tried",
    "links.groups": "failure groups",
    "links.signatures": "signatures",
    "links.reports": "reports",
    "links.upstream": "upstream issues",
    "revisit_when": "revisit when",
    "superseded_by": "superseded by",
    "stale": "stale",
    "stale_reason": "stale because",
}
# the form's sections that show their own errors; any other error is listed at the end
FORM_SECTIONS = {
    "project",
    "title",
    "status",
    "superseded_by",
    *TEXT_FIELDS,
    "alternatives",
    *(f"links_{kind}" for kind in LINK_KINDS),
    "revisit_when",
}
REVISIT_LINE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_.\-]*)\s*:?\s*(.*?)\s*$")


# ---------------------------------------------------------------- the banner on reports and groups


# How much of a record's Decision text the banner shows: what was decided, not only the title.
BANNER_DECISION_CHARS = 220


def _banner(refs: list[DecisionRef]) -> list[dict[str, Any]]:
    decided = dict(Decision.objects.filter(id__in=[ref["id"] for ref in refs]).values_list("id", "decision"))
    return [
        {
            **ref,
            "sentence": decision_sentence(ref),
            "decided": render_markdown_excerpt(decided.get(ref["id"]) or "", BANNER_DECISION_CHARS),
            "url": reverse("front:decision", args=[ref["id"]]),
        }
        for ref in refs
    ]


def report_context(request: HttpRequest, report: Report) -> dict[str, Any]:
    """What report.html's decisions banner needs (`decision_*` keys)."""
    if not isinstance(report.document, dict):
        return {}
    can_record = selectors.user_can_upload(user=request.user, project=report.project)
    return {
        "decision_items": _banner(report_decision_refs(report)),
        "decision_new_url": reverse("front:decision_new") + f"?report={report.pk}" if can_record else "",
    }


def group_context(request: HttpRequest, group: FailureGroup) -> dict[str, Any]:
    """What group.html's decisions banner needs: records linked to its fingerprint or to the top
    signature of any of its reports."""
    signatures = (
        Report.objects.filter(group=group)
        .exclude(top_match_id="")
        .values_list("top_match_id", flat=True)
        .distinct()
    )
    can_record = selectors.user_can_upload(user=request.user, project=group.project)
    return {
        "decision_items": _banner(group_decision_refs(group, list(signatures))),
        "decision_new_url": reverse("front:decision_new") + f"?group={group.pk}" if can_record else "",
    }


# ---------------------------------------------------------------- list and detail


@login_required
@require_GET
def decision_list(request: HttpRequest) -> HttpResponse:
    projects = selectors.projects_of(request.user)
    found = decisions_visible_to(request.user).prefetch_related("links")
    params = {name: request.GET.get(name, "").strip() for name in ("project", "status", "stale", "q")}
    if params["project"]:
        found = found.filter(project__slug=params["project"])
    if params["status"]:
        found = found.filter(status=params["status"])
    if params["stale"] in ("yes", "no"):
        found = found.filter(stale=params["stale"] == "yes")
    if params["q"]:
        found = found.filter(
            Q(title__icontains=params["q"]) | Q(links__target=params["q"].lower())
        ).distinct()
    page = Paginator(found.order_by("project__name", "-number"), PAGE_SIZE).get_page(request.GET.get("page"))
    rows = [{"decision": d, "links": decision_links(d)} for d in page.object_list]
    return render(
        request,
        "front/decisions/list.html",
        {
            "page": page,
            "rows": rows,
            "params": params,
            "projects": projects,
            "statuses": Decision.Status.values,
            "filtered": any(params.values()),
            "can_record": selectors.projects_uploadable_by(request.user).exists(),
        },
    )


def _decision_or_404(request: HttpRequest, decision_id: int) -> Decision:
    return get_object_or_404(
        decisions_visible_to(request.user).select_related("superseded_by", "stale_report"), pk=decision_id
    )


def _show(field: str, value: Any, labels: dict[int, str]) -> str:
    if value is None or value == "" or value == [] or value == {}:
        return "—"
    if field == "superseded_by" and isinstance(value, int):
        return labels.get(value, f"record {value}")
    if field == "revisit_when" and isinstance(value, dict):
        return ", ".join(f"{package}{spec}" for package, spec in value.items())
    if field == "alternatives" and isinstance(value, list):
        return "; ".join(
            f"{item.get('what')}: {item.get('outcome')}" if item.get("outcome") else str(item.get("what"))
            for item in value
            if isinstance(item, dict)
        )
    if isinstance(value, list):
        return ", ".join(str(item) for item in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _change_rows(changes: dict[str, Any], labels: dict[int, str]) -> list[dict[str, Any]]:
    rows = []
    for field, change in changes.items():
        before, after = (change or {}).get("from"), (change or {}).get("to")
        row: dict[str, Any] = {
            "field": FIELD_NAMES.get(field, field),
            "from": _show(field, before, labels),
            "to": _show(field, after, labels),
            "diff": [],
        }
        long_text = field in TEXT_FIELDS and isinstance(before, str) and isinstance(after, str)
        if long_text and ("\n" in before + after or len(before) + len(after) > 160):
            lines = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=1)
            row["diff"] = [
                {"kind": {"+": "added", "-": "removed", "@": "hunk"}.get(line[:1], "same"), "text": line}
                for line in list(lines)[2:]
            ]
        rows.append(row)
    return rows


def _history(decision: Decision) -> list[dict[str, Any]]:
    edits = list(DecisionEdit.objects.filter(decision=decision).select_related("user").order_by("at", "id"))
    ids = {
        value
        for edit in edits
        for key in ("from", "to")
        if isinstance(value := (edit.changes.get("superseded_by") or {}).get(key), int)
    }
    labels = {
        pk: f"DR-{number}"
        for pk, number in Decision.objects.filter(id__in=ids, project=decision.project).values_list(
            "id", "number"
        )
    }
    return [{"edit": edit, "rows": _change_rows(edit.changes, labels)} for edit in reversed(edits)]


def _resolved_links(request: HttpRequest, decision: Decision) -> dict[str, list[dict[str, Any]]]:
    links = decision_links(decision)
    groups = {
        g.fingerprint: g
        for g in selectors.groups_visible_to(request.user).filter(
            project=decision.project, fingerprint__in=links["groups"]
        )
    }
    reports = {
        r.pk: r
        for r in selectors.reports_visible_to(request.user)
        .filter(project=decision.project, pk__in=links["reports"])
        .defer("document", "backend_values", "launch_command")
    }
    return {
        "groups": [
            {
                "target": fp,
                "url": reverse("front:group", args=[groups[fp].pk]) if fp in groups else "",
                "obj": groups.get(fp),
            }
            for fp in links["groups"]
        ],
        "signatures": [
            {"target": sig, "url": reverse("front:report_list") + "?signature=" + sig}
            for sig in links["signatures"]
        ],
        "reports": [
            {
                "target": rid,
                "url": reverse("front:report", args=[rid]) if rid in reports else "",
                "obj": reports.get(rid),
            }
            for rid in links["reports"]
        ],
        "upstream": [{"target": url} for url in links["upstream"]],
    }


@login_required
@require_GET
def decision_detail(request: HttpRequest, decision_id: int) -> HttpResponse:
    decision = _decision_or_404(request, decision_id)
    return render(
        request,
        "front/decisions/detail.html",
        {
            "decision": decision,
            "rendered": {name: render_markdown(getattr(decision, name)) for name in TEXT_FIELDS},
            "links": _resolved_links(request, decision),
            "supersedes": list(decision.supersedes.order_by("-number")),
            "history": _history(decision),
            "can_edit": selectors.user_can_upload(user=request.user, project=decision.project),
        },
    )


# ---------------------------------------------------------------- create and edit


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _revisit_from_text(text: str) -> tuple[dict[str, str], list[str]]:
    """`flashinfer >=0.7` per line (or `flashinfer: >=0.7`, `flashinfer>=0.7`)."""
    out: dict[str, str] = {}
    problems = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        match = REVISIT_LINE.match(line)
        if match is None or not match.group(2):
            problems.append(f"line {number}: write a package and a specifier, e.g. “flashinfer >=0.7”")
            continue
        out[match.group(1)] = match.group(2)
    return out, problems


def _data_from_post(post: QueryDict) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The form's fields as the service takes them, and what cannot even be read."""
    problems: dict[str, list[str]] = {}
    alternatives = [
        {"what": what.strip(), "outcome": outcome.strip()}
        for what, outcome in zip(post.getlist("alt_what"), post.getlist("alt_outcome"), strict=False)
        if what.strip() or outcome.strip()
    ]
    revisit, revisit_problems = _revisit_from_text(post.get("revisit_when", ""))
    if revisit_problems:
        problems["revisit_when"] = revisit_problems
    successor_raw = post.get("superseded_by", "").strip()
    successor = int(successor_raw) if successor_raw.isascii() and successor_raw.isdigit() else None
    data = {
        "title": post.get("title", ""),
        "status": post.get("status", Decision.Status.PROPOSED),
        "context": post.get("context", ""),
        "decision": post.get("decision", ""),
        "consequences": post.get("consequences", ""),
        "alternatives": alternatives,
        "links": {kind: _lines(post.get(f"links_{kind}", "")) for kind in LINK_KINDS},
        "revisit_when": revisit,
        "superseded_by": successor,
    }
    return data, problems


def _form_errors(message_dict: dict[str, list[str]]) -> dict[str, list[str]]:
    """Service field names -> form sections: `alternatives[1].what` -> alternatives ("row 2, what: ...")."""
    out: dict[str, list[str]] = {}
    for key, messages_ in message_dict.items():
        if key.startswith("links."):
            section, prefix = "links_" + key.split(".", 1)[1], ""
        elif key.startswith("revisit_when."):
            section, prefix = "revisit_when", key.split(".", 1)[1] + ": "
        elif key.startswith("alternatives["):
            match = re.match(r"alternatives\[(\d+)\](?:\.(\w+))?", key)
            row, part = (int(match.group(1)) + 1, match.group(2)) if match else (0, None)
            section, prefix = "alternatives", f"row {row}{', ' + part if part else ''}: "
        else:
            section, prefix = key, ""
        out.setdefault(section, []).extend(prefix + m for m in messages_)
    return out


def _form_values(data: dict[str, Any]) -> dict[str, Any]:
    links = data.get("links") or {}
    revisit = data.get("revisit_when") or {}
    return {
        "title": data.get("title", ""),
        "status": data.get("status", Decision.Status.PROPOSED),
        "context": data.get("context", ""),
        "decision": data.get("decision", ""),
        "consequences": data.get("consequences", ""),
        "alternatives": list(data.get("alternatives") or [])
        + [{"what": "", "outcome": ""}] * BLANK_ALTERNATIVES,
        **{f"links_{kind}": "\n".join(str(v) for v in links.get(kind, [])) for kind in LINK_KINDS},
        "revisit_when": "\n".join(f"{package} {spec}" for package, spec in revisit.items()),
        "superseded_by": data.get("superseded_by"),
    }


def _form_page(
    request: HttpRequest,
    *,
    project: Project | None,
    projects: list[Project],
    values: dict[str, Any],
    errors: dict[str, list[str]],
    decision: Decision | None = None,
    source: str = "",
    status: int = 200,
) -> HttpResponse:
    successors = Decision.objects.filter(project=project) if project is not None else Decision.objects.none()
    if decision is not None:
        successors = successors.exclude(pk=decision.pk)
    return render(
        request,
        "front/decisions/form.html",
        {
            "decision": decision,
            "project": project,
            "projects": projects,
            "values": values,
            "errors": errors,
            "other_errors": {key: value for key, value in errors.items() if key not in FORM_SECTIONS},
            "statuses": Decision.Status.values,
            "successors": list(successors.order_by("-number").only("id", "number", "title")),
            "packages": REVISIT_PACKAGES,
            "source": source,
        },
        status=status,
    )


def _draft(request: HttpRequest) -> tuple[Project | None, dict[str, Any], str]:
    """The project and pre-filled fields of "Record a decision" from ?report=ID or ?group=ID."""
    report_id, group_id = request.GET.get("report", ""), request.GET.get("group", "")
    if report_id.isascii() and report_id.isdigit():
        report = get_object_or_404(selectors.reports_visible_to(request.user), pk=int(report_id))
        draft = draft_from_document(report.document if isinstance(report.document, dict) else {})
        links = {"groups": draft["groups"], "signatures": draft["signatures"], "reports": [report.pk]}
        return report.project, {**draft, "links": links}, f"report {report.pk}"
    if group_id.isascii() and group_id.isdigit():
        group = get_object_or_404(selectors.groups_visible_to(request.user), pk=int(group_id))
        newest = (
            selectors.reports_visible_to(request.user)
            .filter(group=group, document__isnull=False)
            .order_by("-created_at", "-id")
            .first()
        )
        draft = draft_from_document(newest.document if newest and isinstance(newest.document, dict) else {})
        links = {"groups": [group.fingerprint], "signatures": draft["signatures"]}
        return (
            group.project,
            {**draft, "title": draft["title"] or group.title, "links": links},
            "failure group",
        )
    slug = request.GET.get("project", "")
    project = selectors.projects_of(request.user).filter(slug=slug).first() if slug else None
    return project, {}, ""


@login_required
@require_http_methods(["GET", "POST"])
def decision_new(request: HttpRequest) -> HttpResponse:
    writable = list(selectors.projects_uploadable_by(request.user))
    if not writable:
        raise PermissionDenied("Only a project's members record decisions; viewers read them.")
    if request.method == "GET":
        project, draft, source = _draft(request)
        if project is not None and project not in writable:
            raise PermissionDenied("Only a project's members record decisions; viewers read them.")
        if project is None and len(writable) == 1:
            project = writable[0]
        return _form_page(
            request, project=project, projects=writable, values=_form_values(draft), errors={}, source=source
        )
    slug = request.POST.get("project", "")
    project = next((p for p in writable if p.slug == slug), None)
    data, problems = _data_from_post(request.POST)
    if project is None:
        problems.setdefault("project", []).append("Choose a project you are a member of.")
    if problems:
        return _form_page(
            request,
            project=project,
            projects=writable,
            values=_form_values(data),
            errors=problems,
            status=400,
        )
    assert project is not None
    try:
        decision = decision_create(project=project, user=request.user, data=data)
    except DecisionInvalid as invalid:
        return _form_page(
            request,
            project=project,
            projects=writable,
            values=_form_values(data),
            errors=_form_errors(invalid.message_dict),
            status=400,
        )
    messages.success(request, f"{decision.label} recorded.")
    return redirect("front:decision", decision_id=decision.pk)


@login_required
@require_http_methods(["GET", "POST"])
def decision_edit(request: HttpRequest, decision_id: int) -> HttpResponse:
    decision = _decision_or_404(request, decision_id)
    if not selectors.user_can_upload(user=request.user, project=decision.project):
        raise PermissionDenied("Only a project's members edit its decision records; viewers read them.")
    if request.method == "GET":
        current = {
            "title": decision.title,
            "status": decision.status,
            "context": decision.context,
            "decision": decision.decision,
            "consequences": decision.consequences,
            "alternatives": decision.alternatives,
            "links": decision_links(decision),
            "revisit_when": decision.revisit_when,
            "superseded_by": decision.superseded_by_id,
        }
        return _form_page(
            request,
            project=decision.project,
            projects=[],
            values=_form_values(current),
            errors={},
            decision=decision,
        )
    data, problems = _data_from_post(request.POST)
    errors = problems
    if not problems:
        try:
            decision_update(decision=decision, user=request.user, data=data)
        except DecisionInvalid as invalid:
            errors = _form_errors(invalid.message_dict)
        else:
            messages.success(request, f"{decision.label} saved.")
            return redirect("front:decision", decision_id=decision.pk)
    return _form_page(
        request,
        project=decision.project,
        projects=[],
        values=_form_values(data),
        errors=errors,
        decision=decision,
        status=400,
    )
