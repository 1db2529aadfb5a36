"""The whole pipeline for real: the production-shaped web server (uvicorn) + a Celery worker process on
this machine's Redis and PostgreSQL, a fresh database per run, started by `dispatchlab.stack` as the
devserver and the benchmarks start it. Nothing is mocked; tests talk HTTP to the API and SQL to the
database, as a CI job and an operator would.

A missing Redis or PostgreSQL FAILS these tests (CI must not pass by skipping them); deselect them
with `-m "not pipeline"` on a machine without the services. Where they live:
DISPATCHLAB_TEST_REDIS_URL (default redis://127.0.0.1:6379/15) and DISPATCHLAB_TEST_POSTGRES_URL
(default postgresql://postgres@127.0.0.1:5432/postgres, used to create and drop the test database).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dispatchlab.stack import (
    create_database,
    drop_database,
    forget_redis_keys,
    manage,
    stack_env,
    start_stack,
    stop_process,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
REDIS_URL = os.environ.get("DISPATCHLAB_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
POSTGRES_URL = os.environ.get(
    "DISPATCHLAB_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
# Short, so the tests that kill a worker see its claim go stale within seconds.
STALE_SECONDS = 3


def _require_services() -> None:
    import psycopg
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
    except Exception as error:
        pytest.fail(
            f"Redis is not reachable at {REDIS_URL} ({error}); start it (.ci/run does) "
            "or deselect these tests with -m 'not pipeline'",
            pytrace=False,
        )
    try:
        psycopg.connect(POSTGRES_URL, connect_timeout=3).close()
    except Exception as error:
        pytest.fail(
            f"PostgreSQL is not reachable at {POSTGRES_URL} ({error}); start it (.ci/run does) "
            "or deselect these tests with -m 'not pipeline'",
            pytrace=False,
        )


def _multipart(fields: dict[str, str], files: list[tuple[str, bytes]]) -> tuple[bytes, str]:
    boundary = "----dispatchlab" + secrets.token_hex(8)
    parts: list[bytes] = []
    for name, value in fields.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        )
    for filename, content in files:
        parts.append(
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
                "Content-Type: application/octet-stream\r\n\r\n"
            ).encode()
            + content
            + b"\r\n"
        )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


@dataclass
class Stack:
    base_url: str
    token: str
    webhook_secret: str
    database_url: str
    queue: str
    env: dict[str, str]
    worker: subprocess.Popen[bytes]
    worker_log: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    # ---- HTTP, as a client would
    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(
            self.base_url + path, data=body, method=method, headers=headers or {}
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def upload(self, files: list[tuple[str, bytes]], **fields: str) -> dict[str, Any]:
        body, content_type = _multipart(fields, files)
        status, answer = self.request(
            "POST",
            "/api/v1/reports",
            body,
            {"Authorization": f"Bearer {self.token}", "Content-Type": content_type},
        )
        assert status == 201, answer
        return answer

    def get(self, report_id: int) -> dict[str, Any]:
        status, answer = self.request(
            "GET", f"/api/v1/reports/{report_id}", headers={"Authorization": f"Bearer {self.token}"}
        )
        assert status == 200, answer
        return answer

    def wait_finished(self, report_id: int, timeout: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            answer = self.get(report_id)
            if answer["status"] in ("done", "failed"):
                return answer
            time.sleep(0.1)
        raise AssertionError(
            f"report {report_id} not finished after {timeout}s: {answer}\n{self.worker_tail()}"
        )

    def wait_status(self, report_id: int, status: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.row(report_id)["status"] == status:
                return
            time.sleep(0.02)
        raise AssertionError(f"report {report_id} never reached {status}")

    # ---- the database and the broker, as an operator would
    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True) as connection:
            cursor = connection.execute(query, params)
            return cursor.fetchall() if cursor.description else []

    def row(self, report_id: int) -> dict[str, Any]:
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(self.database_url, autocommit=True, row_factory=dict_row) as connection:
            found = connection.execute("SELECT * FROM reports_report WHERE id = %s", (report_id,)).fetchone()
        assert found is not None
        return dict(found)

    def send_analyze(self, report_id: int) -> None:
        """Send reports.analyze by name, as a second producer would (no Django here)."""
        from celery import Celery

        client = Celery("pipeline-test", broker=REDIS_URL)
        client.send_task("reports.analyze", args=[report_id], queue=self.queue)
        client.close()

    def manage(self, *args: str) -> str:
        return manage(self.env, *args)

    def worker_tail(self, lines: int = 40) -> str:
        return "\n".join(self.worker_log.read_text(errors="replace").splitlines()[-lines:])

    def worker_log_count(self, needle: str) -> int:
        return self.worker_log.read_text(errors="replace").count(needle)


def _wait_until(check: Any, what: str, timeout: float, log: Path | None = None) -> None:
    wait_until(check, what, timeout=timeout, log=log)


_stop = stop_process


@contextlib.contextmanager
def started_stack(folder: Path, **settings: str) -> Iterator[Stack]:
    """A stack on a fresh database, its data under `folder`; `settings` are DISPATCHLAB_* overrides."""
    _require_services()
    run_id = secrets.token_hex(4)
    database = f"dispatchlab_pipeline_{run_id}"
    database_url = create_database(POSTGRES_URL, database)
    queue = f"dispatchlab-pipeline-{run_id}"
    env = stack_env(
        data_dir=folder,
        database_url=database_url,
        broker_url=REDIS_URL,
        queue=queue,
        # GPU jobs of this run wait in queues of their own (gpu-pipeline-<run>.sm_120 ...).
        DISPATCHLAB_GPU_QUEUE=f"gpu-pipeline-{run_id}",
        DISPATCHLAB_SECRET_KEY=secrets.token_urlsafe(40),
        DISPATCHLAB_DEBUG="false",
        DISPATCHLAB_ALLOWED_HOSTS="127.0.0.1,localhost",
        # A backtracking redaction pattern is stopped after this long (tests/pipeline/test_redaction_on_the_stack.py);
        # the webhooks of the notify tests listen on loopback, which deliveries refuse by default.
        **{
            "DISPATCHLAB_STALE_CLAIM_SECONDS": str(STALE_SECONDS),
            "DISPATCHLAB_REDACT_TIME_LIMIT": "3",
            "DISPATCHLAB_NOTIFY_ALLOW_NETWORKS": "127.0.0.0/8",
            **settings,
        },
    )
    running = None
    try:
        manage(env, "migrate", "-v0")
        token = manage(env, "apitoken", "--user", "ci", "--project", "pipeline", "--create").split()[-1]
        secret = manage(env, "webhooksecret", "--project", "pipeline").split()[-1]
        # No beat: tests that kill the worker's children must find only its pool there.
        running = start_stack(
            env, beat="none", concurrency=2, worker_hostname=f"pipeline-{run_id}@%h", log_dir=folder
        )
        yield Stack(
            base_url=running.base_url,
            token=token,
            webhook_secret=secret,
            database_url=database_url,
            queue=queue,
            env=env,
            worker=running.processes["worker"],
            worker_log=running.logs["worker"],
            processes=list(running.processes.values()),
        )
    finally:
        if running is not None:
            running.close()
        drop_database(POSTGRES_URL, database)
        forget_redis_keys(REDIS_URL, run_id)


@pytest.fixture(scope="session")
def stack_with() -> Any:
    """`with stack_with(folder, DISPATCHLAB_X="..."):` a stack of its own, for settings the shared one lacks."""
    return started_stack


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with started_stack(tmp_path_factory.mktemp("pipeline")) as running:
        yield running


@pytest.fixture
def crash_log() -> bytes:
    return (DATA / "sglang_oom.log").read_bytes()
