"""Redaction on the real stack (uvicorn + Celery on Redis + PostgreSQL): a backtracking pattern does not
hold a web process, two quick redactions both hold, the secret is gone from every file of the data
folder and every database row, and the re-parse after a redaction tells no endpoint."""

from __future__ import annotations

import dataclasses
import json
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.pipeline

CATASTROPHIC = "(a+)+$"  # on a line of forty `a` and a `!`: 2**40 ways to fail


def secret(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def own_project(stack: Any) -> tuple[str, Any]:
    """A project of its own, and the stack speaking with a token of it."""
    project = f"redact-{secrets.token_hex(4)}"
    token = (
        stack.manage("apitoken", "--user", "ci", "--project", project, "--create").strip().splitlines()[-1]
    )
    return project, dataclasses.replace(stack, token=token)


def log_with(crash_log: bytes, *secrets_: str) -> bytes:
    lines = "".join(f"[2026-05-24 00:50:00] env HF_TOKEN={value}\n" for value in secrets_)
    # The crash message quotes the first one: it reaches the fingerprint, the group and the events.
    crash_log = crash_log.replace(b"memory in use.", f"memory in use. token={secrets_[0]}".encode(), 1)
    return lines.encode() + crash_log + b"a" * 40 + b"!\n"


def redact(stack: Any, report_id: int, body: dict[str, Any], timeout: float = 20) -> dict[str, Any]:
    import urllib.request

    request = urllib.request.Request(
        f"{stack.base_url}/api/v1/reports/{report_id}/redact",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {stack.token}", "Content-Type": "application/json"},
    )
    # A web process running the pattern itself would not answer within this.
    with urllib.request.urlopen(request, timeout=timeout) as response:
        assert response.status == 202
        return json.loads(response.read())


def redactions(stack: Any, report_id: int) -> list[dict[str, Any]]:
    status, answer = stack.request(
        "GET", f"/api/v1/reports/{report_id}/redact", headers={"Authorization": f"Bearer {stack.token}"}
    )
    assert status == 200, answer
    return list(answer["redactions"])


def wait_redactions_finished(stack: Any, report_id: int, timeout: float = 90) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = redactions(stack, report_id)
        if found and all(item["status"] in ("done", "refused") for item in found):
            return found
        time.sleep(0.1)
    raise AssertionError(f"redactions of {report_id} not finished: {found}\n{stack.worker_tail()}")


def wait_reparsed(stack: Any, report_id: int) -> dict[str, Any]:
    wait_redactions_finished(stack, report_id)
    return stack.wait_finished(report_id)


def places_holding(stack: Any, needle: str) -> list[str]:
    """Every file under the stack's data folder and every database row that contains `needle`."""
    found = [
        str(path)
        for path in Path(stack.env["DISPATCHLAB_DATA_DIR"]).rglob("*")
        if path.is_file() and needle.encode() in path.read_bytes()
    ]
    tables = stack.sql("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    for (table,) in tables:
        count = stack.sql(f'SELECT count(*) FROM "{table}" t WHERE t::text LIKE %s', (f"%{needle}%",))[0][0]
        if count:
            found.append(f"{count} row(s) of {table}")
    return found


def test_a_backtracking_pattern_holds_no_web_process_and_is_refused_for_running_too_long(stack, crash_log):
    _, mine = own_project(stack)
    hidden = secret("hf_")
    report = mine.wait_finished(mine.upload([("server.log", log_with(crash_log, hidden))])["id"])
    assert report["status"] == "done", report["error"]

    answer = redact(mine, report["id"], {"pattern": CATASTROPHIC})
    assert answer["redaction"]["status"] in ("queued", "running")
    # Meanwhile the web answers everyone (the stack has two web processes: 8 requests reach both).
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(
            pool.map(
                lambda _: mine.request(
                    "GET", "/api/v1/reports?page=1", headers={"Authorization": f"Bearer {mine.token}"}
                )[0],
                range(8),
            )
        )
    assert answers == [200] * 8

    refused = wait_redactions_finished(mine, report["id"])
    assert refused[0]["status"] == "refused" and "ran longer than" in refused[0]["reason"]
    # The worker is free again: a good redaction of the same report goes through.
    redact(mine, report["id"], {"pattern": r"hf_[0-9a-f]+"})
    assert [item["status"] for item in wait_redactions_finished(mine, report["id"])] == ["refused", "done"]
    assert mine.wait_finished(report["id"])["status"] == "done"


def test_two_quick_redactions_both_hold_and_the_secrets_are_gone_from_every_file_and_row(stack, crash_log):
    _, mine = own_project(stack)
    first, second = secret("hf_"), secret("sk-")
    uploaded = mine.upload(
        [(f"server-{first}.log", log_with(crash_log, first, second))],
        title=f"crash {first}",
        launch_command=f"HF_TOKEN={first} OPENAI_KEY={second} python -m sglang.launch_server",
    )
    report = mine.wait_finished(uploaded["id"])
    assert report["status"] == "done", report["error"]
    assert places_holding(mine, first) and places_holding(mine, second)

    redact(mine, report["id"], {"pattern": r"hf_[0-9a-f]+"})
    time.sleep(0.3)  # the second arrives while the first runs or its re-parse does
    redact(mine, report["id"], {"pattern": r"sk-[0-9a-f]+"})

    done = wait_reparsed(mine, report["id"])
    assert [item["status"] for item in redactions(mine, report["id"])] == ["done", "done"]
    assert done["status"] == "done" and done["failure_class"] == "oom"
    assert places_holding(mine, first) == [] and places_holding(mine, second) == []


@dataclasses.dataclass
class Webhook:
    url: str = ""
    received: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            hook.received.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook.url = f"http://127.0.0.1:{server.server_address[1]}/dispatchlab"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield hook
    server.shutdown()
    server.server_close()


def test_the_re_parse_after_a_redaction_sends_no_event_to_an_endpoint(stack, crash_log, webhook):
    project, mine = own_project(stack)
    stack.manage(
        "notifyendpoint",
        "--project",
        project,
        "--url",
        webhook.url,
        "--event",
        "group.new",
        "--event",
        "group.returned",
    )
    hidden = secret("hf_")
    report = mine.wait_finished(mine.upload([("server.log", log_with(crash_log, hidden))])["id"])
    assert report["status"] == "done", report["error"]
    deadline = time.monotonic() + 30
    while not webhook.received and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [body["event"] for body in webhook.received] == ["group.new"]
    group_before = mine.row(report["id"])["group_id"]

    redact(mine, report["id"], {"pattern": r"hf_[0-9a-f]+"})
    assert wait_reparsed(mine, report["id"])["status"] == "done"

    # The redacted crash message makes another fingerprint, so another group: still no news.
    assert mine.row(report["id"])["group_id"] not in (None, group_before)
    events = mine.sql(
        "SELECT e.kind FROM notify_event e JOIN reports_project p ON p.id = e.project_id WHERE p.name = %s",
        (project,),
    )
    assert events == [("group.new",)]
    assert len(webhook.received) == 1
    assert places_holding(mine, hidden) == []
