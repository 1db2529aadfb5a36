"""The backend sweep's services: create a sweep of a report's component (shapes read from its document),
queue it to `gpu.<arch>`, store the worker's answer. Thin tasks in sweep_tasks.py call these."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from dispatchlab.core.shapes import read_shapes_from_document
from dispatchlab.gpu.models import SweepRun
from dispatchlab.messaging.contract import arch_queue
from dispatchlab.messaging.sweep import COMPONENTS, SWEEP_TASK, SweepJob
from dispatchlab.reports.models import Report


class SweepRejected(ValueError):
    """The sweep cannot be asked for (unknown component, report not parsed)."""


def _send(task: str, kwargs: dict[str, Any], queue: str) -> None:
    from dispatchlab.config.celery import app

    app.send_task(task, kwargs=kwargs, queue=queue)


def sweep_create(*, report: Report, component: str, user: Any = None, tokens: int | None = None) -> SweepRun:
    if component not in COMPONENTS:
        raise SweepRejected(f"unknown component {component!r}: one of {', '.join(COMPONENTS)}")
    if report.status != Report.Status.DONE:
        raise SweepRejected("the report is not parsed yet")
    shapes = read_shapes_from_document(dict(report.document or {})).to_dict()
    arch = report.arch or ""
    sweep = SweepRun.objects.create(
        project=report.project,
        report=report,
        created_by=user if getattr(user, "is_authenticated", False) else None,
        component=component,
        arch=arch,
        queue=arch_queue(arch or None),
        shapes=shapes,
    )
    job: SweepJob = {"sweep_id": sweep.id, "component": component, "shapes": shapes, "tokens": tokens}
    transaction.on_commit(lambda: _send(SWEEP_TASK, {"job": dict(job)}, sweep.queue))
    return sweep


def sweep_finished(*, payload: dict[str, Any]) -> SweepRun | None:
    """Store the worker's answer once: a second delivery of a finished sweep changes nothing."""
    sweep_id = payload.get("sweep_id")
    if not isinstance(sweep_id, int):
        return None
    error = str(payload.get("error") or "")
    result = payload.get("result") if isinstance(payload.get("result"), dict) else {}
    updated = SweepRun.objects.filter(pk=sweep_id, status=SweepRun.Status.QUEUED).update(
        status=SweepRun.Status.FAILED if error or not result else SweepRun.Status.DONE,
        error=error[:2000],
        result=result,
        host_name=str(payload.get("host") or "")[:200],
        finished_at=timezone.now(),
    )
    del updated  # zero: already stored by an earlier delivery
    return SweepRun.objects.filter(pk=sweep_id).first()
