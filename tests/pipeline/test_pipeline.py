"""Uploads through the real API, parsed by a real Celery worker on Redis, stored in PostgreSQL."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import secrets
import signal
import subprocess
import time
import zipfile

import pytest
from conftest import _multipart

pytestmark = pytest.mark.pipeline


def unique(log: bytes) -> bytes:
    """The same log with one line more, so checksum de-duplication does not answer from another test."""
    return log + f"[pipeline-test {secrets.token_hex(8)}] done\n".encode()


def test_a_crash_log_is_diagnosed(stack, crash_log):
    created = stack.upload([("server.log", unique(crash_log))], title="oom on h100")
    assert created["status"] == "queued"
    report = stack.wait_finished(created["id"])
    assert report["status"] == "done", report["error"]
    document = report["document"]
    assert document["failure_class"] == "oom"
    assert any(match["id"] == "cuda-out-of-memory" for match in document["matches"])
    assert document["sources"][0]["name"] == "server.log"
    row = stack.row(created["id"])
    assert row["failure_class"] == "oom" and row["attempts"] == 1 and row["progress"] == 100.0
    assert row["group_id"] is not None and row["line_count"] == crash_log.count(b"\n") + 1


def test_a_binary_file_is_refused_at_upload_with_a_reason_a_person_understands(stack):
    body, content_type = _multipart({}, [("core.log", b"\x7fELF\x02\x01\x01\x00" + os.urandom(4096))])
    status, answer = stack.request(
        "POST",
        "/api/v1/reports",
        body,
        {"Authorization": f"Bearer {stack.token}", "Content-Type": content_type},
    )
    assert (status, answer) == (400, {"error": "core.log: binary data, not a text log"})


def test_a_zip_of_no_text_log_fails_with_a_reason_a_person_understands(stack):
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w") as archive:
        archive.writestr("core.bin", b"\x7fELF\x02\x01\x01\x00" + os.urandom(4096))
    created = stack.upload([("logs.zip", packed.getvalue())])
    report = stack.wait_finished(created["id"])
    assert report["status"] == "failed"
    assert report["error"].endswith("zip holds no text logs"), report["error"]
    assert report["document"] is None


def test_the_same_upload_returns_the_same_report(stack, crash_log):
    log = unique(crash_log)
    first = stack.upload([("a.log", log)])
    again = stack.upload([("b.log", log)])
    assert again["id"] == first["id"] and again["duplicate"] is True
    checksum = hashlib.sha256(log).hexdigest()
    assert stack.sql("SELECT count(*) FROM reports_report WHERE checksum = %s", (checksum,)) == [(1,)]
    assert stack.wait_finished(first["id"])["status"] == "done"


def test_a_report_left_parsing_by_a_dead_worker_is_taken_over(stack, crash_log):
    created = stack.upload([("server.log", unique(crash_log))])
    stack.wait_finished(created["id"])
    # as if a worker had claimed it an hour ago and died
    stack.sql(
        "UPDATE reports_report SET status = 'parsing', claimed_at = now() - interval '1 hour', "
        "claim_token = 'dead-worker', document = NULL, progress = 40 WHERE id = %s",
        (created["id"],),
    )
    stack.send_analyze(created["id"])
    report = stack.wait_finished(created["id"])
    assert report["status"] == "done" and report["document"]["failure_class"] == "oom"
    row = stack.row(created["id"])
    assert row["attempts"] == 2 and row["claim_token"] != "dead-worker"


def test_two_tasks_for_one_report_parse_it_once(stack, crash_log):
    created = stack.upload([("server.log", unique(crash_log))])
    stack.send_analyze(created["id"])  # a duplicate message, beside the one the upload sent
    stack.send_analyze(created["id"])
    assert stack.wait_finished(created["id"])["status"] == "done"
    time.sleep(1)  # let the duplicates run their claim
    assert stack.row(created["id"])["attempts"] == 1
    assert stack.worker_log_count(f"report {created['id']}: parsed in") == 1


def test_concurrent_claims_on_postgresql_give_the_report_to_one(stack, crash_log):
    created = stack.upload([("server.log", unique(crash_log))])
    stack.wait_finished(created["id"])
    stack.sql("UPDATE reports_report SET status = 'queued' WHERE id = %s", (created["id"],))
    script = (
        "import json; from concurrent.futures import ThreadPoolExecutor; "
        "from django.db import connection; "
        "from dispatchlab.reports.analysis import report_claim\n"
        "def claim(i):\n"
        f"    try: return report_claim(report_id={created['id']}, token=str(i))\n"
        "    finally: connection.close()\n"
        "with ThreadPoolExecutor(8) as pool: print(json.dumps(list(pool.map(claim, range(8)))))"
    )
    results = json.loads(stack.manage("shell", "-c", script).strip().splitlines()[-1])
    assert results.count(True) == 1 and results.count(False) == 7


RACE_SCRIPT = """
import json, threading, time
from django.db import connection, transaction
from dispatchlab.reports.models import FailureGroup, Report
from dispatchlab.reports.accounts import project_create
from dispatchlab.reports.groups import failuregroup_refresh

project = project_create(name="race-{tag}")
group = FailureGroup.objects.create(project=project, fingerprint="race", count=1)
def report(n, group=None):
    return Report.objects.create(project=project, checksum=f"{tag}{{n:056x}}", group=group)
report(1, group)
second, third = report(2), report(3)
a_counted, b_started = threading.Event(), threading.Event()

def worker_a():
    try:
        with transaction.atomic():
            Report.objects.filter(id=second.id).update(group=group)
            failuregroup_refresh(group_id=group.id)
            a_counted.set()
            b_started.wait(10)
            time.sleep(0.5)  # B counts now, or waits for A's lock on the group
    finally:
        connection.close()

def worker_b():
    try:
        a_counted.wait(10)
        with transaction.atomic():
            Report.objects.filter(id=third.id).update(group=group)
            b_started.set()
            failuregroup_refresh(group_id=group.id)
    finally:
        connection.close()

threads = [threading.Thread(target=worker_a), threading.Thread(target=worker_b)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
group.refresh_from_db()
print(json.dumps([group.count, Report.objects.filter(group=group).count()]))
"""


def test_two_workers_joining_one_group_at_once_count_both_reports(stack):
    # Two reports join a group in concurrent transactions: neither sees the other's uncommitted row,
    # so without a lock on the group the second recount overwrites the first with a count one short.
    script = RACE_SCRIPT.format(tag=secrets.token_hex(4))
    stored, actual = json.loads(stack.manage("shell", "-c", script).strip().splitlines()[-1])
    assert (stored, actual) == (3, 3)


def test_a_killed_worker_process_does_not_lose_the_report(stack, crash_log):
    # big enough that the parse is still running when its process is killed
    log = unique(crash_log) * 1 + b"".join(
        f"[2026-05-24 00:52:{n % 60:02d} TP0] Decode batch. #running-req: 12, #token: {n}, "
        f"token usage: 0.41, gen throughput (token/s): 1234.{n % 10}, #queue-req: 0\n".encode()
        for n in range(400_000)
    )
    created = stack.upload([("long.log", log)])
    stack.wait_status(created["id"], "parsing")
    children = subprocess.run(
        ["pgrep", "-P", str(stack.worker.pid)], capture_output=True, text=True, check=False
    ).stdout.split()
    assert children, stack.worker_tail()
    for pid in children:
        os.kill(int(pid), signal.SIGKILL)
    report = stack.wait_finished(created["id"], timeout=180)
    assert report["status"] == "done", report["error"]
    assert stack.row(created["id"])["attempts"] == 2


def _signed(secret: str, body: bytes) -> dict[str, str]:
    timestamp = str(int(time.time()))
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return {
        "Content-Type": "application/json",
        "X-Dispatchlab-Signature": f"sha256={digest}",
        "X-Dispatchlab-Timestamp": timestamp,
        "X-Dispatchlab-Delivery": secrets.token_hex(8),
    }


def test_a_ci_job_waits_for_its_diagnosis(stack, crash_log):
    body = json.dumps({"log": unique(crash_log).decode(), "job": "e2e", "commit": "abc"}).encode()
    headers = {**_signed(stack.webhook_secret, body), "X-Dispatchlab-Project": "pipeline"}
    status, answer = stack.request("POST", "/api/v1/hooks/ci?wait=60", body, headers)
    assert status == 201, answer
    assert answer["status"] == "done" and answer["document"]["failure_class"] == "oom"
    # the CI retries the same delivery: same report, no new parse
    status, again = stack.request("POST", "/api/v1/hooks/ci", body, headers)
    assert again["id"] == answer["id"]
