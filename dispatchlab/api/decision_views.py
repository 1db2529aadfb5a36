"""The JSON API of decision records (CONTRACT.md): list, create, read, update, history, export.

Reading needs any role in the record's project; creating and editing a member (not a viewer, not a
read-only token). Another project's record is a 404. A refused field comes back by name:
`{"error": "...", "fields": {"revisit_when.flashinfer": ["'>=0.7a' is not a PEP 440 specifier ..."]}}`.

`GET /api/v1/decisions?format=export` answers `{"decisions": [...]}`, every visible record (filters
apply, no pages), which `dispatchlab match LOG --decisions FILE` reads.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone

from dispatchlab.api.auth import Caller, authenticate, error, json_body, pick_project
from dispatchlab.api.decision_shapes import (
    Decision as DecisionShape,
)
from dispatchlab.api.decision_shapes import (
    DecisionCreate,
    DecisionExport,
    DecisionFields,
    DecisionHistory,
    DecisionListQuery,
    DecisionPage,
    decision_json,
    edit_json,
)
from dispatchlab.api.pagination import page_answer
from dispatchlab.api.schema import operation, route
from dispatchlab.api.shapes import Error, Invalid
from dispatchlab.decisions.models import Decision, DecisionEdit, DecisionLink
from dispatchlab.decisions.services import decision_create
from dispatchlab.decisions.services import decision_update as update
from dispatchlab.decisions.validation import DecisionInvalid
from dispatchlab.reports.models import Project
from dispatchlab.reports.selectors import project_named

MAX_BODY = 1024 * 1024
NOT_FOUND = (Error, "No such record, or not in the caller's projects.")
REFUSED = (Error, "A read-only token, a viewer, or a failed CSRF check.")
NOT_VALID = (Invalid, "The record is not valid; `fields` says what, by field.")
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
    if caller.read_only:
        return error("this token is read-only", 403)
    return error("you may read this project's decision records but not change them (viewer role)", 403)


def _body(request: HttpRequest) -> dict[str, Any] | JsonResponse:
    return json_body(request, limit=MAX_BODY, what=" (a decision record's fields)")


def _pick_project(caller: Caller, requested: Any) -> Project | JsonResponse:
    if requested is not None and not isinstance(requested, str):
        return _invalid("the record is not valid", {"project": ["must be a project's slug"]})
    return pick_project(
        caller,
        requested or "",
        several=_invalid(
            "you are a member of several projects",
            {"project": ["is required: the slug of the record's project"]},
        ),
        reader="you may read this project's decision records but not create them",
    )


def _caller_and_decision(request: HttpRequest, decision_id: int) -> tuple[Caller, Decision] | JsonResponse:
    """The caller and the record it asks for, or the answer: 401 for no caller, 404 for a record that is
    not in the caller's projects."""
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    decision = _visible(caller).filter(id=decision_id).first()
    if decision is None:
        return error("no such decision record", 404)
    return caller, decision


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


def _filtered(caller: Caller, query: DecisionListQuery) -> QuerySet[Decision] | JsonResponse:
    found = _visible(caller)
    if query.get("project"):
        project = project_named(caller.projects(), query["project"])
        if project is None:
            return error("no such project", 404)
        found = found.filter(project=project)
    if query.get("status"):
        found = found.filter(status=query["status"])
    if "stale" in query:
        found = found.filter(stale=query["stale"])
    for param, kind in (
        ("group", DecisionLink.Kind.GROUP),
        ("signature", DecisionLink.Kind.SIGNATURE),
        ("report", DecisionLink.Kind.REPORT),
    ):
        if param in query:
            found = found.filter(links__kind=kind, links__target=str(query[param]).strip().lower())  # type: ignore[literal-required]
    return found.distinct()


@operation(
    "GET",
    "decisions_list",
    summary="Decision records of the caller's projects, by project and newest first, a page at a time",
    description=(
        'With ?format=export: every matching record as `{"decisions": [...]}`, no pages; the file '
        "`dispatchlab match LOG --decisions FILE` reads."
    ),
    query=DecisionListQuery,
    answers={
        200: (DecisionPage | DecisionExport, "A page of records (or, with ?format=export, all of them)."),
        404: (Error, "No such project among the caller's."),
    },
    tags=("decisions",),
)
def decisions_list(request: HttpRequest, *, query: DecisionListQuery) -> HttpResponse:
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    found = _filtered(caller, query)
    if isinstance(found, JsonResponse):
        return found
    if query.get("format") == "export":
        records = [decision_json(d, request=request) for d in found.order_by("project__slug", "number")]
        return JsonResponse(
            DecisionExport(decisions=records, count=len(records), exported=timezone.now().isoformat())
        )
    ordered = found.order_by("project__slug", "-number")
    return JsonResponse(
        DecisionPage(**page_answer(request, query, ordered, lambda d: decision_json(d, request=request)))
    )


@operation(
    "POST",
    "decisions_create",
    summary="Record a decision (members only); `project` is needed by a member of several projects",
    body={"application/json": DecisionCreate},
    answers={
        201: (DecisionShape, "Created."),
        400: NOT_VALID,
        403: REFUSED,
        404: (Error, "No such project among the caller's."),
        413: Error,
    },
    tags=("decisions",),
)
def decisions_create(request: HttpRequest) -> HttpResponse:
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    if caller.read_only:
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


decisions = route(decisions_list, decisions_create)


@operation(
    "GET",
    "decisions_read",
    summary="A decision record",
    answers={200: (DecisionShape, "The record."), 404: NOT_FOUND},
    tags=("decisions",),
)
def decision_read(request: HttpRequest, decision_id: int) -> HttpResponse:
    found = _caller_and_decision(request, decision_id)
    if isinstance(found, JsonResponse):
        return found
    return JsonResponse(decision_json(found[1], request=request))


@operation(
    "PATCH",
    "decisions_update",
    summary="Change some fields (members only); each change is kept in the history",
    description=(
        "Fields not sent stay as they are; in `links`, kinds not sent stay too. Fields the server sets "
        "(id, number, stale, ...) may be sent back unchanged."
    ),
    body={"application/json": DecisionFields},
    answers={
        200: (DecisionShape, "The record after the change."),
        400: NOT_VALID,
        403: REFUSED,
        404: NOT_FOUND,
        413: Error,
    },
    tags=("decisions",),
)
def decision_update(request: HttpRequest, decision_id: int) -> HttpResponse:
    found = _caller_and_decision(request, decision_id)
    if isinstance(found, JsonResponse):
        return found
    caller, decision = found
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
        update(decision=decision, user=caller.user, data=body)
    except DecisionInvalid as invalid:
        return _invalid("the record is not valid", invalid.message_dict)
    decision = _visible(caller).get(id=decision.id)
    return JsonResponse(decision_json(decision, request=request))


decision_detail = route(decision_read, decision_update)


@operation(
    "GET",
    "decisions_history",
    summary="Every change of a record, oldest first: who, when, each field from what to what",
    answers={200: (DecisionHistory, "The history."), 404: NOT_FOUND},
    tags=("decisions",),
)
def decision_history(request: HttpRequest, decision_id: int) -> HttpResponse:
    found = _caller_and_decision(request, decision_id)
    if isinstance(found, JsonResponse):
        return found
    decision = found[1]
    edits = DecisionEdit.objects.filter(decision=decision).select_related("user").order_by("at", "id")
    results = [edit_json(edit) for edit in edits]
    return JsonResponse(
        DecisionHistory(id=decision.id, label=decision.label, results=results, count=len(results))
    )
