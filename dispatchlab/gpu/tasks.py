"""The dashboard's side of the GPU worker's messages (dispatchlab.messaging.contract): thin tasks
over dispatchlab.gpu.services and dispatchlab.gpu.confirm_outcomes."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.db import InterfaceError, OperationalError

INFRASTRUCTURE = (OperationalError, InterfaceError)
# The last output pieces may still be on their way when the outcome arrives: look again this often.
OUTPUT_RECHECKS = 20


@shared_task(name="hosts.heartbeat", acks_late=False, ignore_result=True)
def host_heartbeat_task(payload: dict[str, Any]) -> None:
    from dispatchlab.gpu.services import host_heartbeat

    host_heartbeat(payload=payload)


@shared_task(name="confirms.started", autoretry_for=INFRASTRUCTURE, retry_backoff=True, max_retries=5)
def confirm_started_task(payload: dict[str, Any]) -> None:
    from dispatchlab.gpu.confirm_outcomes import confirm_started

    confirm_started(payload=payload)


@shared_task(name="confirms.output", autoretry_for=INFRASTRUCTURE, retry_backoff=True, max_retries=5)
def confirm_output_task(payload: dict[str, Any]) -> None:
    from dispatchlab.gpu.confirm_outcomes import confirm_output

    confirm_output(payload=payload)


@shared_task(
    name="confirms.finished", bind=True, autoretry_for=INFRASTRUCTURE, retry_backoff=True, max_retries=5
)
def confirm_finished_task(self: Any, payload: dict[str, Any]) -> None:
    from dispatchlab.gpu.confirm_outcomes import OutputIncomplete, confirm_finished

    last_look = self.request.retries >= OUTPUT_RECHECKS
    try:
        confirm_finished(payload=payload, allow_missing=last_look)
    except OutputIncomplete as waiting:
        raise self.retry(exc=waiting, countdown=0.5, max_retries=OUTPUT_RECHECKS + 1) from None


@shared_task(name="probes.finished", autoretry_for=INFRASTRUCTURE, retry_backoff=True, max_retries=5)
def probes_finished_task(payload: dict[str, Any]) -> None:
    from dispatchlab.gpu.services import probes_store

    probes_store(payload=payload)


from dispatchlab.gpu import sweep_tasks  # noqa: E402,F401  (registers sweeps.finished with autodiscovery)
