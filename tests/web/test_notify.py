"""Notifications out, as alice (member of acme), bob (acme viewer) and charlie (umbrella only) meet them:
events from parsed reports, confirm runs and decisions, deliveries to a real local HTTP server, pausing
and resuming, and the pages."""

from __future__ import annotations

import hashlib
import hmac
import html
import ipaddress
import json
import re
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import reverse

import dispatchlab.core
from dispatchlab.core.lineindex import write_line_index
from dispatchlab.gpu.confirm_outcomes import confirm_report_parsed
from dispatchlab.gpu.models import ConfirmRun
from dispatchlab.notify import delivery as sending
from dispatchlab.notify import services
from dispatchlab.notify.models import Attempt, Delivery, Endpoint, Event, GroupClosure
from dispatchlab.notify.payloads import EventKind, verify
from dispatchlab.reports.analysis import report_analyze
from dispatchlab.reports.models import FailureGroup, Report
from dispatchlab.reports.submit import report_submit

# ---------------------------------------------------------------- helpers


class Receiver:
    """A webhook on 127.0.0.1: records what it is sent, answers the scripted statuses, then `default`."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.script: list[int] = []
        self.default = 200
        self.delay = 0.0  # seconds before answering
        self.body = b""  # the answer's body, when not the default one
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                status = receiver.script.pop(0) if receiver.script else receiver.default
                answer = receiver.body or (b"ok" if status < 300 else b"upstream unavailable")
                time.sleep(receiver.delay)
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", receiver.url + "/elsewhere")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def json(self, index: int = -1) -> dict[str, Any]:
        return json.loads(self.requests[index]["body"])


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture(autouse=True)
def _notify_settings(settings: Any) -> None:
    settings.DISPATCHLAB_NOTIFY_BASE_URL = "https://dispatchlab.example.com"
    settings.DISPATCHLAB_NOTIFY_RETRY_BASE_SECONDS = 0.0
    settings.DISPATCHLAB_NOTIFY_TIMEOUT_SECONDS = 5.0
    # The receivers of these tests listen on loopback: the operator's allowance every test but the
    # ones about it needs.
    settings.DISPATCHLAB_NOTIFY_ALLOW_NETWORKS = ["127.0.0.0/8"]


class Resolver:
    """Answers for test names (`answers[name]`: one list of addresses per lookup, the last one repeated);
    addresses written as numbers are read as the system would, without a query; any other name does
    not resolve. No lookup of these tests leaves the process."""

    def __init__(self) -> None:
        self.answers: dict[str, list[list[str]]] = {
            "chat.example.com": [["93.184.215.14"]],  # public; never contacted (the guard)
            "metadata.example.test": [["169.254.169.254"]],
            "mattermost.corp.test": [["10.20.0.7"]],
            "mixed.example.test": [["93.184.215.14", "fe80::1"]],
        }
        self.lookups: list[str] = []

    def getaddrinfo(self, host: Any, port: Any, family: int = 0, type: int = 0, *args: Any) -> list[Any]:
        name = host.decode() if isinstance(host, bytes) else str(host)
        self.lookups.append(name)
        if name in self.answers:
            queue = self.answers[name]
            addresses = queue.pop(0) if len(queue) > 1 else queue[0]
            return [
                (
                    socket.AF_INET6 if ":" in a else socket.AF_INET,
                    socket.SOCK_STREAM,
                    6,
                    "",
                    (a, int(port or 0), 0, 0) if ":" in a else (a, int(port or 0)),
                )
                for a in addresses
            ]
        return REAL_GETADDRINFO(host, port, family, type, 0, socket.AI_NUMERICHOST)


REAL_GETADDRINFO = socket.getaddrinfo
REAL_CONNECT = socket.socket.connect


@pytest.fixture(autouse=True)
def resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Resolver]:
    """The resolver stub, and a guard that fails every connection to anything but loopback: a
    regression fails the test instead of reaching the address."""
    stub = Resolver()
    refused: list[Any] = []

    def guarded_connect(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            host = ipaddress.ip_address(str(address[0]).split("%")[0])
            if not (host.is_loopback and (host.version == 4 or host == ipaddress.ip_address("::1"))):
                refused.append(address)
                raise PermissionError(f"the test's socket guard refused a connection to {address}")
        REAL_CONNECT(sock, address)

    monkeypatch.setattr(socket, "getaddrinfo", stub.getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    yield stub
    assert refused == [], f"connections beyond loopback were attempted: {refused}"


@pytest.fixture(autouse=True)
def worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sent delivery is sent here, as the worker would, its retries at once (the real task, with its
    countdowns, runs in tests/pipeline/test_notify_delivery.py)."""

    def run(delivery_id: int) -> None:
        while True:
            try:
                sending.delivery_send(delivery_id=delivery_id)
                return
            except sending.DeliveryUnavailable:
                continue

    monkeypatch.setattr(services, "_enqueue", run)


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Delivery ids that would have gone to the broker."""
    sent: list[int] = []
    monkeypatch.setattr(services, "_enqueue", sent.append)
    return sent


@pytest.fixture
def core(monkeypatch: pytest.MonkeyPatch, make_document: Any) -> dict[str, Any]:
    """The core answers with this document (set "fingerprint" to move crashes between groups)."""
    answer: dict[str, Any] = {"document": make_document()}

    def analyze_paths(paths: Any, *, progress: Any = None, line_index: Any = None) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(json.dumps(answer["document"]))
        if line_index is not None:  # the real parse writes the viewer's copy in the same read
            document["line_count"] = write_line_index(paths, *line_index)
        return document

    monkeypatch.setattr(dispatchlab.core, "analyze_paths", analyze_paths)
    return answer


@pytest.fixture
def land(acme: Any, alice: Any, make_upload: Any, core: Any, django_capture_on_commit_callbacks: Any) -> Any:
    """land(b"log text") -> a report of acme, parsed by the (fixed) core, its commit hooks run."""

    def analysed(content: bytes, project: Any = None) -> Report:
        report, _ = report_submit(
            project=project or acme, user=alice, files=[make_upload(f"{len(content)}.log", content)]
        )
        with django_capture_on_commit_callbacks(execute=True):
            report_analyze(report_id=report.id)
        report.refresh_from_db()
        return report

    return analysed


def endpoint(project: Any, url: str = "http://127.0.0.1:9/hook", **fields: Any) -> Endpoint:
    fields.setdefault("events", [k.value for k in (EventKind.GROUP_NEW, EventKind.GROUP_RETURNED)])
    fields.setdefault("kind", "generic")
    return services.endpoint_create(project=project, user=None, url=url, **fields)


def stale(project: Any, number: int = 3) -> Event | None:
    return services.notify_decision_stale(
        project=project,
        record_id=40 + number,
        number=number,
        title="MTP off on sm_120",
        reason="a log shows flashinfer 0.6.2",
        url=f"/decisions/{40 + number}/",
    )


def text_of(body: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", body)))


# ---------------------------------------------------------------- events


def test_a_new_group_enqueues_one_delivery_per_subscribed_endpoint(acme, land, enqueued):
    new_only = endpoint(acme, "https://chat.example.com/a", events=["group.new"])
    both = endpoint(acme, "https://chat.example.com/b", events=["group.new", "group.returned"])
    stale_only = endpoint(acme, "https://chat.example.com/c", events=["decision.stale"])
    report = land(b"one\n")
    event = Event.objects.get()
    assert event.kind == "group.new" and event.group == report.group
    deliveries = {d.endpoint_id: d for d in Delivery.objects.all()}
    assert set(deliveries) == {new_only.id, both.id}
    assert stale_only.id not in deliveries
    assert sorted(enqueued) == sorted(d.id for d in deliveries.values())
    assert all(d.status == Delivery.Status.PENDING for d in deliveries.values())


def test_another_report_of_an_open_group_sends_nothing(acme, land, enqueued):
    endpoint(acme)
    land(b"one\n")
    land(b"two\n")
    assert FailureGroup.objects.get().count == 2
    assert Event.objects.count() == 1 and len(enqueued) == 1


def test_an_unsubscribed_event_makes_no_delivery(acme, land, enqueued):
    endpoint(acme, events=["decision.stale"])
    land(b"one\n")
    assert not Event.objects.exists() and not Delivery.objects.exists() and enqueued == []


def test_another_projects_group_does_not_reach_acmes_endpoints(acme, umbrella, land, enqueued):
    endpoint(acme)
    land(b"one\n", project=umbrella)
    assert not Delivery.objects.exists() and enqueued == []


# ---------------------------------------------------------------- bodies


def test_the_generic_body_is_signed_with_the_endpoint_secret(acme, land, receiver):
    hook = endpoint(acme, receiver.url)
    report = land(b"one\n")
    assert len(receiver.requests) == 1
    sent = receiver.requests[0]
    headers, body = sent["headers"], sent["body"]
    timestamp = headers["X-Dispatchlab-Timestamp"]
    expected = hmac.new(hook.secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    assert headers["X-Dispatchlab-Signature"] == f"sha256={expected}"
    assert headers["X-Dispatchlab-Event"] == "group.new"
    delivery = Delivery.objects.get()
    assert headers["X-Dispatchlab-Delivery"] == str(delivery.uuid)
    payload = json.loads(body)
    assert payload["event"] == "group.new" and payload["project"]["slug"] == "acme"
    assert payload["occurred_at"].endswith("Z")
    assert payload["group"]["id"] == report.group_id and payload["group"]["title"] == "CUDA out of memory"
    assert payload["group"]["url"] == f"https://dispatchlab.example.com/groups/{report.group_id}/"
    assert payload["report"]["id"] == report.id
    assert payload["report"]["url"] == f"https://dispatchlab.example.com/reports/{report.id}/"
    # what a receiver runs (payloads.verify): the right secret verifies, another or a changed body does not
    assert verify(hook.secret, timestamp, body, headers["X-Dispatchlab-Signature"])
    assert not verify("another secret", timestamp, body, headers["X-Dispatchlab-Signature"])
    assert not verify(hook.secret, timestamp, body + b" ", headers["X-Dispatchlab-Signature"])
    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.DELIVERED and delivery.attempts == 1


def test_the_slack_body_has_text_and_blocks(acme, land, receiver):
    endpoint(acme, receiver.url, kind="slack")
    report = land(b"one\n")
    body = receiver.json()
    assert set(body) == {"text", "blocks"}
    assert body["text"].startswith("*New failure group* in Acme: <https://dispatchlab.example.com/groups/")
    assert "CUDA out of memory" in body["text"] and "`oom`" in body["text"]
    assert f"/reports/{report.id}/|" in body["text"] and "sm_90" in body["text"]
    assert body["blocks"][0]["text"]["text"] == body["text"]


def test_the_slack_text_escapes_what_people_wrote(acme, receiver, django_capture_on_commit_callbacks):
    endpoint(acme, receiver.url, kind="slack", events=["decision.stale"])
    with django_capture_on_commit_callbacks(execute=True):
        services.notify_decision_stale(
            project=acme, record_id=7, number=7, title="<!channel> & |x|", reason="r", url="/decisions/7/"
        )
    text = receiver.json()["text"]
    assert "<!channel>" not in text and "&lt;!channel&gt; &amp; ¦x¦" in text


def test_a_stale_decision_is_sent_with_its_record(acme, receiver, django_capture_on_commit_callbacks):
    endpoint(acme, receiver.url, events=["decision.stale"])
    with django_capture_on_commit_callbacks(execute=True):
        stale(acme.id)  # the decisions app may pass the project's id
    payload = receiver.json()
    assert payload["event"] == "decision.stale"
    assert payload["decision"] == {
        "id": 43,
        "number": 3,
        "label": "DR-3",
        "title": "MTP off on sm_120",
        "reason": "a log shows flashinfer 0.6.2",
        "url": "https://dispatchlab.example.com/decisions/43/",
    }


# ---------------------------------------------------------------- closed groups coming back


def _fixed_confirm(report: Report, make_report: Any, make_document: Any) -> ConfirmRun:
    """A confirm run of `report` whose output report has just been parsed: healthy, smoke answered."""
    output = make_report(
        report.project,
        document=make_document(matches=[], failure_class="none", crash=None, outcome="serving"),
    )
    confirm = ConfirmRun.objects.create(
        project=report.project,
        report=report,
        status=ConfirmRun.Status.PARSING,
        queue="gpu.sm_90",
        launcher="sglang",
        result={"ready": True, "smoke": {"text": "Paris", "garbage": {"garbage": False}}},
        result_report=output,
    )
    assert confirm_report_parsed(report_id=output.id).status == ConfirmRun.Status.FIXED
    return confirm


def test_a_group_closed_by_a_fixed_confirm_that_gets_a_new_report_emits_group_returned(
    acme, land, receiver, make_report, make_document
):
    endpoint(acme, receiver.url)
    crash = land(b"one\n")
    confirm = _fixed_confirm(crash, make_report, make_document)
    closure = GroupClosure.objects.get(group=crash.group)
    assert closure.closed_at is not None and closure.closed_kind == "fix_confirmed"
    assert closure.closed_reason == f"fix confirmed by confirm run {confirm.id}"

    again = land(b"two\n")
    assert again.group_id == crash.group_id
    assert len(receiver.requests) == 2
    payload = receiver.json()
    assert payload["event"] == "group.returned" and payload["report"]["id"] == again.id
    assert payload["group"]["closed"]["reason"] == f"fix confirmed by confirm run {confirm.id}"
    assert payload["group"]["closed"]["kind"] == "fix_confirmed"
    closure.refresh_from_db()
    assert closure.closed_at is None and closure.reopened_by == again and closure.times_reopened == 1
    # open again: a third report is no news
    land(b"three\n")
    assert len(receiver.requests) == 2


def test_a_group_closed_by_an_accepted_decision_comes_back_too(acme, land, enqueued):
    endpoint(acme)
    crash = land(b"one\n")
    closed = services.groups_close(
        project_id=acme.id,
        fingerprints=[crash.fingerprint],
        kind=GroupClosure.Kind.DECISION_ACCEPTED,
        reason="DR-3 accepted: MTP off on sm_120",
    )
    assert closed == 1
    assert not services.group_close(group=crash.group, kind="decision_accepted", reason="again")
    land(b"two\n")
    event = Event.objects.get(kind="group.returned")
    assert event.payload["group"]["closed"]["reason"] == "DR-3 accepted: MTP off on sm_120"


def test_a_rematch_into_a_closed_group_is_not_a_return(acme, land, enqueued, make_document, core):
    from dispatchlab.reports.submit import report_rematch

    endpoint(acme)
    crash = land(b"one\n")
    services.group_close(group=crash.group, kind="fix_confirmed", reason="fixed")
    # an old report moved by a re-match is no news, nor is a new group it makes
    report_rematch(report_id=crash.id)
    core["document"] = make_document(fingerprint="e" * 16)
    report_analyze(report_id=crash.id)
    assert Event.objects.count() == 1


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


# ---------------------------------------------------------------- pages


def test_a_member_adds_an_endpoint_and_sees_its_secret(alice_client, acme):
    response = alice_client.post(
        reverse("front:notify_project", args=["acme"]),
        {
            "url": "https://chat.example.com/hooks/abc",
            "kind": "slack",
            "events": ["group.new"],
            "name": "#oncall",
        },
    )
    hook = Endpoint.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("front:notify_endpoint", args=["acme", hook.pk]) + "?created=1"
    assert hook.kind == "slack" and hook.events == ["group.new"] and hook.name == "#oncall"
    page = alice_client.get(response["Location"]).content.decode()
    assert hook.secret in page and "Send a test event" in page


INTERNAL_URLS = [
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a cloud metadata address"),
    ("http://metadata.example.test/x", "metadata.example.test resolves to 169.254.169.254, which is a cloud"),
    ("http://0251.0376.0251.0376/", "resolves to 169.254.169.254, which is a cloud metadata address"),
    ("http://[::ffff:169.254.169.254]/", "is a cloud metadata address"),
    ("http://169.254.10.1:8080/", "169.254.10.1 is a link-local address"),
    ("http://[fe80::1]/", "fe80::1 is a link-local address"),
    ("https://[::1]/z", "::1 is a loopback address"),
    ("http://10.0.0.5:8065/hooks/x", "10.0.0.5 is a private or reserved address"),
    ("http://mattermost.corp.test/hooks/y", "resolves to 10.20.0.7, which is a private or reserved"),
    ("http://mixed.example.test/", "resolves to fe80::1, which is a link-local address"),
    ("http://0.0.0.0:8000/", "0.0.0.0 is not an address a host answers on"),
]


@pytest.mark.parametrize(("url", "message"), INTERNAL_URLS)
def test_internal_and_metadata_addresses_are_refused_when_an_endpoint_is_added(
    alice_client, acme, url, message
):
    response = alice_client.post(
        reverse("front:notify_project", args=["acme"]),
        {"url": url, "kind": "generic", "events": ["group.new"]},
    )
    assert response.status_code == 400
    assert message in html.unescape(response.content.decode())
    assert not Endpoint.objects.exists()


def test_the_refusal_names_the_setting_that_allows_a_network(alice_client, acme):
    response = alice_client.post(
        reverse("front:notify_project", args=["acme"]),
        {"url": "http://10.0.0.5:8065/hooks/x", "kind": "generic", "events": ["group.new"]},
    )
    assert (
        "10.0.0.5 is a private or reserved address: webhooks are not sent there unless "
        "DISPATCHLAB_NOTIFY_ALLOW_NETWORKS allows its network."
    ) in html.unescape(response.content.decode())


def test_an_operator_allows_the_internal_chat_servers_network_but_never_the_metadata_address(
    alice_client, acme, settings
):
    settings.DISPATCHLAB_NOTIFY_ALLOW_NETWORKS = ["10.0.0.0/8", "169.254.0.0/16"]
    for url in (
        "http://10.0.0.5:8065/hooks/x",
        "http://mattermost.corp.test/hooks/y",
        "http://169.254.10.1/",
    ):
        response = alice_client.post(
            reverse("front:notify_project", args=["acme"]),
            {"url": url, "kind": "generic", "events": ["group.new"]},
        )
        assert response.status_code == 302, url
    response = alice_client.post(
        reverse("front:notify_project", args=["acme"]),
        {"url": "http://metadata.example.test/", "kind": "generic", "events": ["group.new"]},
    )
    assert response.status_code == 400 and "cloud metadata address" in response.content.decode()
    assert Endpoint.objects.count() == 3


def test_the_notifyendpoint_command_refuses_a_link_local_address(acme):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=r"url: 169\.254\.10\.1 is a link-local address"):
        call_command(
            "notifyendpoint", "--project", "acme", "--url", "http://169.254.10.1/h", "--event", "group.new"
        )
    assert not Endpoint.objects.exists()


def test_a_name_that_resolves_to_the_metadata_address_when_sent_is_refused_without_a_connection(
    acme, resolver
):
    hook = endpoint(acme, "http://chat.example.com/hook")  # public when it was added
    resolver.answers["chat.example.com"] = [["169.254.169.254"]]
    delivery = services.endpoint_send_test(endpoint=hook, user=None)
    assert sending.delivery_send(delivery_id=delivery.id) == sending.SendOutcome.FAILED
    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.FAILED
    assert delivery.error == (
        "refused: chat.example.com resolves to 169.254.169.254, which is a cloud metadata address: "
        "webhooks are not sent there."
    )
    hook.refresh_from_db()
    assert hook.consecutive_failures == 1  # and the socket guard saw no connection


def test_a_row_changed_behind_the_forms_back_is_refused_when_sent(acme, settings):
    hook = endpoint(acme, "http://127.0.0.1:9/hook")
    settings.DISPATCHLAB_NOTIFY_ALLOW_NETWORKS = []
    delivery = services.endpoint_send_test(endpoint=hook, user=None)
    assert sending.delivery_send(delivery_id=delivery.id) == sending.SendOutcome.FAILED
    assert Delivery.objects.get().error.startswith("refused: 127.0.0.1 is a loopback address")


def test_the_name_is_resolved_once_and_the_request_goes_to_that_address_with_its_host_name(
    acme, receiver, resolver
):
    port = receiver.server.server_address[1]
    resolver.answers["hook.example.test"] = [["127.0.0.1"]]
    hook = endpoint(acme, f"http://hook.example.test:{port}/hook")
    # A rebinding name: the first answer passes the check, the next would lead to the metadata service.
    resolver.answers["hook.example.test"] = [["127.0.0.1"], ["169.254.169.254"]]
    resolver.lookups.clear()
    delivery = services.endpoint_send_test(endpoint=hook, user=None)
    assert sending.delivery_send(delivery_id=delivery.id) == sending.SendOutcome.DELIVERED
    assert resolver.lookups.count("hook.example.test") == 1
    assert receiver.requests[0]["headers"]["Host"] == f"hook.example.test:{port}"


def _self_signed(folder: Path, name: str) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            *(
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                f"/CN={name}",
            ),
            *("-addext", f"subjectAltName=DNS:{name}", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_https_goes_to_the_resolved_address_with_the_names_sni_and_certificate_check(
    acme, receiver, resolver, tmp_path, monkeypatch
):
    cert, key = _self_signed(tmp_path, "hook.example.test")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the worker trusts this test's certificate
    seen: list[str | None] = []
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda sock, name, ctx: seen.append(name)
    receiver.server.socket = context.wrap_socket(receiver.server.socket, server_side=True)
    port = receiver.server.server_address[1]
    resolver.answers["hook.example.test"] = [["127.0.0.1"]]
    resolver.answers["other.example.test"] = [["127.0.0.1"]]
    good = endpoint(acme, f"https://hook.example.test:{port}/hook")
    wrong = endpoint(acme, f"https://other.example.test:{port}/hook")  # the certificate does not name it

    sent = services.endpoint_send_test(endpoint=good, user=None)
    assert sending.delivery_send(delivery_id=sent.id) == sending.SendOutcome.DELIVERED
    assert seen == ["hook.example.test"]
    assert receiver.requests[0]["headers"]["Host"] == f"hook.example.test:{port}"
    refused = services.endpoint_send_test(endpoint=wrong, user=None)
    with pytest.raises(sending.DeliveryUnavailable):
        sending.delivery_send(delivery_id=refused.id)
    assert "certificate" in Delivery.objects.get(id=refused.id).error
    assert len(receiver.requests) == 1


def test_the_endpoints_answer_is_not_stored_nor_shown_only_its_status(
    acme, alice_client, bob_client, land, receiver
):
    hook = endpoint(acme, receiver.url)
    receiver.script = [404]
    receiver.body = b"root:x:0:0:internal-secret"
    land(b"one\n")
    attempt = Delivery.objects.get().attempt_rows.get()
    assert attempt.status_code == 404 and attempt.error == "HTTP 404 Not Found"
    stored = json.dumps(list(Delivery.objects.values()), default=str) + json.dumps(
        list(Attempt.objects.values()), default=str
    )
    assert "internal-secret" not in stored
    for client in (alice_client, bob_client):
        page = client.get(reverse("front:notify_endpoint", args=["acme", hook.pk])).content.decode()
        assert "internal-secret" not in page and "HTTP 404" in page


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://user:secret@chat.internal/hook", "Put no user name or password in the URL"),
        ("https://token@chat.internal/hook", "Put no user name or password in the URL"),
        ("ftp://chat.internal/hook", "Only http:// and https:// URLs can receive events (ftp: is refused)."),
        ("file:///etc/passwd", "Only http:// and https:// URLs can receive events (file: is refused)."),
        ("javascript:alert(1)", "Only http:// and https:// URLs can receive events"),
        ("chat.internal/hook", "Only http:// and https:// URLs can receive events (no scheme is refused)."),
        ("http:///hook", "The URL has no host name."),
    ],
)
def test_urls_with_credentials_or_other_schemes_are_refused_with_a_message(alice_client, acme, url, message):
    response = alice_client.post(
        reverse("front:notify_project", args=["acme"]),
        {"url": url, "kind": "generic", "events": ["group.new"]},
    )
    assert response.status_code == 400
    assert message in html.unescape(response.content.decode())
    assert not Endpoint.objects.exists()


def test_an_endpoint_needs_an_event(alice_client, acme):
    response = alice_client.post(
        reverse("front:notify_project", args=["acme"]),
        {"url": "https://chat.example.com/h", "kind": "generic"},
    )
    assert response.status_code == 400 and "Choose at least one event" in response.content.decode()


def test_a_viewer_reads_but_cannot_add_endpoints(bob_client, acme):
    hook = endpoint(acme, "https://hooks.slack.com/services/T000/B000/secret-token", kind="slack")
    response = bob_client.post(
        reverse("front:notify_project", args=["acme"]),
        {"url": "https://chat.example.com/hook", "kind": "generic", "events": ["group.new"]},
    )
    assert response.status_code == 403
    assert Endpoint.objects.count() == 1
    listing = bob_client.get(reverse("front:notify_project", args=["acme"])).content.decode()
    assert "Add an endpoint" not in listing and "secret-token" not in listing
    assert "https://hooks.slack.com/services/…" in listing
    detail = bob_client.get(reverse("front:notify_endpoint", args=["acme", hook.pk])).content.decode()
    assert hook.secret not in detail and "secret-token" not in detail and "Send a test event" not in detail
    for action in ("notify_test", "notify_pause", "notify_resume", "notify_delete"):
        assert bob_client.post(reverse(f"front:{action}", args=["acme", hook.pk])).status_code == 403
    assert Endpoint.objects.filter(pk=hook.pk, paused_at__isnull=True).exists()


def test_an_outsider_gets_404(charlie_client, acme):
    hook = endpoint(acme)
    assert charlie_client.get(reverse("front:notify_project", args=["acme"])).status_code == 404
    assert charlie_client.get(reverse("front:notify_endpoint", args=["acme", hook.pk])).status_code == 404
    response = charlie_client.post(
        reverse("front:notify_project", args=["acme"]),
        {"url": "https://chat.example.com/hook", "kind": "generic", "events": ["group.new"]},
    )
    assert response.status_code == 404
    for action in ("notify_test", "notify_pause", "notify_resume", "notify_delete"):
        assert charlie_client.post(reverse(f"front:{action}", args=["acme", hook.pk])).status_code == 404
    # nor under charlie's own project
    assert charlie_client.get(reverse("front:notify_endpoint", args=["umbrella", hook.pk])).status_code == 404
    assert Endpoint.objects.filter(pk=hook.pk, paused_at__isnull=True).exists()


def test_the_nav_leads_to_the_only_project(alice_client, acme):
    page = alice_client.get(reverse("front:report_list")).content.decode()
    assert f'href="{reverse("front:notifications")}"' in page and ">Notifications<" in page
    response = alice_client.get(reverse("front:notifications"))
    assert response.status_code == 302 and response["Location"] == reverse(
        "front:notify_project", args=["acme"]
    )


def test_a_member_deletes_an_endpoint(alice_client, acme):
    hook = endpoint(acme)
    response = alice_client.post(reverse("front:notify_delete", args=["acme", hook.pk]))
    assert response.status_code == 302 and not Endpoint.objects.exists()


def test_the_notifyendpoint_command_prints_the_secret_last(acme, capsys):
    call_command(
        "notifyendpoint",
        "--project",
        "acme",
        "--url",
        "http://127.0.0.1:8065/hooks/x",
        "--event",
        "group.new",
    )
    hook = Endpoint.objects.get()
    assert capsys.readouterr().out.strip().splitlines()[-1] == hook.secret
    assert hook.events == ["group.new"] and hook.kind == "generic"


def test_the_task_retries_an_unavailable_endpoint_after_the_services_countdown(monkeypatch):
    from dispatchlab.notify.tasks import delivery_send_task

    def unavailable(*, delivery_id: int) -> None:
        raise sending.DeliveryUnavailable("HTTP 502 Bad Gateway", countdown=7.5)

    asked: dict[str, Any] = {}

    def retry(**kwargs: Any) -> Exception:
        asked.update(kwargs)
        return RuntimeError("retried")

    monkeypatch.setattr(sending, "delivery_send", unavailable)
    monkeypatch.setattr(delivery_send_task, "retry", retry)
    with pytest.raises(RuntimeError, match="retried"):
        delivery_send_task.run(12)
    assert asked["countdown"] == 7.5 and isinstance(asked["exc"], sending.DeliveryUnavailable)


def test_accepting_a_decision_linked_to_a_group_closes_it_so_its_next_crash_is_news(acme, land, enqueued):
    from dispatchlab.decisions.services import decision_create, decision_update

    endpoint(acme)
    crash = land(b"one\n")
    record = decision_create(
        project=acme,
        user=None,
        data={"title": "MTP off on sm_120", "status": "proposed", "links": {"groups": [crash.fingerprint]}},
    )
    assert not GroupClosure.objects.filter(group=crash.group, closed_at__isnull=False).exists()
    decision_update(decision=record, user=None, data={"status": "accepted"})
    closure = GroupClosure.objects.get(group=crash.group)
    assert (
        closure.closed_kind == GroupClosure.Kind.DECISION_ACCEPTED and record.label in closure.closed_reason
    )
    land(b"two\n")
    assert Event.objects.filter(kind="group.returned").count() == 1


def test_a_decision_turning_stale_notifies_the_projects_endpoints(
    acme, enqueued, django_capture_on_commit_callbacks
):
    from dispatchlab.decisions.models import Decision
    from dispatchlab.decisions.services import on_stale

    endpoint(acme, events=[EventKind.DECISION_STALE.value])
    record = Decision.objects.create(
        project=acme,
        number=7,
        title="MTP off on sm_120",
        stale=True,
        stale_reason="report 9 shows flashinfer 0.7.1",
    )
    with django_capture_on_commit_callbacks(execute=True):
        on_stale(record)
    event = Event.objects.get(kind=EventKind.DECISION_STALE.value)
    assert "flashinfer 0.7.1" in json.dumps(event.payload)
    assert len(enqueued) == 1


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
