"""Celery tasks: thin wrappers taking ids; the work, the claim and the attempt records live in delivery.py."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings

from dispatchlab.taskpolicy import REDELIVERED_UNTIL_DONE

# Far above DISPATCHLAB_NOTIFY_MAX_ATTEMPTS: the delivery row counts the attempts and stops retrying;
# this only bounds a task that keeps meeting a database that is down.
RETRY_BACKSTOP = 100


# Safe to repeat: delivery_send claims the attempt before sending; a second message finds it claimed
# (and looks again once the claim is stale) or finished. The soft limit comes before the hard one, or
# billiard arms only the soft timer (the parses' global one) and nothing stops a stuck attempt.
@shared_task(
    name="notify.deliver",
    bind=True,
    max_retries=RETRY_BACKSTOP,
    soft_time_limit=settings.DISPATCHLAB_NOTIFY_TASK_SOFT_TIME_LIMIT,
    time_limit=settings.DISPATCHLAB_NOTIFY_TASK_TIME_LIMIT,
    **REDELIVERED_UNTIL_DONE,
)
def delivery_send_task(self: Any, delivery_id: int) -> str:
    from celery.exceptions import SoftTimeLimitExceeded

    from dispatchlab.notify.delivery import DeliveryUnavailable, delivery_record_interrupted, delivery_send

    try:
        return delivery_send(delivery_id=int(delivery_id)).value
    except DeliveryUnavailable as unavailable:
        # A connection error before sending, HTTP 5xx or 429, with attempts left, or another worker's
        # claim that is not stale yet: the service chose the countdown.
        raise self.retry(exc=unavailable, countdown=unavailable.countdown) from None
    except SoftTimeLimitExceeded:
        # The attempt outlived its own deadline: the request may be out, so it is not sent again.
        return delivery_record_interrupted(delivery_id=int(delivery_id)).value


@shared_task(name="notify.requeue_stale", acks_late=False)
def deliveries_requeue_stale_task() -> int:
    from dispatchlab.notify.delivery import deliveries_requeue_stale

    return deliveries_requeue_stale()
