"""The Celery policy every app's tasks share: which failures are retried, and which messages come again
after a killed worker. A lower module, so no app imports another app's tasks for it."""

from __future__ import annotations

from typing import Any

from django.db import InterfaceError, OperationalError

# Retried only on infrastructure errors, with jittered exponential backoff: a bad input is a stored
# failure, not a retry.
RETRY_INFRASTRUCTURE: dict[str, Any] = {
    "autoretry_for": (OperationalError, InterfaceError),
    "retry_backoff": True,
    "retry_jitter": True,
}
# For a task that is safe to repeat: acknowledged once it ran, so a killed worker's message comes again.
REDELIVERED_UNTIL_DONE: dict[str, Any] = {
    "acks_late": True,
    "reject_on_worker_lost": True,
    **RETRY_INFRASTRUCTURE,
}
# For an event's subscriber (dispatchlab.events): any exception is retried, with backoff, a few times;
# the subscriber is safe to repeat, so a killed worker's message comes again too.
SUBSCRIBER_RETRIES = 5
RETRY_SUBSCRIBER: dict[str, Any] = {
    "acks_late": True,
    "reject_on_worker_lost": True,
    "autoretry_for": (Exception,),
    "retry_backoff": True,
    "retry_backoff_max": 300,
    "retry_jitter": True,
    "max_retries": SUBSCRIBER_RETRIES,
}
