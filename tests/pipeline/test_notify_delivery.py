"""A new failure group notified for real: the upload parsed by the Celery worker on Redis, the event
stored in PostgreSQL, the delivery POSTed by the worker to a webhook in this test that fails twice."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import secrets
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
