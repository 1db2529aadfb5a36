"""The one task every event subscriber runs as: it looks the handler up by name among this process's
subscriptions (dispatchlab.events.subscribe), so messages carry names and primitives only."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from dispatchlab.taskpolicy import RETRY_SUBSCRIBER


# Each subscriber is safe to repeat: a raise retries it alone, with backoff; the others ran by their own.
@shared_task(name="events.handle", **RETRY_SUBSCRIBER)
def event_handle_task(key: str, event_name: str, fields: dict[str, Any]) -> bool:
    from dispatchlab.events import handle

    return handle(key=key, event_name=event_name, fields=fields)
