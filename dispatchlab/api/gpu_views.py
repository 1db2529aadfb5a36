"""The JSON API of the GPU side (CONTRACT.md): hosts, confirm runs of a report's fixed launch, probes."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from dispatchlab.api.auth import authenticate, error
from dispatchlab.gpu.models import ConfirmRun, GpuHost
from dispatchlab.gpu.services import ConfirmRejected, confirm_create

MAX_CONFIRM_BODY = 256 * 1024


def host_json(host: GpuHost) -> dict[str, Any]:
    return {
        "name": host.name,
        "alive": host.alive,
        "busy": host.busy,
        "last_seen": host.last_seen.isoformat(),
        "first_seen": host.first_seen.isoformat(),
        "arches": host.arches,
        "queues": host.queues,
        "gpus": host.gpus,
        "links": host.inventory.get("links") or [],
        "driver": host.inventory.get("driver"),
        "versions": host.versions,
        "launchers": host.launchers,
        "model_roots": host.model_roots,
    }


def confirm_json(request: HttpRequest, confirm: ConfirmRun) -> dict[str, Any]:
    result = confirm.result or {}
    new_report = confirm.result_report_id
    return {
        "id": confirm.id,
        "status": confirm.status,
        "error": confirm.error or None,
        "report": confirm.report_id,
        "arch": confirm.arch or None,
        "queue": confirm.queue,
        "signature": confirm.signature_id or None,
        "launch": {"launcher": confirm.launcher, "args": confirm.args, "env": confirm.env},
        "argv": confirm.argv,
        "host": confirm.host_name or None,
        "new_report": new_report,
        "new_report_url": (
            request.build_absolute_uri(reverse("front:report", args=[new_report])) if new_report else None
        ),
        "ready": result.get("ready"),
        "ready_by": result.get("ready_by"),
        "ready_seconds": result.get("ready_seconds"),
        "smoke": result.get("smoke"),
        "throughput": result.get("throughput") or [],
        "probes": result.get("probes") or [],
        "created_at": confirm.created_at.isoformat(),
        "started_at": confirm.started_at.isoformat() if confirm.started_at else None,
        "finished_at": confirm.finished_at.isoformat() if confirm.finished_at else None,
        "url": request.build_absolute_uri(reverse("front:confirm", args=[confirm.id])),
    }


@require_GET
def hosts(request: HttpRequest) -> HttpResponse:
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    return JsonResponse({"results": [host_json(host) for host in GpuHost.objects.all()]})


def _patch(body: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfirmRejected(f"'{key}' must be an object of flag (or variable) to value")
    return value


@csrf_exempt  # session callers are CSRF-checked in authenticate(); token callers need not be
@require_POST
def report_confirm(request: HttpRequest, report_id: int) -> HttpResponse:
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    report = caller.reports().filter(id=report_id).select_related("project").first()
    if report is None:
        return error("no such report", 404)
    if not caller.can_write(report.project):
        return error("you may read this project's reports but not start runs", 403)
    if len(request.body) > MAX_CONFIRM_BODY:
        return error("the request body is too large", 413)
    try:
        body = json.loads(request.body or b"{}")
    except json.JSONDecodeError as failure:
        return error(f"the body is not JSON: {failure}", 400)
    if not isinstance(body, dict):
        return error("the body must be a JSON object", 400)
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
    answer = {
        "id": confirm.id,
        "status": confirm.status,
        "arch": confirm.arch or None,
        "queue": confirm.queue,
    }
    answer["url"] = request.build_absolute_uri(reverse("front:confirm", args=[confirm.id]))
    answer["launch"] = {"launcher": confirm.launcher, "args": confirm.args, "env": confirm.env}
    return JsonResponse(answer, status=201)


@require_GET
def confirm_detail(request: HttpRequest, confirm_id: int) -> HttpResponse:
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    confirm = ConfirmRun.objects.filter(id=confirm_id, project__in=caller.projects()).first()
    if confirm is None:
        return error("no such confirm run", 404)
    return JsonResponse(confirm_json(request, confirm))
