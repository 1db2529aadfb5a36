"""Redis goes away while the worker holds an unacknowledged task, and comes back.

A Redis server of the test's own (a free port, nothing kept on disk), PostgreSQL, the worker, beat and
the web server as `dispatchlab.stack` starts them. Before the fix the worker exited with kombu's
`AttributeError: 'NoneType' object has no attribute 'hostname'` ("Unrecoverable error") and nothing
was parsed again until someone restarted it (issue 11, item 1).
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatchlab.stack import (
    Stack as RunningStack,
)
from dispatchlab.stack import (
    create_database,
    drop_database,
    free_port,
    manage,
    stack_env,
    start_stack,
    stop_process,
    wait_until,
)
from tests.pipeline.conftest import POSTGRES_URL, STALE_SECONDS, Stack, _require_services

pytestmark = pytest.mark.pipeline

OUTAGE_SECONDS = 15


class RedisServer:
    def __init__(self, port: int, folder: Path) -> None:
        self.port, self.folder = port, folder
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        command += ["--appendonly", "no", "--dir", str(self.folder)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_until(self.answers, "redis-server", timeout=10)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, timeout=10)
            self.process = None

    def answers(self) -> bool:
        import redis

        with contextlib.suppress(redis.exceptions.ConnectionError):
            return bool(redis.Redis(port=self.port, socket_connect_timeout=1).ping())
        return False


@pytest.fixture
def outage_stack(tmp_path: Path) -> Iterator[tuple[Stack, RunningStack, RedisServer]]:
    _require_services()
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (Debian: apt-get install redis-server)", pytrace=False)
    server = RedisServer(free_port(), tmp_path)
    server.start()
    run_id = secrets.token_hex(4)
    database = f"dispatchlab_outage_{run_id}"
    database_url = create_database(POSTGRES_URL, database)
    env = stack_env(
        data_dir=tmp_path,
        database_url=database_url,
        broker_url=server.url,
        DISPATCHLAB_SECRET_KEY=secrets.token_urlsafe(40),
        DISPATCHLAB_DEBUG="false",
        DISPATCHLAB_STALE_CLAIM_SECONDS=str(STALE_SECONDS),
    )
    running: RunningStack | None = None
    try:
        manage(env, "migrate", "-v0")
        token = manage(env, "apitoken", "--user", "ci", "--project", "outage", "--create").split()[-1]
        running = start_stack(env, beat="separate", concurrency=2, log_dir=tmp_path)
        stack = Stack(
            base_url=running.base_url,
            token=token,
            webhook_secret="",
            database_url=database_url,
            queue="dispatchlab",
            env=env,
            worker=running.processes["worker"],
            worker_log=running.logs["worker"],
        )
        yield stack, running, server
    finally:
        if running is not None:
            running.close()
        server.stop()
        drop_database(POSTGRES_URL, database)


def _unique(log: bytes) -> bytes:
    return log + f"[outage-test {secrets.token_hex(8)}] done\n".encode()


def test_the_worker_survives_a_redis_outage_while_holding_a_task_and_parses_everything_after(
    outage_stack, crash_log
):
    stack, running, server = outage_stack
    before = stack.upload([("before.log", _unique(crash_log))])
    assert stack.wait_finished(before["id"])["status"] == "done"
    # What the busy-retry does: a countdown message the worker holds, unacknowledged, until it is due.
    from celery import Celery

    client = Celery("outage-test", broker=server.url)
    client.send_task("reports.analyze", args=[before["id"]], queue="dispatchlab", countdown=60)
    client.close()
    wait_until(lambda: stack.worker_log_count("received") >= 2, "the held task", timeout=20)

    server.stop()
    during = []
    started = time.monotonic()
    while time.monotonic() - started < OUTAGE_SECONDS:
        during.append(stack.upload([("during.log", _unique(crash_log))])["id"])
        time.sleep(1)
    server.start()

    assert len(during) >= 3, "uploads were not accepted while Redis was down"
    after = stack.upload([("after.log", _unique(crash_log))])
    assert stack.wait_finished(after["id"], timeout=60)["status"] == "done"
    for report_id in during:  # re-sent by beat's reports.requeue_stale
        assert stack.wait_finished(report_id, timeout=150)["status"] == "done", report_id
    assert running.exited() is None, f"{running.exited()} exited\n{stack.worker_tail()}"
    assert stack.worker_log_count("Unrecoverable error") == 0, stack.worker_tail()
    assert stack.worker_log_count("Connected to") >= 2, "the worker never reconnected"
