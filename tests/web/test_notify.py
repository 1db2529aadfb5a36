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
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import dispatchlab.core
from dispatchlab.core.lineindex import write_line_index
from dispatchlab.gpu.confirm_outcomes import confirm_report_parsed
from dispatchlab.gpu.models import ConfirmRun
from dispatchlab.notify import delivery as sending
from dispatchlab.notify import services
from dispatchlab.notify.models import Delivery, Endpoint, Event, GroupClosure
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
