"""Who is calling the API: a Bearer token (hashed at rest) or a logged-in session."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet
from django.http import HttpRequest, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware

from dispatchlab.reports.accounts import TokenRefused, apitoken_verify
from dispatchlab.reports.models import ApiToken, Membership, Project, Report
from dispatchlab.reports.selectors import (
    project_named,
    projects_of,
    projects_uploadable_by,
    report_hidden_from,
    reports_visible_to,
)


@dataclass(frozen=True)
class Caller:
    user: AbstractBaseUser
    token: ApiToken | None  # None for a session

    @property
    def read_only(self) -> bool:
        """A read-only token: it may read, never change anything."""
        return self.token is not None and self.token.read_only

    def projects(self) -> QuerySet[Project]:
        if self.token is not None:
            return Project.objects.filter(id=self.token.project_id)
        return projects_of(self.user)

    def upload_projects(self) -> QuerySet[Project]:
        """The projects this caller may upload to (a member's, never a viewer's)."""
        if self.token is not None:
            if self.read_only:
                return Project.objects.none()
            return projects_uploadable_by(self.user).filter(id=self.token.project_id)
        return projects_uploadable_by(self.user)

    def reports(self) -> QuerySet[Report]:
        reports = reports_visible_to(self.user)
        if self.token is not None:
            reports = reports.filter(project_id=self.token.project_id)
        return reports

    def can_write(self, project: Project) -> bool:
        if self.token is not None and (self.token.read_only or self.token.project_id != project.id):
            return False
        return Membership.objects.filter(
            user=self.user, project=project, role=Membership.Role.MEMBER
        ).exists()


def error(message: str, status: int, **headers: str) -> JsonResponse:
    response = JsonResponse({"error": message}, status=status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def json_body(request: HttpRequest, *, limit: int, what: str = "") -> dict[str, Any] | JsonResponse:
    """The body as a JSON object (an empty body is {}), or the error to answer: 413 past `limit` bytes
    (by the declared length, before reading), 400 for what is not a JSON object."""
    declared = request.META.get("CONTENT_LENGTH") or "0"
    if not (declared.isascii() and declared.isdigit()):
        return error("Content-Length must be a number of bytes", 400)
    if int(declared) > limit or len(request.body) > limit:
        return error(f"the request body is larger than {limit:,} bytes", 413)
    try:
        body = json.loads(request.body or b"{}")
    except (ValueError, RecursionError) as failure:  # not JSON, not UTF-8, or nested past reading
        return error(f"the body is not JSON: {failure}", 400)
    if not isinstance(body, dict):
        return error(f"the body must be a JSON object{what}", 400)
    return body


def _csrf_failure(request: HttpRequest) -> JsonResponse | None:
    """Session callers must send the CSRF token like the pages do; token callers need not."""

    def no_view(request: HttpRequest) -> None:
        return None

    check = CsrfViewMiddleware(no_view)  # type: ignore[arg-type]
    check.process_request(request)
    rejected = check.process_view(request, no_view, (), {})
    if rejected is not None:
        return error("CSRF check failed; send the X-CSRFToken header or use a Bearer token", 403)
    return None


def authenticate(request: HttpRequest) -> Caller | JsonResponse:
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return error("use 'Authorization: Bearer <token>'", 401, WWW_Authenticate="Bearer")
        try:
            token = apitoken_verify(key=key.strip())
        except TokenRefused as refused:
            return error(str(refused), 401, WWW_Authenticate="Bearer")
        return Caller(user=token.user, token=token)
    if request.user.is_authenticated:
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            failure = _csrf_failure(request)
            if failure is not None:
                return failure
        return Caller(user=request.user, token=None)  # type: ignore[arg-type]
    return error(
        "authentication required: send 'Authorization: Bearer <token>'", 401, WWW_Authenticate="Bearer"
    )


def caller_and_report(request: HttpRequest, report_id: int) -> tuple[Caller, Report] | JsonResponse:
    """The caller and the report it asks for, or the answer: 401 for no caller, 404 for a report that is
    not among the caller's: "no such report", or, for another project's, which project (its name only,
    so the caller knows whom to ask; nothing of the report)."""
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    report = caller.reports().filter(id=report_id).first()
    if report is None:
        return error(_why_hidden(caller, report_id), 404)
    return caller, report


def _why_hidden(caller: Caller, report_id: int) -> str:
    hidden = report_hidden_from(caller.user, report_id)
    if hidden is None:
        return "no such report"
    if caller.token is not None:
        name = reports_visible_to(caller.user).filter(id=report_id).values_list("project__name", flat=True)
        if name:  # the user's own project, but not this token's
            return f"report {report_id} is in project {name[0]}; this token is for project {caller.token.project.name}"
    return hidden


def pick_project(
    caller: Caller, requested: str, *, several: JsonResponse, reader: str, by_id: bool = False
) -> Project | JsonResponse:
    """The project a write goes to: the one named (by slug or name, or by id when `by_id`) among the
    caller's, else 404; unnamed, the one project the caller can write to, else `several` when it can
    write to more than one, 403 with `reader` when it only reads, 403 when it is in none."""
    if requested:
        project = project_named(caller.projects(), requested, by_id=by_id)
        return project if project is not None else error("no such project", 404)
    # Unnamed, the project is the one the caller can write to; projects it only reads don't count.
    choices = list(caller.upload_projects()[:2])
    if len(choices) == 1:
        return choices[0]
    if choices:
        return several
    if caller.projects().exists():
        return error(reader, 403)
    return error("you are not a member of any project", 403)
