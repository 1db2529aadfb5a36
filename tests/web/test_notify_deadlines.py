"""Notifications: deliveries killed mid-request and the time limits the pool enforces."""

from __future__ import annotations

import socket
import threading
from datetime import timedelta
from typing import Any

import pytest

from dispatchlab.notify import delivery as sending
from dispatchlab.notify import services
from dispatchlab.notify.models import Delivery

# fixtures are found by name: imported as re-exports
from tests.web.test_notify import (
    Resolver as Resolver,
)
from tests.web.test_notify import (
    _notify_settings as _notify_settings,
)
from tests.web.test_notify import (
    core as core,
)
from tests.web.test_notify import (
    endpoint as endpoint,
)
from tests.web.test_notify import (
    enqueued as enqueued,
)
from tests.web.test_notify import (
    land as land,
)
from tests.web.test_notify import (
    receiver as receiver,
)
from tests.web.test_notify import (
    resolver as resolver,
)
from tests.web.test_notify import (
    worker as worker,
)

# ---------------------------------------------------------------- killed deliveries, time limits


def _claimed_by_a_worker_that_died(delivery: Delivery, settings: Any) -> None:
    """What a worker killed mid-request leaves: the delivery claimed for its attempt, long ago."""
    assert sending._claim(delivery.id, "dead-worker")
    long_ago = sending.timezone.now() - timedelta(seconds=sending._claim_stale_seconds() + 1)
    Delivery.objects.filter(id=delivery.id).update(claimed_at=long_ago)


def test_a_delivery_whose_worker_was_killed_mid_request_is_recorded_as_interrupted_not_sent_twice(
    acme, receiver, settings
):
    hook = endpoint(acme, receiver.url)
    delivery = services.endpoint_send_test(endpoint=hook, user=None)
    _claimed_by_a_worker_that_died(delivery, settings)
    # the message comes back (acks_late) or the sweep sends it again
    assert sending.delivery_send(delivery_id=delivery.id) == sending.SendOutcome.FAILED
    assert receiver.requests == []
    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.FAILED and delivery.attempts == 1
    assert delivery.error == sending.INTERRUPTED_ERROR
    attempt = delivery.attempt_rows.get()
    assert (attempt.number, attempt.outcome, attempt.status_code) == (1, "failed", None)
    hook.refresh_from_db()
    assert hook.consecutive_failures == 1  # counts towards pausing
    assert sending.delivery_send(delivery_id=delivery.id) == sending.SendOutcome.FINISHED


def test_a_redelivered_message_finding_a_fresh_claim_looks_again_once_it_would_be_stale(
    acme, receiver, monkeypatch
):
    from dispatchlab.notify.tasks import delivery_send_task

    hook = endpoint(acme, receiver.url)
    delivery = services.endpoint_send_test(endpoint=hook, user=None)
    assert sending._claim(delivery.id, "live-or-dead")
    asked: dict[str, Any] = {}

    def retry(**kwargs: Any) -> Exception:
        asked.update(kwargs)
        return RuntimeError("retried")

    monkeypatch.setattr(delivery_send_task, "retry", retry)
    with pytest.raises(RuntimeError, match="retried"):
        delivery_send_task.run(delivery.id)
    assert 0 < asked["countdown"] <= sending._claim_stale_seconds() + 1
    assert receiver.requests == []


def test_a_delivery_stopped_at_the_soft_time_limit_is_recorded_as_interrupted(acme, receiver, monkeypatch):
    from celery.exceptions import SoftTimeLimitExceeded

    from dispatchlab.notify.tasks import delivery_send_task

    hook = endpoint(acme, receiver.url)
    delivery = services.endpoint_send_test(endpoint=hook, user=None)

    def stuck(*args: Any, **kwargs: Any) -> None:
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(sending, "http_post", stuck)
    assert delivery_send_task.run(delivery.id) == "failed"
    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.FAILED and delivery.error == sending.INTERRUPTED_ERROR
    assert delivery.attempt_rows.get().outcome == "failed"
    hook.refresh_from_db()
    assert hook.consecutive_failures == 1


def test_deliveries_go_to_their_own_queue_with_a_hard_time_limit_the_pool_arms(settings):
    from dispatchlab.config.celery import app
    from dispatchlab.notify.tasks import delivery_send_task

    route = app.amqp.router.route({}, "notify.deliver")
    assert route["queue"].name == settings.DISPATCHLAB_NOTIFY_QUEUE != settings.CELERY_TASK_DEFAULT_QUEUE
    assert app.amqp.router.route({}, "reports.analyze")["queue"].name == settings.CELERY_TASK_DEFAULT_QUEUE
    # billiard arms the hard timer only after the soft one: a task's soft limit must come first, or
    # the parses' global soft limit (30 min) is all that is armed
    soft, hard = delivery_send_task.soft_time_limit, delivery_send_task.time_limit
    assert soft is not None and hard is not None
    assert settings.DISPATCHLAB_NOTIFY_TIMEOUT_SECONDS < soft < hard < settings.CELERY_TASK_SOFT_TIME_LIMIT


def test_a_name_server_that_never_answers_does_not_hold_the_web_request_adding_an_endpoint(
    resolver: Resolver, monkeypatch: pytest.MonkeyPatch
) -> None:
    released = threading.Event()
    answer = resolver.getaddrinfo

    def slow(host: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if str(host) == "slow.example.test":
            released.wait(10)  # a lookup the web request must not wait for; then the metadata address
            return answer("metadata.example.test", *args, **kwargs)
        return answer(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    monkeypatch.setattr(services, "ENDPOINT_LOOKUP_SECONDS", 0.2)
    # accepted like a name that does not resolve from here: every delivery resolves and checks it again
    assert services.endpoint_address_problem("http://slow.example.test/hook") is None
    released.set()
