"""Notifications: retries, backoff, pausing and resuming an endpoint."""

from __future__ import annotations

import socket
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse

from dispatchlab.notify import delivery as sending
from dispatchlab.notify import services
from dispatchlab.notify.models import Delivery

# fixtures are found by name: imported as re-exports
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
    stale as stale,
)
from tests.web.test_notify import (
    text_of as text_of,
)
from tests.web.test_notify import (
    worker as worker,
)

# ---------------------------------------------------------------- retries, pausing


def test_a_delivery_is_retried_on_5xx_and_every_attempt_is_recorded(acme, land, receiver):
    endpoint(acme, receiver.url)
    receiver.script = [500, 503]
    land(b"one\n")
    delivery = Delivery.objects.get()
    assert delivery.status == Delivery.Status.DELIVERED and delivery.attempts == 3
    attempts = list(delivery.attempt_rows.order_by("number"))
    assert [(a.number, a.status_code, a.outcome) for a in attempts] == [
        (1, 500, "retry"),
        (2, 503, "retry"),
        (3, 200, "ok"),
    ]
    assert attempts[0].error == "HTTP 500 Internal Server Error"
    assert len({r["headers"]["X-Dispatchlab-Delivery"] for r in receiver.requests}) == 1


def test_a_4xx_is_not_retried_but_429_is(acme, land, receiver):
    hook = endpoint(acme, receiver.url)
    receiver.script = [404]
    land(b"one\n")
    delivery = Delivery.objects.get()
    assert delivery.status == Delivery.Status.FAILED and delivery.attempts == 1
    assert delivery.error == "HTTP 404 Not Found"
    hook.refresh_from_db()
    assert hook.consecutive_failures == 1 and hook.last_error == "HTTP 404 Not Found"

    receiver.script = [429]
    with_429 = services.endpoint_send_test(endpoint=hook, user=None)  # its task is not sent: no commit
    with pytest.raises(sending.DeliveryUnavailable):
        sending.delivery_send(delivery_id=with_429.id)
    assert sending.delivery_send(delivery_id=with_429.id) == sending.SendOutcome.DELIVERED
    hook.refresh_from_db()
    assert hook.consecutive_failures == 0


def test_a_connection_error_is_recorded_and_retried_until_attempts_run_out(acme, settings):
    settings.DISPATCHLAB_NOTIFY_MAX_ATTEMPTS = 2
    hook = endpoint(acme, "http://127.0.0.1:9/nobody-listens")
    delivery = services.endpoint_send_test(endpoint=hook, user=None)
    with pytest.raises(sending.DeliveryUnavailable) as unavailable:
        sending.delivery_send(delivery_id=delivery.id)
    assert unavailable.value.countdown >= 0
    assert sending.delivery_send(delivery_id=delivery.id) == sending.SendOutcome.FAILED
    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.FAILED
    assert delivery.error == "connection refused (gave up after 2 attempts)"
    assert [a.status_code for a in delivery.attempt_rows.all()] == [None, None]
    # a finished delivery is not sent twice
    assert sending.delivery_send(delivery_id=delivery.id) == sending.SendOutcome.FINISHED


def test_a_redirect_is_not_followed(acme, land, receiver):
    endpoint(acme, receiver.url)
    receiver.script = [302]
    land(b"one\n")
    assert [r["path"] for r in receiver.requests] == ["/hook"]
    delivery = Delivery.objects.get()
    assert delivery.status == Delivery.Status.FAILED and delivery.error == "HTTP 302 Found"


def test_an_endpoint_that_answers_too_late_fails_the_delivery_and_is_not_sent_again(acme, receiver, settings):
    settings.DISPATCHLAB_NOTIFY_TIMEOUT_SECONDS = 0.2
    hook = endpoint(acme, receiver.url)
    receiver.delay = 1.0
    delivery = services.endpoint_send_test(endpoint=hook, user=None)
    assert sending.delivery_send(delivery_id=delivery.id) == sending.SendOutcome.FAILED
    attempt = delivery.attempt_rows.get()
    assert attempt.status_code is None and attempt.outcome == "failed"
    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.FAILED
    # it was sent, and may have been received: sending it again could deliver it twice
    assert delivery.error == (
        "timed out after 0.2 s waiting for the answer; not sent again: the endpoint may have received it"
    )
    hook.refresh_from_db()
    assert hook.consecutive_failures == 1 and len(receiver.requests) == 1


class Dribbler:
    """A webhook on 127.0.0.1 that reads the request, then answers one byte every `every` seconds."""

    def __init__(self, every: float, total: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/slow"
        self.received = threading.Event()
        self.finished = threading.Event()  # it sent its whole answer, or the client hung up
        self.stop = threading.Event()
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

        def serve() -> None:
            connection, _ = self.listener.accept()
            with connection:
                connection.recv(65536)
                self.received.set()
                try:
                    for byte in answer[:total]:
                        if self.stop.wait(every):
                            break
                        connection.sendall(bytes([byte]))
                except OSError:
                    pass
                self.finished.set()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


def test_an_endpoint_dribbling_its_answer_is_cut_at_the_total_deadline(acme, settings):
    # one byte every 0.3 s never trips a timeout per read of 1 s: only a total deadline ends it
    settings.DISPATCHLAB_NOTIFY_TIMEOUT_SECONDS = 1.0
    dribbler = Dribbler(every=0.3, total=200)
    try:
        hook = endpoint(acme, dribbler.url)
        delivery = services.endpoint_send_test(endpoint=hook, user=None)
        assert sending.delivery_send(delivery_id=delivery.id) == sending.SendOutcome.FAILED
        assert dribbler.received.is_set() and not dribbler.finished.is_set()
        delivery.refresh_from_db()
        assert delivery.error.startswith("timed out after 1 s waiting for the answer")
        assert delivery.attempt_rows.get().outcome == "failed"
    finally:
        dribbler.close()


def test_a_connection_that_cannot_be_made_in_time_is_retried(acme, settings, monkeypatch):
    settings.DISPATCHLAB_NOTIFY_TIMEOUT_SECONDS = 0.5

    def unanswered(*args: Any, **kwargs: Any) -> socket.socket:
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", unanswered)
    hook = endpoint(acme, "http://127.0.0.1:9/hook")
    delivery = services.endpoint_send_test(endpoint=hook, user=None)
    with pytest.raises(sending.DeliveryUnavailable, match=r"timed out after 0\.5 s connecting"):
        sending.delivery_send(delivery_id=delivery.id)
    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.PENDING and delivery.attempt_rows.get().outcome == "retry"


def test_a_delivery_whose_message_was_lost_is_sent_again_by_the_sweep(acme, enqueued):
    hook = endpoint(acme)
    delivery = services.endpoint_send_test(endpoint=hook, user=None)
    assert sending.deliveries_requeue_stale() == 0
    Delivery.objects.filter(id=delivery.id).update(
        next_attempt_at=delivery.created_at - timedelta(minutes=10)
    )
    assert sending.deliveries_requeue_stale() == 1 and enqueued == [delivery.id]


def test_the_backoff_grows_exponentially_with_jitter(settings):
    settings.DISPATCHLAB_NOTIFY_RETRY_BASE_SECONDS = 4.0
    for attempt, ceiling in ((1, 4), (2, 8), (3, 16), (5, 64)):
        delays = {sending.retry_delay(attempt) for _ in range(20)}
        assert all(ceiling / 2 <= d <= ceiling for d in delays) and len(delays) > 1
    assert sending.retry_delay(1, retry_after=30) == 30


def test_five_failures_in_a_row_pause_the_endpoint_and_the_page_says_so(
    acme, alice_client, receiver, settings, django_capture_on_commit_callbacks
):
    settings.DISPATCHLAB_NOTIFY_MAX_ATTEMPTS = 2
    hook = endpoint(acme, receiver.url, events=["decision.stale"])
    receiver.default = 500
    for number in range(1, 6):
        with django_capture_on_commit_callbacks(execute=True):
            stale(acme, number)
    hook.refresh_from_db()
    assert hook.is_paused and hook.consecutive_failures == 5
    assert len(receiver.requests) == 10  # 5 deliveries, 2 attempts each
    # further events are recorded as skipped, not sent
    with django_capture_on_commit_callbacks(execute=True):
        stale(acme, 6)
    assert len(receiver.requests) == 10
    skipped = Delivery.objects.get(event__payload__decision__number=6)
    assert skipped.status == Delivery.Status.SKIPPED and skipped.attempts == 0

    page = text_of(
        alice_client.get(reverse("front:notify_endpoint", args=["acme", hook.pk])).content.decode()
    )
    since = hook.paused_at.strftime("%Y-%m-%d %H:%M")
    assert (
        f"Paused after 5 failed deliveries in a row since {since}; last error: HTTP 500 Internal Server Error."
        in page
    )
    assert "Resume" in page and "skipped" in page and "HTTP 500" in page
    listing = text_of(alice_client.get(reverse("front:notify_project", args=["acme"])).content.decode())
    assert "paused" in listing


def test_resume_sends_new_events_again(
    acme, alice_client, receiver, settings, django_capture_on_commit_callbacks
):
    hook = endpoint(acme, receiver.url, events=["decision.stale"])
    hook.paused_at, hook.paused_reason, hook.consecutive_failures = hook.created_at, "after 5 failed", 5
    hook.save()
    response = alice_client.post(reverse("front:notify_resume", args=["acme", hook.pk]))
    assert response.status_code == 302
    hook.refresh_from_db()
    assert not hook.is_paused and hook.consecutive_failures == 0
    with django_capture_on_commit_callbacks(execute=True):
        stale(acme)
    assert len(receiver.requests) == 1 and Delivery.objects.get().status == Delivery.Status.DELIVERED


def test_a_member_pauses_by_hand_and_a_test_event_still_goes_out(
    acme, alice_client, receiver, django_capture_on_commit_callbacks
):
    hook = endpoint(acme, receiver.url)
    alice_client.post(reverse("front:notify_pause", args=["acme", hook.pk]))
    hook.refresh_from_db()
    assert hook.is_paused and hook.paused_reason == "by alice"
    with django_capture_on_commit_callbacks(execute=True):
        response = alice_client.post(reverse("front:notify_test", args=["acme", hook.pk]))
    assert response.status_code == 302
    assert receiver.json()["event"] == "test" and "sent by alice" in receiver.json()["message"]
    page = text_of(
        alice_client.get(reverse("front:notify_endpoint", args=["acme", hook.pk])).content.decode()
    )
    assert "Paused by alice since" in page and "test event" in page and "HTTP 200" in page
