"""The JSON API of the GPU side (CONTRACT.md): hosts, confirm runs of a report's fixed launch, probes."""

from __future__ import annotations

import re
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse

from dispatchlab.api.auth import authenticate, caller_and_report, error, json_body
from dispatchlab.api.gpu_shapes import Confirm, ConfirmBody, ConfirmCreated, Host, HostPage, Launch
from dispatchlab.api.pagination import PageQuery, page_answer
from dispatchlab.api.schema import operation
from dispatchlab.api.shapes import Error
from dispatchlab.gpu.models import ConfirmRun, GpuHost
from dispatchlab.gpu.services import FLAT_ARGS, FLAT_ENV, ConfirmRejected, confirm_cancel, confirm_create

MAX_CONFIRM_BODY = 256 * 1024
# {"args": {"--flag": [values]}} is three levels; a deeper body is refused before it is decoded.
MAX_CONFIRM_NESTING = 3
_QUOTED = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(rb"[^\[\]{}]")


def json_nesting(raw: bytes) -> int:
    """How deep the JSON text's arrays and objects nest, without decoding it (no recursion)."""
    level = deepest = 0
    for char in _NOT_BRACKET.sub(b"", _QUOTED.sub(b'""', raw)):
        level += 1 if char in b"[{" else -1
        deepest = max(deepest, level)
    return deepest


def host_json(host: GpuHost) -> Host:
    return Host(
        name=host.name,
        alive=host.alive,
        busy=host.busy,
        last_seen=host.last_seen.isoformat(),
        first_seen=host.first_seen.isoformat(),
        arches=host.arches,
        queues=host.queues,
        gpus=host.gpus,  # type: ignore[typeddict-item]
        links=host.inventory.get("links") or [],
        driver=host.inventory.get("driver"),
        versions=host.versions,
        launchers=host.launchers,
        model_roots=host.model_roots,
    )


def _launch(confirm: ConfirmRun) -> Launch:
    return Launch(launcher=confirm.launcher, args=confirm.args, env=confirm.env)


def confirm_json(request: HttpRequest, confirm: ConfirmRun) -> Confirm:
    result = confirm.result or {}
    new_report = confirm.result_report_id
    return Confirm(
        id=confirm.id,
        status=confirm.status,  # type: ignore[typeddict-item]
        error=confirm.error or None,
        report=confirm.report_id,
        arch=confirm.arch or None,
        queue=confirm.queue,
        signature=confirm.signature_id or None,
        launch=_launch(confirm),
        argv=confirm.argv,
        host=confirm.host_name or None,
        new_report=new_report,
        new_report_url=(
            request.build_absolute_uri(reverse("front:report", args=[new_report])) if new_report else None
        ),
        ready=result.get("ready"),
        ready_by=result.get("ready_by"),
        ready_seconds=result.get("ready_seconds"),
        smoke=result.get("smoke"),
        throughput=result.get("throughput") or [],
        throughput_unit=confirm.throughput_unit,
        evidence=confirm.evidence,  # type: ignore[typeddict-item]
        evidence_label=confirm.evidence_label,
        launcher=confirm.launcher_identity,  # type: ignore[typeddict-item]
        weights=confirm.weights or None,  # type: ignore[typeddict-item]
        host_identity=result.get("host_identity") or None,
        cancel_url=(
            request.build_absolute_uri(reverse("api:confirm_cancel", args=[confirm.id]))
            if confirm.status in ConfirmRun.CANCELLABLE
            else None
        ),
        probes=result.get("probes") or [],
        created_at=confirm.created_at.isoformat(),
        started_at=confirm.started_at.isoformat() if confirm.started_at else None,
        finished_at=confirm.finished_at.isoformat() if confirm.finished_at else None,
        url=request.build_absolute_uri(reverse("front:confirm", args=[confirm.id])),
    )


@operation(
    "GET",
    "hosts_list",
    summary="GPU hosts from their heartbeats: alive or not, GPUs, versions, queues",
    description="Hosts are shared by every project. A page holds 100 hosts unless ?limit says fewer.",
    query=PageQuery,
    answers={200: (HostPage, "The hosts, by name.")},
    tags=("gpu",),
)
def hosts(request: HttpRequest, *, query: PageQuery) -> HttpResponse:
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    hosts = GpuHost.objects.order_by("name")
    return JsonResponse(HostPage(**page_answer(request, query, hosts, host_json, default_limit=100)))


def _patch(body: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfirmRejected(f"'{key}' must be an object of flag (or variable) to value")
    return value


@operation(
    "POST",
    "reports_confirm",
    summary="Queue a confirm run of the report's launch with its diagnosis's fix applied",
    description=(
        "The job waits in gpu.<arch of the report> until a GPU worker of that arch takes it. `command` "
        "replaces the launch (a command line; no shell syntax); `args` / `env` replace the fix's patch (a "
        "flag set to false is removed); `probes` names kernel probes or component:<name> to run afterwards."
    ),
    body={"application/json": ConfirmBody},
    body_required=False,
    answers={
        201: (
            ConfirmCreated,
            "Queued (status waiting_for_host while no live host of its arch exists); or, when the same "
            "launch was already waiting, that run (joined: true).",
        ),
        400: (
            Error,
            "Not queued: no launch, a launch dispatchlab does not run, or nothing to confirm (the "
            "diagnosis has no fix and the launch is unedited: run the backend sweep or edit the launch).",
        ),
        403: Error,
        404: (Error, "No such report, or not in the caller's projects."),
        413: Error,
    },
    tags=("gpu",),
)
def report_confirm(request: HttpRequest, report_id: int) -> HttpResponse:
    found = caller_and_report(request, report_id)
    if isinstance(found, JsonResponse):
        return found
    caller, report = found
    if not caller.can_write(report.project):
        return error("you may read this project's reports but not start runs", 403)
    declared = request.META.get("CONTENT_LENGTH") or "0"
    if declared.isascii() and declared.isdigit() and int(declared) <= MAX_CONFIRM_BODY:
        depth = json_nesting(request.body)
        if depth > MAX_CONFIRM_NESTING:
            return error(f"the body nests {depth} levels deep: {FLAT_ARGS}, and {FLAT_ENV}", 400)
    body = json_body(request, limit=MAX_CONFIRM_BODY)
    if isinstance(body, JsonResponse):
        return body
    try:
        command = body.get("command")
        if command is not None and not isinstance(command, str):
            raise ConfirmRejected("'command' must be a string (a command line)")
        probes = body.get("probes")
        if probes is not None and not (isinstance(probes, list) and all(isinstance(p, str) for p in probes)):
            raise ConfirmRejected("'probes' must be a list of probe names")
        confirm = confirm_create(
            report=report,
            user=caller.user,
            command=command,
            args_patch=_patch(body, "args"),
            env_patch=_patch(body, "env"),
            probes=probes,
        )
    except ConfirmRejected as rejected:
        return error(str(rejected), 400)
    answer = ConfirmCreated(
        id=confirm.id,
        status=confirm.status,  # type: ignore[typeddict-item]
        arch=confirm.arch or None,
        queue=confirm.queue,
        url=request.build_absolute_uri(reverse("front:confirm", args=[confirm.id])),
        launch=_launch(confirm),
        joined=confirm.joined,
    )
    return JsonResponse(answer, status=201)


@operation(
    "GET",
    "confirms_read",
    summary="A confirm run: status, the launch as an argument list, the new report, smoke, throughput, probes",
    answers={
        200: (Confirm, "The confirm run."),
        404: (Error, "No such confirm run, or not in the caller's projects."),
    },
    tags=("gpu",),
)
def confirm_detail(request: HttpRequest, confirm_id: int) -> HttpResponse:
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    confirm = ConfirmRun.objects.filter(id=confirm_id, project__in=caller.projects()).first()
    if confirm is None:
        return error("no such confirm run", 404)
    return JsonResponse(confirm_json(request, confirm))


@operation(
    "POST",
    "confirms_cancel",
    summary="Cancel a waiting, queued or running confirm run",
    description=(
        "The run is marked cancelled at once; the GPU worker that holds it (or takes it later) stops the "
        "launch's whole process group, or does not start it."
    ),
    answers={
        200: (Confirm, "Cancelled."),
        400: (Error, "It has already finished."),
        403: Error,
        404: (Error, "No such confirm run, or not in the caller's projects."),
    },
    tags=("gpu",),
)
def confirm_cancel_view(request: HttpRequest, confirm_id: int) -> HttpResponse:
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    confirm = ConfirmRun.objects.filter(id=confirm_id, project__in=caller.projects()).first()
    if confirm is None:
        return error("no such confirm run", 404)
    if not caller.can_write(confirm.project):
        return error("you may read this project's runs but not cancel them", 403)
    try:
        confirm = confirm_cancel(confirm=confirm, user=caller.user)
    except ConfirmRejected as rejected:
        return error(str(rejected), 400)
    return JsonResponse(confirm_json(request, confirm))
