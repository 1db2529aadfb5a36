"""Notifications for real: the upload parsed by the Celery worker on Redis, the event stored in
PostgreSQL, the delivery POSTed by the notify worker (a queue and processes of its own) to webhooks in
this test on loopback: one that fails twice, one that answers a byte every few seconds, one whose
worker is killed mid-request, one on an address deliveries refuse."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytestmark = pytest.mark.pipeline


@dataclasses.dataclass
class Webhook:
    url: str
    statuses: list[int]  # answers in order; 200 once they run out
    received: list[tuple[dict[str, str], bytes]] = dataclasses.field(default_factory=list)


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook(url="", statuses=[500, 500])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            hook.received.append((dict(self.headers), body))
            status = hook.statuses.pop(0) if hook.statuses else 200
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok" if status == 200 else b"no")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook.url = f"http://127.0.0.1:{server.server_address[1]}/dispatchlab"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield hook
    server.shutdown()
    server.server_close()


def test_a_new_group_reaches_a_webhook_that_fails_twice_signed_after_retries(stack, crash_log, webhook):
    # A project of its own: the crash log's group may already exist in the shared "pipeline" project.
    project = f"notify-{secrets.token_hex(4)}"
    token = (
        stack.manage("apitoken", "--user", "ci", "--project", project, "--create").strip().splitlines()[-1]
    )
    secret = (
        stack.manage("notifyendpoint", "--project", project, "--url", webhook.url, "--event", "group.new")
        .strip()
        .splitlines()[-1]
    )
    log = crash_log + f"[notify-test {secrets.token_hex(8)}]\n".encode()
    mine = dataclasses.replace(stack, token=token)
    report = mine.wait_finished(mine.upload([("server.log", log)])["id"])
    assert report["status"] == "done", report["error"]

    # Retries wait 2-4 s, then 4-8 s (DISPATCHLAB_NOTIFY_RETRY_BASE_SECONDS=4, half of it random).
    deadline = time.monotonic() + 60
    while len(webhook.received) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(webhook.received) == 3, f"{len(webhook.received)} requests\n{stack.worker_tail()}"

    headers, body = webhook.received[-1]
    timestamp = headers["X-Dispatchlab-Timestamp"]
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    assert headers["X-Dispatchlab-Signature"] == f"sha256={expected}"
    assert headers["X-Dispatchlab-Event"] == "group.new"
    assert {h["X-Dispatchlab-Delivery"] for h, _ in webhook.received} == {headers["X-Dispatchlab-Delivery"]}
    payload = json.loads(body)
    row = stack.row(report["id"])
    assert payload["event"] == "group.new" and payload["project"]["name"] == project
    assert payload["group"]["id"] == row["group_id"] and payload["report"]["id"] == report["id"]

    def delivery() -> tuple[Any, ...]:
        return stack.sql(
            "SELECT d.id, d.status, d.attempts FROM notify_delivery d JOIN notify_endpoint e "
            "ON e.id = d.endpoint_id WHERE d.uuid = %s",
            (headers["X-Dispatchlab-Delivery"],),
        )[0]

    deadline = time.monotonic() + 10  # the worker records the last answer just after the server sent it
    while delivery()[1] != "delivered" and time.monotonic() < deadline:
        time.sleep(0.1)
    delivery_id, status, attempts = delivery()
    assert status == "delivered" and attempts == 3
    recorded = stack.sql(
        "SELECT number, status_code, outcome, duration_ms FROM notify_attempt WHERE delivery_id = %s "
        "ORDER BY number",
        (delivery_id,),
    )
    assert [(n, code, outcome) for n, code, outcome, _ in recorded] == [
        (1, 500, "retry"),
        (2, 500, "retry"),
        (3, 200, "ok"),
    ]
    assert stack.sql(
        "SELECT consecutive_failures, paused_at FROM notify_endpoint e JOIN notify_delivery d "
        "ON d.endpoint_id = e.id WHERE d.id = %s",
        (delivery_id,),
    ) == [(0, None)]


# ---------------------------------------------------------------- slow, killed and refused deliveries


class Dribbler:
    """A webhook on 127.0.0.1 that reads each request, then answers one byte every `every` seconds (a
    status line that never ends) until the client hangs up or the test ends."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.received = 0
        self.open = 0  # connections it is still dribbling into
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = connection.recv(65536)
                if not chunk:
                    return
                request += chunk
            self.received += 1
            self.open += 1
            try:
                for byte in b"HTTP/1.1 200 " + b"O" * 100_000:
                    if self.stop.wait(self.every):
                        break
                    connection.sendall(bytes([byte]))
            except OSError:
                pass  # the client hung up
            finally:
                self.open -= 1

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


@pytest.fixture
def dribbler() -> Iterator[Dribbler]:
    server = Dribbler(every=2.0)
    yield server
    server.close()


def _wait(check: Any, what: str, timeout: float, stack: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    tail = _notify_log(stack)[-3000:] if stack is not None else ""
    raise AssertionError(f"{what} within {timeout}s\n{tail}")


def _notify_log(stack: Any) -> str:
    return (stack.worker_log.parent / "notify.log").read_text(errors="replace")


def _project(stack: Any, *urls: str) -> Any:
    """A project of its own (the crash log's group may exist elsewhere) with these endpoints."""
    project = f"notify-{secrets.token_hex(4)}"
    token = (
        stack.manage("apitoken", "--user", "ci", "--project", project, "--create").strip().splitlines()[-1]
    )
    for url in urls:
        stack.manage("notifyendpoint", "--project", project, "--url", url, "--event", "group.new")
    return dataclasses.replace(stack, token=token)


def _unique(log: bytes) -> bytes:
    return log + f"[notify-test {secrets.token_hex(8)}]\n".encode()


def _deliveries(stack: Any, url_prefix: str) -> list[tuple[Any, ...]]:
    return stack.sql(
        "SELECT d.id, d.status, d.attempts, d.error, e.consecutive_failures FROM notify_delivery d "
        "JOIN notify_endpoint e ON e.id = d.endpoint_id WHERE e.url LIKE %s ORDER BY d.id",
        (url_prefix + "%",),
    )


def test_a_slow_endpoint_does_not_hold_up_parsing_and_its_attempt_is_cut_at_the_deadline(
    stack, crash_log, dribbler
):
    # Two endpoints answering a byte every 2 s: a read timeout of 10 s never trips, and two deliveries
    # would hold both processes of a worker that also parsed.
    mine = _project(stack, dribbler.url + "/a", dribbler.url + "/b")
    first = mine.wait_finished(mine.upload([("server.log", _unique(crash_log))])["id"])
    assert first["status"] == "done", first["error"]
    _wait(lambda: dribbler.received >= 1, "the slow endpoint received its delivery", 60, stack)

    second = mine.wait_finished(mine.upload([("server.log", _unique(crash_log))])["id"], timeout=60)
    assert second["status"] == "done", second["error"]
    assert dribbler.open >= 1, "the report should be parsed while a delivery is still being dribbled"

    # each attempt ends at DISPATCHLAB_NOTIFY_TIMEOUT_SECONDS (10 s), whatever the endpoint sends
    _wait(
        lambda: [row[1] for row in _deliveries(stack, dribbler.url)] == ["failed", "failed"],
        "both deliveries failed",
        60,
        stack,
    )
    for delivery_id, _, attempts, error, _ in _deliveries(stack, dribbler.url):
        assert attempts == 1
        assert error == (
            "timed out after 10 s waiting for the answer; not sent again: the endpoint may have received it"
        )
        assert stack.sql(
            "SELECT number, status_code, outcome FROM notify_attempt WHERE delivery_id = %s", (delivery_id,)
        ) == [(1, None, "failed")]
    assert dribbler.received == 2  # neither was sent again
    assert [row[4] for row in _deliveries(stack, dribbler.url)] == [1, 1]  # counted towards pausing


def _notify_worker(stack: Any) -> subprocess.Popen[bytes]:
    found = [p for p in stack.processes if any(str(arg).endswith(".notify") for arg in p.args)]
    assert len(found) == 1, [p.args for p in stack.processes]
    return found[0]


def test_a_notify_process_killed_mid_request_records_the_attempt_as_interrupted_and_never_resends(
    stack, crash_log, dribbler
):
    from celery import Celery

    mine = _project(stack, dribbler.url + "/killed")
    report = mine.wait_finished(mine.upload([("server.log", _unique(crash_log))])["id"])
    assert report["status"] == "done", report["error"]
    _wait(lambda: dribbler.received == 1, "the endpoint received the delivery", 60, stack)
    worker = _notify_worker(stack)
    children = subprocess.run(["pgrep", "-P", str(worker.pid)], capture_output=True, text=True).stdout.split()
    assert children
    for pid in children:
        os.kill(int(pid), signal.SIGKILL)

    # The message comes back (acks_late); its new process finds the attempt claimed, waits until the
    # claim is stale (past the task's hard time limit), then records it instead of sending again.
    _wait(lambda: _deliveries(stack, dribbler.url)[0][1] == "failed", "the delivery recorded", 120, stack)
    delivery_id, _, attempts, error, failures = _deliveries(stack, dribbler.url)[0]
    assert error.startswith("interrupted: the worker stopped during the attempt")
    assert (attempts, failures) == (1, 1)
    assert stack.sql(
        "SELECT number, status_code, outcome FROM notify_attempt WHERE delivery_id = %s", (delivery_id,)
    ) == [(1, None, "failed")]

    # another copy of the message (the sweep, a second producer) finds it finished
    client = Celery("notify-test", broker=stack.env["DISPATCHLAB_BROKER_URL"])
    sent = client.send_task("notify.deliver", args=[delivery_id], queue=stack.queue + ".notify")
    client.close()
    _wait(lambda: f"notify.deliver[{sent.id}] succeeded" in _notify_log(stack), "the copy ran", 60, stack)
    assert f"notify.deliver[{sent.id}] succeeded" in _notify_log(stack)
    assert "'finished'" in _notify_log(stack).split(f"notify.deliver[{sent.id}] succeeded", 1)[1][:200]
    assert dribbler.received == 1


def test_an_internal_address_is_refused_when_sent_and_no_answer_body_is_stored(stack, crash_log):
    seen: list[str] = []

    class Answer(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.server.server_address[0])
            body = b"root:x:0:0:internal-secret"
            self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    class V6Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Answer), V6Server(("::1", 0), Answer)]
    for server in servers:
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    v4 = f"http://127.0.0.1:{servers[0].server_address[1]}/hook"
    v6 = f"http://[::1]:{servers[1].server_address[1]}/hook"
    try:
        # the stack allows 127.0.0.0/8 only: ::1 is refused when the endpoint is added ...
        with pytest.raises(Exception, match=r"::1 is a loopback address: webhooks are not sent there"):
            _project(stack, v6)
        # ... and when sent, for a row that holds it anyway (added before the upgrade, or by hand)
        mine = _project(stack, v4, v4 + "-later-v6")
        stack.sql("UPDATE notify_endpoint SET url = %s WHERE url = %s", (v6, v4 + "-later-v6"))
        report = mine.wait_finished(mine.upload([("server.log", _unique(crash_log))])["id"])
        assert report["status"] == "done", report["error"]

        def finished() -> bool:
            # notify stores the deliveries in its own task once the parse announced the group
            rows = _deliveries(stack, v4) + _deliveries(stack, v6)
            return len(rows) == 2 and all(row[1] == "failed" for row in rows)

        _wait(finished, "both deliveries finished", 60, stack)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
    assert seen == ["127.0.0.1"]
    assert _deliveries(stack, v6)[0][3].startswith("refused: ::1 is a loopback address")
    assert _deliveries(stack, v4)[0][3] == "HTTP 404 Not Found"
    stored = json.dumps(
        stack.sql("SELECT * FROM notify_attempt") + stack.sql("SELECT * FROM notify_delivery"), default=str
    )
    assert "HTTP 404 Not Found" in stored and "internal-secret" not in stored
