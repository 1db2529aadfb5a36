"""The whole pipeline for real: gunicorn + a Celery worker process on this machine's Redis and
PostgreSQL, a fresh database per run. Nothing is mocked; tests talk HTTP to the API and SQL to the
database, as a CI job and an operator would.

A missing Redis or PostgreSQL FAILS these tests (CI must not pass by skipping them); deselect them
with `-m "not pipeline"` on a machine without the services. Where they live:
DISPATCHLAB_TEST_REDIS_URL (default redis://127.0.0.1:6379/15) and DISPATCHLAB_TEST_POSTGRES_URL
(default postgresql://postgres@127.0.0.1:5432/postgres, used to create and drop the test database).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _with_database(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


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
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def worker_tail(self, lines: int = 40) -> str:
        return "\n".join(self.worker_log.read_text(errors="replace").splitlines()[-lines:])

    def worker_log_count(self, needle: str) -> int:
        return self.worker_log.read_text(errors="replace").count(needle)


def _wait_until(check: Any, what: str, timeout: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    raise RuntimeError(f"{what} did not start within {timeout}s\n{tail}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    _require_services()
    import psycopg
    import redis

    run_id = secrets.token_hex(4)
    database = f"dispatchlab_pipeline_{run_id}"
    database_url = _with_database(POSTGRES_URL, database)
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    folder = tmp_path_factory.mktemp("pipeline")
    queue = f"dispatchlab-pipeline-{run_id}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "dispatchlab.config.settings",
        "DISPATCHLAB_DATABASE_URL": database_url,
        "DISPATCHLAB_BROKER_URL": REDIS_URL,
        "DISPATCHLAB_QUEUE": queue,
        # GPU jobs of this run wait in queues of their own (gpu-pipeline-<run>.sm_120 ...).
        "DISPATCHLAB_GPU_QUEUE": f"gpu-pipeline-{run_id}",
        "DISPATCHLAB_DATA_DIR": str(folder),
        "DISPATCHLAB_SECRET_KEY": secrets.token_urlsafe(40),
        "DISPATCHLAB_DEBUG": "false",
        "DISPATCHLAB_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DISPATCHLAB_STALE_CLAIM_SECONDS": str(STALE_SECONDS),
        "PYTHONUNBUFFERED": "1",
    }
    processes: list[subprocess.Popen[bytes]] = []
    try:
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        token = _last_line(env, "apitoken", "--user", "ci", "--project", "pipeline", "--create")
        secret = _last_line(env, "webhooksecret", "--project", "pipeline")

        worker_log = folder / "worker.log"
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "dispatchlab.config",
                "worker",
                "--loglevel",
                "INFO",
                "--concurrency",
                "2",
                "--hostname",
                f"pipeline-{run_id}@%h",
                "--without-mingle",
                "--without-gossip",
            ],
            cwd=ROOT,
            env=env,
            stdout=worker_log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,  # signals go to the worker's main process only
        )
        processes.append(worker)
        port = _free_port()
        web_log = folder / "web.log"
        web = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "dispatchlab.config.wsgi",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                "2",
                "--threads",
                "4",
                "--timeout",
                "120",
            ],
            cwd=ROOT,
            env=env,
            stdout=web_log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        processes.append(web)
        _wait_until(lambda: b"ready." in worker_log.read_bytes(), "the Celery worker", 60, worker_log)

        def web_ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/schema/", timeout=2):
                    return True
            except OSError:
                return False

        _wait_until(web_ready, "gunicorn", 60, web_log)
        yield Stack(
            base_url=f"http://127.0.0.1:{port}",
            token=token,
            webhook_secret=secret,
            database_url=database_url,
            queue=queue,
            env=env,
            worker=worker,
            worker_log=worker_log,
            processes=processes,
        )
    finally:
        for process in processes:
            _stop(process)
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(match=f"*{run_id}*"):
            client.delete(key)
        for key in client.scan_iter(match="_kombu.binding.*"):
            for member in client.smembers(key):
                if run_id.encode() in member:
                    client.srem(key, member)


def _last_line(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture
def crash_log() -> bytes:
    return (DATA / "sglang_oom.log").read_bytes()
