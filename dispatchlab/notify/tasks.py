"""Celery tasks: thin wrappers taking ids; the work, the claim and the attempt records live in services.py."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from dispatchlab.reports.tasks import REDELIVERED_UNTIL_DONE

# Far above DISPATCHLAB_NOTIFY_MAX_ATTEMPTS: the delivery row counts the attempts and stops retrying;
# this only bounds a task that keeps meeting a database that is down.
RETRY_BACKSTOP = 100


# Safe to repeat: delivery_send claims the row before sending; a second message finds it claimed or
# finished.
@shared_task(name="notify.deliver", bind=True, max_retries=RETRY_BACKSTOP, **REDELIVERED_UNTIL_DONE)
def delivery_send_task(self: Any, delivery_id: int) -> str:
    from dispatchlab.notify.services import DeliveryUnavailable, delivery_send

    try:
        return delivery_send(delivery_id=int(delivery_id)).value
    except DeliveryUnavailable as unavailable:
        # A connection error, a timeout, HTTP 5xx or 429, with attempts left: the service recorded the
        # attempt and chose the (exponential, jittered) countdown.
        raise self.retry(exc=unavailable, countdown=unavailable.countdown) from None


@shared_task(name="notify.requeue_stale", acks_late=False)
def deliveries_requeue_stale_task() -> int:
    from dispatchlab.notify.services import deliveries_requeue_stale

    return deliveries_requeue_stale()
