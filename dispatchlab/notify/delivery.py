"""Sending a delivery: `delivery_send` (the task's service, on the notify queue's own workers) claims the
attempt with a conditional UPDATE before sending, makes one HTTP attempt within
DISPATCHLAB_NOTIFY_TIMEOUT_SECONDS in all (sender.py), records it, and either finishes the delivery or
raises DeliveryUnavailable with the countdown to the next attempt, which the task retries on.

Sent at most once: an attempt is retried only when the endpoint cannot have received it (no
connection, no name, a timeout before the request was out) or said it did not take it (HTTP 5xx, 429).
Once the request went out and no answer came (a timeout, a reset), or when the worker died or hit its
time limit during the attempt (a redelivered message or the sweep finds the claim and records the
attempt as interrupted), the delivery fails without being sent again. A delivery that fails for good
counts against its endpoint; after DISPATCHLAB_NOTIFY_PAUSE_AFTER in a row the endpoint pauses itself
until a person resumes it.
"""

from __future__ import annotations

import enum
import logging
import random
import time
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from dispatchlab.notify import services
from dispatchlab.notify.models import Attempt, Delivery, Endpoint
from dispatchlab.notify.payloads import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    USER_AGENT,
    EventKind,
    render_body,
    sign,
)
from dispatchlab.notify.sender import HttpAnswer, http_post
from dispatchlab.notify.services import allowed_networks, endpoint_url_problem

logger = logging.getLogger(__name__)

# Below the broker's default visibility timeout (the task time limit + 600 s), so a retry waiting in a
# worker is not handed out a second time.
MAX_RETRY_DELAY_SECONDS = 1800.0
# A pending delivery this long past its due time has lost its message: the sweep sends it again.
SWEEP_GRACE_SECONDS = 120


class SendOutcome(enum.StrEnum):
    DELIVERED = "delivered"
    FAILED = "failed"
    SKIPPED = "skipped"  # the endpoint is paused
    FINISHED = "finished"  # already delivered, failed or skipped: nothing to do
    LOST = "lost"  # our claim was recorded as interrupted while we sent (we outlived the stale time)
    MISSING = "missing"  # the delivery (or its endpoint) was deleted


INTERRUPTED_ERROR = (
    "interrupted: the worker stopped during the attempt (killed, or past its time limit); "
    "not sent again: the endpoint may have received it"
)
MAYBE_RECEIVED = "not sent again: the endpoint may have received it"


class DeliveryUnavailable(Exception):
    """The endpoint could not take the delivery now (connection error, timeout, HTTP 5xx or 429) and
    attempts are left. The attempt is recorded; the task retries after `countdown` seconds."""

    def __init__(self, message: str, *, countdown: float) -> None:
        super().__init__(message)
        self.countdown = countdown


class DeliveryBusy(DeliveryUnavailable):
    """Another worker claimed the attempt not long ago: it may still be sending. Look again once the
    claim would be stale (a worker past its hard time limit is dead by then)."""


# ---------------------------------------------------------------- sending


def retry_delay(attempt: int, *, retry_after: float | None = None) -> float:
    """Seconds before attempt `attempt + 1`: exponential from DISPATCHLAB_NOTIFY_RETRY_BASE_SECONDS, with
    jitter (half of it random, so endpoints that failed together do not retry together), at least what
    a 429's Retry-After asked for."""
    ceiling = min(
        MAX_RETRY_DELAY_SECONDS, settings.DISPATCHLAB_NOTIFY_RETRY_BASE_SECONDS * 2 ** (attempt - 1)
    )
    delay = ceiling / 2 + random.uniform(0, ceiling / 2)
    if retry_after is not None:
        delay = max(delay, min(retry_after, MAX_RETRY_DELAY_SECONDS))
    return delay


def _claim_stale_seconds() -> float:
    # Past the task's hard time limit the pool has killed whoever held the claim.
    return settings.DISPATCHLAB_NOTIFY_TASK_TIME_LIMIT + 15


def _claim(delivery_id: int, token: str) -> bool:
    """Claim the next attempt before sending it: a message delivered twice, or again after its worker
    died, finds the delivery sending and does not send it blindly."""
    claimed = Delivery.objects.filter(status=Delivery.Status.PENDING, id=delivery_id).update(
        status=Delivery.Status.SENDING,
        claimed_at=timezone.now(),
        claim_token=token,
        attempts=F("attempts") + 1,
    )
    return claimed == 1


def _finish(delivery_id: int, token: str, **fields: Any) -> bool:
    return Delivery.objects.filter(id=delivery_id, claim_token=token).update(**fields) == 1


def _endpoint_succeeded(endpoint_id: int) -> None:
    Endpoint.objects.filter(id=endpoint_id).update(consecutive_failures=0, last_success_at=timezone.now())


def _endpoint_failed(endpoint_id: int, error: str) -> None:
    """One more failed delivery in a row; the one that reaches the limit pauses the endpoint."""
    now = timezone.now()
    limit = settings.DISPATCHLAB_NOTIFY_PAUSE_AFTER
    with transaction.atomic():
        Endpoint.objects.filter(id=endpoint_id).update(
            consecutive_failures=F("consecutive_failures") + 1, last_error=error, last_failure_at=now
        )
        paused = Endpoint.objects.filter(
            id=endpoint_id, paused_at__isnull=True, consecutive_failures__gte=limit
        ).update(paused_at=now, paused_reason=f"after {limit} failed deliveries in a row")
    if paused:
        logger.warning(
            "endpoint %s paused after %d failed deliveries in a row: %s", endpoint_id, limit, error
        )


def delivery_send(*, delivery_id: int) -> SendOutcome:
    """Claim the delivery and make one attempt. Raises DeliveryUnavailable when the endpoint could not
    take it now and attempts are left (the attempt is recorded first), DeliveryBusy when another worker
    claimed an attempt that is not stale yet. A stale claim is the attempt of a worker that died: it is
    recorded as interrupted, not sent again."""
    token = uuid.uuid4().hex
    if not _claim(delivery_id, token):
        row = Delivery.objects.filter(id=delivery_id).values("status", "claimed_at", "claim_token").first()
        if row is None:
            return SendOutcome.MISSING
        if row["status"] != Delivery.Status.SENDING:
            return SendOutcome.FINISHED
        stale_at = (row["claimed_at"] or timezone.now()) + timedelta(seconds=_claim_stale_seconds())
        if stale_at <= timezone.now():
            return delivery_record_interrupted(delivery_id=delivery_id, claim_token=row["claim_token"])
        countdown = (stale_at - timezone.now()).total_seconds() + 1
        raise DeliveryBusy(f"delivery {delivery_id}: an attempt is in flight", countdown=countdown)
    delivery = Delivery.objects.select_related("endpoint", "event").filter(id=delivery_id).first()
    if delivery is None:  # the endpoint was deleted meanwhile
        return SendOutcome.MISSING
    endpoint, event = delivery.endpoint, delivery.event
    now = timezone.now()
    if endpoint.is_paused and event.kind != EventKind.TEST:
        _finish(
            delivery_id,
            token,
            status=Delivery.Status.SKIPPED,
            attempts=F("attempts") - 1,
            finished_at=now,
            error=f"not sent: the endpoint was paused ({endpoint.paused_reason})",
        )
        return SendOutcome.SKIPPED

    number = delivery.attempts
    problem = endpoint_url_problem(endpoint.url)
    if problem:  # the row was changed behind the form's back
        answer = HttpAnswer(None, f"refused: {problem}", 0.0, refused=True)
    else:
        body = render_body(endpoint.kind, event.payload)
        timestamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            EVENT_HEADER: event.kind,
            DELIVERY_HEADER: str(delivery.uuid),
            TIMESTAMP_HEADER: str(timestamp),
            SIGNATURE_HEADER: sign(endpoint.secret, timestamp, body),
        }
        answer = http_post(
            endpoint.url,
            body,
            headers,
            timeout=settings.DISPATCHLAB_NOTIFY_TIMEOUT_SECONDS,
            allowed=allowed_networks(),
        )

    ok = answer.status is not None and 200 <= answer.status < 300
    if answer.status is None:
        # without an answer, only a request that never went out is safe to send again
        retryable = not answer.refused and not answer.sent
    else:
        retryable = answer.status >= 500 or answer.status == 429
    last = number >= settings.DISPATCHLAB_NOTIFY_MAX_ATTEMPTS
    error = answer.error
    if ok:
        outcome = Attempt.Outcome.OK
    elif retryable and not last:
        outcome = Attempt.Outcome.RETRY
    else:
        outcome = Attempt.Outcome.FAILED
        if answer.status is None and answer.sent:
            error = f"{answer.error}; {MAYBE_RECEIVED}"
        elif retryable:
            error = f"{answer.error} (gave up after {number} attempts)"
    finished = timezone.now()
    delay = 0.0
    if outcome == Attempt.Outcome.OK:
        fields: dict[str, Any] = {"status": Delivery.Status.DELIVERED, "finished_at": finished, "error": ""}
    elif outcome == Attempt.Outcome.RETRY:
        delay = retry_delay(number, retry_after=answer.retry_after)
        fields = {
            "status": Delivery.Status.PENDING,
            "next_attempt_at": finished + timedelta(seconds=delay),
            "error": error,
        }
    else:
        fields = {"status": Delivery.Status.FAILED, "finished_at": finished, "error": error}
    try:
        # The attempt and the delivery's new state together: a worker dying between them would leave an
        # attempt recorded twice, or a delivered one recorded as interrupted.
        with transaction.atomic():
            Attempt.objects.create(
                delivery_id=delivery_id,
                number=number,
                started_at=now,
                duration_ms=round(answer.seconds * 1000),
                status_code=answer.status,
                error=error[:500],
                outcome=outcome,
            )
            if not _finish(delivery_id, token, **fields):
                raise _ClaimLost
    except IntegrityError:  # the endpoint, and so the delivery, was deleted while we sent
        return SendOutcome.MISSING
    except _ClaimLost:
        return SendOutcome.LOST
    if outcome == Attempt.Outcome.OK:
        _endpoint_succeeded(endpoint.id)
        return SendOutcome.DELIVERED
    if outcome == Attempt.Outcome.RETRY:
        raise DeliveryUnavailable(f"delivery {delivery_id}: {answer.error}", countdown=delay)
    _endpoint_failed(endpoint.id, answer.error)
    return SendOutcome.FAILED


class _ClaimLost(Exception):
    pass


def delivery_record_interrupted(*, delivery_id: int, claim_token: str | None = None) -> SendOutcome:
    """Record the attempt in flight (under `claim_token`, or whichever claim) as interrupted and fail
    the delivery without sending it again: its worker died or passed its time limit mid-request, so the
    endpoint may have received it. Counts against the endpoint like any failed delivery."""
    now = timezone.now()
    claimed = Delivery.objects.filter(id=delivery_id, status=Delivery.Status.SENDING)
    if claim_token is not None:
        claimed = claimed.filter(claim_token=claim_token)
    with transaction.atomic():
        delivery = claimed.select_for_update().first()
        if delivery is None:
            return SendOutcome.FINISHED
        started = delivery.claimed_at or now
        Attempt.objects.get_or_create(
            delivery_id=delivery_id,
            number=delivery.attempts,
            defaults={
                "started_at": started,
                "duration_ms": 0,
                "error": INTERRUPTED_ERROR,
                "outcome": Attempt.Outcome.FAILED,
            },
        )
        Delivery.objects.filter(id=delivery_id).update(
            status=Delivery.Status.FAILED, finished_at=now, error=INTERRUPTED_ERROR
        )
    logger.warning("delivery %s: %s", delivery_id, INTERRUPTED_ERROR)
    _endpoint_failed(delivery.endpoint_id, INTERRUPTED_ERROR)
    return SendOutcome.FAILED


def deliveries_requeue_stale() -> int:
    """Send the task again for deliveries a broker may have lost: pending well past their due time, or
    sending under a stale claim. The claim makes a duplicate harmless."""
    now = timezone.now()
    stuck = Delivery.objects.filter(
        Q(status=Delivery.Status.PENDING, next_attempt_at__lt=now - timedelta(seconds=SWEEP_GRACE_SECONDS))
        | Q(status=Delivery.Status.SENDING, claimed_at__lt=now - timedelta(seconds=_claim_stale_seconds()))
    ).values_list("id", flat=True)
    count = 0
    for delivery_id in list(stuck[:1000]):
        Delivery.objects.filter(id=delivery_id, status=Delivery.Status.PENDING).update(next_attempt_at=now)
        services._enqueue(delivery_id)
        count += 1
    if count:
        logger.info("re-enqueued %d stale deliveries", count)
    return count
