"""The JSON API of decision records (CONTRACT.md): list, create, read, update, history, export.

Reading needs any role in the record's project; creating and editing a member (not a viewer, not a
read-only token). Another project's record is a 404. A refused field comes back by name:
`{"error": "...", "fields": {"revisit_when.flashinfer": ["'>=0.7a' is not a PEP 440 specifier ..."]}}`.

`GET /api/v1/decisions?format=export` answers `{"decisions": [...]}`, every visible record (filters
apply, no pages), which `dispatchlab match LOG --decisions FILE` reads.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods

from dispatchlab.api.auth import Caller, authenticate, error
from dispatchlab.decisions.models import Decision, DecisionEdit, DecisionLink
from dispatchlab.decisions.serialize import decision_json, edit_json
from dispatchlab.decisions.services import DecisionInvalid, decision_create, decision_update
from dispatchlab.reports.models import Project

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
MAX_BODY = 1024 * 1024
SET_BY_LOGS = "is set when a log of the project meets revisit_when; change revisit_when to clear it"
READ_ONLY = {
    "id": "is given by the server",
    "number": "is given by the server (the next DR number of the project)",
    "label": "is given by the server",
    "author": "is the user who created the record",
    "created": "is set by the server",
    "updated": "is set by the server",
    "status_since": "is set when the status changes",
    "url": "is given by the server",
    "history_url": "is given by the server",
    "stale": SET_BY_LOGS,
    "stale_reason": SET_BY_LOGS,
    "stale_since": SET_BY_LOGS,
    "stale_report": SET_BY_LOGS,
}


def _invalid(message: str, fields: dict[str, list[str]], status: int = 400) -> JsonResponse:
    return JsonResponse({"error": message, "fields": fields}, status=status)


def _visible(caller: Caller) -> QuerySet[Decision]:
    return (
        Decision.objects.filter(project__in=caller.projects())
        .select_related("project", "author")
        .prefetch_related("links")
    )


def _write_refusal(caller: Caller, project: Project) -> JsonResponse | None:
    if caller.can_write(project):
        return None
    if caller.token is not None and caller.token.read_only:
        return error("this token is read-only", 403)
    return error("you may read this project's decision records but not change them (viewer role)", 403)


def _body(request: HttpRequest) -> dict[str, Any] | JsonResponse:
    if len(request.body) > MAX_BODY:
        return error(f"the request body is larger than {MAX_BODY:,} bytes", 413)
    try:
        body = json.loads(request.body or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as failure:
        return error(f"the body is not JSON: {failure}", 400)
    if not isinstance(body, dict):
        return error("the body must be a JSON object (a decision record's fields)", 400)
    return body


def _pick_project(caller: Caller, requested: Any) -> Project | JsonResponse:
    if requested not in (None, ""):
        if not isinstance(requested, str):
            return _invalid("the record is not valid", {"project": ["must be a project's slug"]})
        project = caller.projects().filter(Q(slug=requested) | Q(name=requested)).first()
        if project is None:
            return error("no such project", 404)
        return project
    choices = list(caller.upload_projects()[:2])
    if len(choices) == 1:
        return choices[0]
    if len(choices) > 1:
        return _invalid(
            "you are a member of several projects",
            {"project": ["is required: the slug of the record's project"]},
        )
    if caller.projects().exists():
        return error("you may read this project's decision records but not create them", 403)
    return error("you are not a member of any project", 403)


def _refuse_read_only(body: dict[str, Any], current: dict[str, Any] | None) -> JsonResponse | None:
    """Fields the server sets: refused when given, except unchanged (a PATCH of a record as GET gave it)."""
    fields = {
        name: [message]
        for name, message in READ_ONLY.items()
        if name in body and (current is None or body[name] != current.get(name))
    }
    if fields:
        return _invalid("some fields cannot be set", fields)
    return None


def _with_page(request: HttpRequest, page: int) -> str:
    query = request.GET.copy()
    query["page"] = str(page)
    return request.build_absolute_uri(request.path) + "?" + urlencode(sorted(query.items()))


def _positive(request: HttpRequest, name: str, default: int) -> int | None:
    raw = request.GET.get(name, "").strip()
    if not raw:
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 9 or int(raw) < 1:
        return None
    return int(raw)


def _filtered(request: HttpRequest, caller: Caller) -> QuerySet[Decision] | JsonResponse:
    found = _visible(caller)
    params = request.GET
    if params.get("project"):
        project = caller.projects().filter(Q(slug=params["project"]) | Q(name=params["project"])).first()
        if project is None:
            return error("no such project", 404)
        found = found.filter(project=project)
    if params.get("status"):
        if params["status"] not in Decision.Status.values:
            return error(f"status must be one of {', '.join(Decision.Status.values)}", 400)
        found = found.filter(status=params["status"])
    if params.get("stale"):
        value = params["stale"].lower()
        if value not in ("true", "false", "1", "0"):
            return error("stale must be true or false", 400)
        found = found.filter(stale=value in ("true", "1"))
    for param, kind in (
        ("group", DecisionLink.Kind.GROUP),
        ("signature", DecisionLink.Kind.SIGNATURE),
        ("report", DecisionLink.Kind.REPORT),
    ):
        if params.get(param):
            found = found.filter(links__kind=kind, links__target=params[param].strip().lower())
    return found.distinct()


@csrf_exempt  # session callers are CSRF-checked in authenticate(); token callers need not be
@require_http_methods(["GET", "POST"])
def decisions(request: HttpRequest) -> HttpResponse:
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    if request.method == "POST":
        return _create(request, caller)
    found = _filtered(request, caller)
    if isinstance(found, JsonResponse):
        return found
    fmt = request.GET.get("format", "")
    if fmt == "export":
        records = list(found.order_by("project__slug", "number"))
        return JsonResponse(
            {
                "decisions": [decision_json(d, request=request) for d in records],
                "count": len(records),
                "exported": timezone.now().isoformat(),
            }
        )
    if fmt:
        return error(
            "format must be 'export' (every record, for `dispatchlab match --decisions`) or absent", 400
        )
    page, limit = _positive(request, "page", 1), _positive(request, "limit", DEFAULT_LIMIT)
    if page is None:
        return error("page must be a positive integer", 400)
    if limit is None:
        return error(f"limit must be a positive integer (at most {MAX_LIMIT})", 400)
    limit = min(limit, MAX_LIMIT)
    found = found.order_by("project__slug", "-number")
    count = found.count()
    start = (page - 1) * limit
    results = [decision_json(d, request=request) for d in found[start : start + limit]]
    return JsonResponse(
        {
            "results": results,
            "count": count,
            "next": _with_page(request, page + 1) if start + limit < count else None,
            "previous": _with_page(request, page - 1) if page > 1 else None,
        }
    )


def _create(request: HttpRequest, caller: Caller) -> HttpResponse:
    if caller.token is not None and caller.token.read_only:
        return error("this token is read-only", 403)
    body = _body(request)
    if isinstance(body, JsonResponse):
        return body
    project = _pick_project(caller, body.pop("project", None))
    if isinstance(project, JsonResponse):
        return project
    refusal = _write_refusal(caller, project)
    if refusal is not None:
        return refusal
    refused = _refuse_read_only(body, None)
    if refused is not None:
        return refused
    try:
        decision = decision_create(project=project, user=caller.user, data=body)
    except DecisionInvalid as invalid:
        return _invalid("the record is not valid", invalid.message_dict)
    decision = _visible(caller).get(id=decision.id)
    return JsonResponse(decision_json(decision, request=request), status=201)


@csrf_exempt  # session callers are CSRF-checked in authenticate(); token callers need not be
@require_http_methods(["GET", "PATCH"])
def decision_detail(request: HttpRequest, decision_id: int) -> HttpResponse:
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    decision = _visible(caller).filter(id=decision_id).first()
    if decision is None:
        return error("no such decision record", 404)
    if request.method == "GET":
        return JsonResponse(decision_json(decision, request=request))
    refusal = _write_refusal(caller, decision.project)
    if refusal is not None:
        return refusal
    body = _body(request)
    if isinstance(body, JsonResponse):
        return body
    current = decision_json(decision, request=request)
    if "project" in body and body.pop("project") != current["project"]:
        return _invalid("some fields cannot be set", {"project": ["a record stays in its project"]})
    refused = _refuse_read_only(body, current)
    if refused is not None:
        return refused
    for name in READ_ONLY:
        body.pop(name, None)
    # A record as GET gave it, sent back whole: its unchanged fields are no edit.
    body = {name: value for name, value in body.items() if name not in current or value != current[name]}
    try:
        decision_update(decision=decision, user=caller.user, data=body)
    except DecisionInvalid as invalid:
        return _invalid("the record is not valid", invalid.message_dict)
    decision = _visible(caller).get(id=decision.id)
    return JsonResponse(decision_json(decision, request=request))


@require_GET
def decision_history(request: HttpRequest, decision_id: int) -> HttpResponse:
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    decision = _visible(caller).filter(id=decision_id).first()
    if decision is None:
        return error("no such decision record", 404)
    edits = DecisionEdit.objects.filter(decision=decision).select_related("user").order_by("at", "id")
    results = [edit_json(edit) for edit in edits]
    return JsonResponse(
        {"id": decision.id, "label": decision.label, "results": results, "count": len(results)}
    )
