"""What a GPU worker answers about a confirm run (`confirms.started`, `confirms.output` pieces,
`confirms.finished`) and the outcome drawn from it: the output becomes a new report parsed by the same
core, and once that is parsed (reports' ReportParsed event, dispatchlab.gpu.handlers)
`confirm_report_parsed` decides fixed / still fails / garbage, records it on the signature, and closes
the crash's failure group when the fix is confirmed."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from dispatchlab.gpu.models import (
    ConfirmOutput,
    ConfirmRun,
    GpuHost,
    SignatureConfirmation,
)
from dispatchlab.gpu.services import probes_store
from dispatchlab.reports.models import Report

logger = logging.getLogger(__name__)


def confirm_started(*, payload: dict[str, Any]) -> None:
    host = GpuHost.objects.filter(name=str(payload.get("host") or "")).first()
    ConfirmRun.objects.filter(
        id=int(payload["confirm_id"]),
        status__in=[ConfirmRun.Status.WAITING_FOR_HOST, ConfirmRun.Status.QUEUED],
    ).update(
        status=ConfirmRun.Status.RUNNING,
        started_at=timezone.now(),
        host=host,
        host_name=str(payload.get("host") or "")[:200],
        argv=[str(a) for a in payload.get("argv") or []],
    )


def confirm_output(*, payload: dict[str, Any]) -> None:
    confirm_id = int(payload["confirm_id"])
    text = str(payload.get("text") or "")
    limit = int(getattr(settings, "DISPATCHLAB_CONFIRM_MAX_OUTPUT_BYTES", 64 * 1024 * 1024))
    confirm = ConfirmRun.objects.filter(id=confirm_id).only("id", "output_bytes").first()
    if confirm is None:
        return
    if confirm.output_bytes > limit:
        text = ""  # the count still tells the report how much was dropped
    try:
        with transaction.atomic():
            ConfirmOutput.objects.create(confirm_id=confirm_id, seq=int(payload["seq"]), text=text)
            ConfirmRun.objects.filter(id=confirm_id).update(output_bytes=F("output_bytes") + len(text))
    except IntegrityError:
        pass  # a redelivered piece


class OutputIncomplete(Exception):
    """Some streamed output pieces have not been stored yet; try again shortly."""


def confirm_output_text(confirm: ConfirmRun) -> str:
    return "".join(
        ConfirmOutput.objects.filter(confirm=confirm).order_by("seq").values_list("text", flat=True)
    )


def confirm_finished(*, payload: dict[str, Any], allow_missing: bool = False) -> ConfirmRun | None:
    """Store the worker's outcome and turn the output into a new report. Raises OutputIncomplete
    while pieces the worker sent are missing (unless allow_missing)."""
    from dispatchlab.reports.submit import report_submit

    confirm = (
        ConfirmRun.objects.select_related("project", "report", "created_by")
        .filter(id=int(payload["confirm_id"]))
        .first()
    )
    if confirm is None or confirm.is_finished or confirm.result_report_id:
        return confirm
    host = GpuHost.objects.filter(name=str(payload.get("host") or "")).first()
    confirm.host = host or confirm.host
    confirm.host_name = str(payload.get("host") or confirm.host_name)[:200]
    confirm.result = {k: v for k, v in payload.items() if k != "confirm_id"}
    confirm.argv = [str(a) for a in payload.get("argv") or confirm.argv]
    if payload.get("status") in ("refused", "cancelled"):
        cancelled = payload.get("status") == "cancelled"
        confirm.status = ConfirmRun.Status.CANCELLED if cancelled else ConfirmRun.Status.REFUSED
        confirm.error = str(payload.get("error") or ("cancelled" if cancelled else "refused by the worker"))
        confirm.finished_at = timezone.now()
        confirm.save()
        return confirm
    sent = int(payload.get("output_pieces") or 0)
    stored = ConfirmOutput.objects.filter(confirm=confirm).count()
    if stored < sent and not allow_missing:
        raise OutputIncomplete(f"{stored} of {sent} output pieces stored")
    text = confirm_output_text(confirm)
    header = (
        f"# dispatchlab confirm run {confirm.id} of report {confirm.report_id} on {confirm.host_name}, "
        f"{timezone.now().isoformat(timespec='seconds')}\n"
        f"$ {' '.join(confirm.argv)}\n"
    )
    if stored < sent:
        header += f"# {sent - stored} output pieces were lost on the way\n"
    body = (header + text).encode("utf-8", errors="replace")
    name = f"confirm-{confirm.id}.log"
    with transaction.atomic():
        report, _ = report_submit(
            project=confirm.project,
            user=confirm.created_by,
            files=[ContentFile(body, name=name)],
            title=f"Confirm {confirm.id} of report {confirm.report_id}: {confirm.report.title}"[:300],
            launch_command=" ".join(confirm.argv),
        )
        confirm.result_report = report
        confirm.status = ConfirmRun.Status.PARSING
        confirm.save()
    if report.is_finished:
        confirm_report_parsed(report_id=report.id)
    probes = payload.get("probes") or []
    if probes:
        probes_store(
            payload={
                "probe_run_id": None,
                "host": confirm.host_name,
                "probes": probes,
                "inventory": payload.get("inventory") or {},
            },
            confirm=confirm,
        )
    return confirm


def _outcome(confirm: ConfirmRun, report: Report) -> tuple[str, str]:
    result = confirm.result or {}
    smoke = result.get("smoke") or {}
    garbage = smoke.get("garbage") or {}
    if not result.get("ready"):
        diagnosis = report.top_match_title or report.failure_class or "no known failure"
        how = result.get("stopped_by") or "did not become ready"
        return ConfirmRun.Status.STILL_FAILS, f"the fixed launch {how}: {diagnosis}"
    if smoke.get("error"):
        return (
            ConfirmRun.Status.STILL_FAILS,
            f"the server came up but the smoke request failed: {smoke['error']}",
        )
    if garbage.get("garbage"):
        return (
            ConfirmRun.Status.GARBAGE,
            f"the server answers garbage: {garbage.get('reason') or garbage.get('kind')}",
        )
    return ConfirmRun.Status.FIXED, ""


def confirm_report_parsed(*, report_id: int) -> ConfirmRun | None:
    """Called when a report finished parsing: if it holds a confirm's output, decide the outcome."""
    confirm = (
        ConfirmRun.objects.select_related("result_report", "report")
        .filter(result_report_id=report_id)
        .first()
    )
    if confirm is None or confirm.is_finished:
        return confirm
    report = confirm.result_report
    assert report is not None
    status, error = _outcome(confirm, report)
    result = confirm.result or {}
    gpus = (result.get("inventory") or {}).get("gpus") or []
    with transaction.atomic():
        confirm.status = status
        confirm.error = error
        confirm.finished_at = timezone.now()
        confirm.save(update_fields=["status", "error", "finished_at"])
        identity = confirm.launcher_identity
        stand_in = confirm.is_stand_in
        if confirm.signature_id:
            versions = (result.get("inventory") or {}).get("versions") or {}
            if stand_in:
                server, server_version = "", ""
            else:
                # The server as it identified itself; else what the new report's log says.
                server = str(identity.get("name") or "")
                server = server if server in ("sglang", "vllm") else report.server or ""
                server = server if server in ("sglang", "vllm") else ""
                server_version = str(identity.get("version") or "") or (
                    report.server_version or str(versions.get(server) or "")
                )
            SignatureConfirmation.objects.update_or_create(
                confirm=confirm,
                defaults={
                    "signature_id": confirm.signature_id,
                    "outcome": status,
                    "gpu_name": str(gpus[0].get("name") or "") if gpus else "",
                    "arch": str(gpus[0].get("arch") or "") if gpus else confirm.arch,
                    "server": server,
                    "server_version": server_version[:100],
                    "evidence": confirm.evidence,
                    "launcher_label": str(identity.get("label") or confirm.launcher)[:200],
                    "weights": str(confirm.weights.get("kind") or "")[:20],
                },
            )
        # A stand-in shows the kernel path works, not that the server is fixed: the group stays open.
        if status == ConfirmRun.Status.FIXED and not stand_in and confirm.report.group is not None:
            from dispatchlab.notify.models import GroupClosure
            from dispatchlab.notify.services import group_close

            # The crash's group is closed; a new report in it later means the crash came back.
            group_close(
                group=confirm.report.group,
                kind=GroupClosure.Kind.FIX_CONFIRMED,
                reason=f"fix confirmed by confirm run {confirm.id}",
            )
    return confirm


def signature_confirmations(signature_ids: list[str]) -> dict[str, list[SignatureConfirmation]]:
    found: dict[str, list[SignatureConfirmation]] = {}
    for item in SignatureConfirmation.objects.filter(signature_id__in=signature_ids).order_by("-created_at"):
        found.setdefault(item.signature_id, []).append(item)
    return found
