"""Celery tasks: thin wrappers taking ids and JSON primitives; the work lives in services.py."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from dispatchlab.taskpolicy import RETRY_INFRASTRUCTURE


# Safe to repeat: it rewrites the documents from the records as they are now.
@shared_task(name="decisions.refresh", acks_late=True, max_retries=5, **RETRY_INFRASTRUCTURE)
def decision_refresh_task(
    decision_id: int, previous: dict[str, list[Any]] | None = None, check_versions: bool = False
) -> int:
    from dispatchlab.decisions.services import decision_refresh

    return decision_refresh(
        decision_id=int(decision_id), previous=previous, check_versions=bool(check_versions)
    )
