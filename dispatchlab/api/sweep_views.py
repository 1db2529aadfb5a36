"""The JSON API of the backend sweep (CONTRACT.md): ask for a sweep of a report's component, read one.
Authorized as confirm runs are: members start, viewers read, another project's is a 404."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse

from dispatchlab.api.auth import authenticate, caller_and_report, error, json_body
from dispatchlab.api.gpu_shapes import Sweep, SweepBody, SweepCreated
from dispatchlab.api.schema import operation
from dispatchlab.api.shapes import Error
from dispatchlab.gpu.models import SweepRun
from dispatchlab.gpu.sweep_services import SweepRejected, sweep_component_for, sweep_create

MAX_SWEEP_BODY = 4 * 1024


def sweep_json(request: HttpRequest, sweep: SweepRun) -> Sweep:
    return Sweep(
        id=sweep.id,
        status=sweep.status,  # type: ignore[typeddict-item]
        error=sweep.error or None,
        report=sweep.report_id,
        component=sweep.component,  # type: ignore[typeddict-item]
        arch=sweep.arch or None,
        queue=sweep.queue,
        host=sweep.host_name or None,
        shapes=sweep.shapes or {},
        result=sweep.result or None,
        proposed_fix=sweep.proposed_fix,
        created_at=sweep.created_at.isoformat(),
        started_at=sweep.started_at.isoformat() if sweep.started_at else None,
        finished_at=sweep.finished_at.isoformat() if sweep.finished_at else None,
        url=request.build_absolute_uri(reverse("front:sweep", args=[sweep.id])),
    )


@operation(
    "POST",
    "reports_sweep",
    summary="Queue a backend sweep of the component the report's crash names (or the one given)",
    description=(
        "The job waits in gpu.<arch of the report> until a GPU worker of that arch takes it; the worker "
        "runs every installed backend of the component at the model's shapes read from the report, checks "
        "and times each, and proposes the fastest correct one as the server's flag."
    ),
    body={"application/json": SweepBody},
    body_required=False,
    answers={
        201: (SweepCreated, "Queued."),
        400: Error,
        403: Error,
        404: (Error, "No such report, or not in the caller's projects."),
        413: Error,
    },
    tags=("gpu",),
)
def report_sweep(request: HttpRequest, report_id: int) -> HttpResponse:
    found = caller_and_report(request, report_id)
    if isinstance(found, JsonResponse):
        return found
    caller, report = found
    if not caller.can_write(report.project):
        return error("you may read this project's reports but not start runs", 403)
    body = json_body(request, limit=MAX_SWEEP_BODY)
    if isinstance(body, JsonResponse):
        return body
    component = body.get("component")
    if component is None:
        component = sweep_component_for(dict(report.document or {})).component
    if not isinstance(component, str):
        return error("'component' must be a string: moe, attention, gemm or sampling", 400)
    try:
        sweep = sweep_create(report=report, component=component, user=caller.user)
    except SweepRejected as rejected:
        return error(str(rejected), 400)
    answer = SweepCreated(
        id=sweep.id,
        status=sweep.status,  # type: ignore[typeddict-item]
        arch=sweep.arch or None,
        queue=sweep.queue,
        component=sweep.component,  # type: ignore[typeddict-item]
        url=request.build_absolute_uri(reverse("front:sweep", args=[sweep.id])),
    )
    return JsonResponse(answer, status=201)


@operation(
    "GET",
    "sweeps_read",
    summary="A backend sweep: status, the shapes and where each came from, the ranked candidates, the fix",
    answers={
        200: (Sweep, "The sweep."),
        404: (Error, "No such sweep, or not in the caller's projects."),
    },
    tags=("gpu",),
)
def sweep_detail(request: HttpRequest, sweep_id: int) -> HttpResponse:
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    sweep = SweepRun.objects.filter(id=sweep_id, project__in=caller.projects()).first()
    if sweep is None:
        return error("no such sweep", 404)
    return JsonResponse(sweep_json(request, sweep))
