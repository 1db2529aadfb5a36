"""The dashboard's side of the sweep's messages (dispatchlab.messaging.sweep): a thin task."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from dispatchlab.gpu.tasks import INFRASTRUCTURE
from dispatchlab.messaging.sweep import SWEEP_FINISHED_TASK, SWEEP_STARTED_TASK


@shared_task(name=SWEEP_FINISHED_TASK, autoretry_for=INFRASTRUCTURE, retry_backoff=True, max_retries=5)
def sweep_finished_task(payload: dict[str, Any]) -> None:
    from dispatchlab.gpu.sweep_services import sweep_finished

    sweep_finished(payload=payload)


@shared_task(name=SWEEP_STARTED_TASK, autoretry_for=INFRASTRUCTURE, retry_backoff=True, max_retries=5)
def sweep_started_task(payload: dict[str, Any]) -> None:
    from dispatchlab.gpu.sweep_services import sweep_started

    sweep_started(payload=payload)
