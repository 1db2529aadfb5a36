"""Start the dashboard's processes: the one way the devserver, the pipeline tests and the benchmarks do it.

A stack is a web server (uvicorn serving `dispatchlab.config.asgi`, the production shape: a slow
client holds a coroutine, not a worker), a Celery worker that parses (`celery -A dispatchlab.config
worker -Q <queue>`), a notify worker that sends the webhooks (`-Q <queue>.notify`: a slow endpoint holds
one of its processes, never a parsing one) and beat, embedded in the parsing worker (`--beat`, one
machine) or as a process of its own (as in compose).
Every process runs in a session of its own, so a terminal's Ctrl-C reaches only the caller, which
stops them in order, and (on Linux) receives SIGTERM when its parent dies, so a killed caller leaves
no orphan. Management commands run as `python -m django`, so an installed package works as well as
a checkout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from dispatchlab.notify import notify_queue

ASGI_APP = "dispatchlab.config.asgi:application"
DEADLINE_PROTOCOL = "dispatchlab.security.deadlines:DeadlineH11Protocol"
STOP_SECONDS = 20.0
Beat = Literal["embedded", "separate", "none"]


class StackError(RuntimeError):
    """A process of the stack did not start, or a management command failed; the message says why."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stack_env(
    *,
    data_dir: Path,
    database_url: str | None = None,
    broker_url: str | None = None,
    queue: str | None = None,
    **extra: str,
) -> dict[str, str]:
    """The caller's environment with what every process of one stack must share. DEBUG is off unless
    the caller's environment says otherwise: a missing page must not list the URL patterns (static
    files are served by WhiteNoise either way)."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "dispatchlab.config.settings",
        "DISPATCHLAB_DATA_DIR": str(data_dir),
        "DISPATCHLAB_DEBUG": os.environ.get("DISPATCHLAB_DEBUG", "false"),
        "PYTHONUNBUFFERED": "1",
    }
    for name, value in (
        ("DISPATCHLAB_DATABASE_URL", database_url),
        ("DISPATCHLAB_BROKER_URL", broker_url),
        ("DISPATCHLAB_QUEUE", queue),
    ):
        if value is not None:
            env[name] = value
    env.update(extra)
    return env


def manage(env: dict[str, str], *args: str) -> str:
    """Run a management command; its standard output, or StackError with its standard error."""
    done = subprocess.run(
        [sys.executable, "-m", "django", *args], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise StackError(f"manage.py {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def stack_queues(env: dict[str, str]) -> tuple[str, str]:
    """The parsing queue and the notify queue of the stack `env` describes (as settings name them)."""
    queue = env.get("DISPATCHLAB_QUEUE", "dispatchlab")
    return queue, notify_queue(queue)


def worker_command(
    *, concurrency: int, hostname: str | None = None, beat: bool = False, queues: Sequence[str] = ()
) -> list[str]:
    command = [sys.executable, "-m", "celery", "-A", "dispatchlab.config", "worker", "--loglevel", "INFO"]
    command += ["--concurrency", str(concurrency), "--without-mingle", "--without-gossip"]
    if queues:
        command += ["--queues", ",".join(queues)]
    if hostname:
        command += ["--hostname", hostname]
    if beat:
        command.append("--beat")
    return command


def beat_command(*, schedule: Path) -> list[str]:
    return [
        *(sys.executable, "-m", "celery", "-A", "dispatchlab.config", "beat"),
        *("--loglevel", "INFO", "--schedule", str(schedule)),
    ]


def web_command(*, host: str, port: int, workers: int) -> list[str]:
    """uvicorn as production runs it (deploy/README.md): keep-alive connections closed after 5 s
    idle, a deadline for each request's headers (DEADLINE_PROTOCOL), forwarded headers left to
    DISPATCHLAB_TRUSTED_PROXIES (uvicorn would trust them from any local client), Django's ASGI app
    without the lifespan protocol it does not speak."""
    return [
        *(sys.executable, "-m", "uvicorn", ASGI_APP, "--host", host, "--port", str(port)),
        *("--workers", str(workers), "--timeout-keep-alive", "5", "--lifespan", "off", "--no-access-log"),
        *("--http", DEADLINE_PROTOCOL, "--no-proxy-headers"),
    ]


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: a parent killed with SIGKILL cannot stop it otherwise.
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    # A caller started with SIGINT ignored (`&` in a script) must not pass that on.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_process(
    command: Sequence[str], *, env: dict[str, str], log: Path | None
) -> subprocess.Popen[bytes]:
    """Start one process of the stack in its own session; its output goes to `log` (or ours)."""
    output: IO[bytes] | None = log.open("ab") if log else None
    try:
        return subprocess.Popen(
            list(command),
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT if output else None,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # callers start processes from their main thread
        )
    finally:
        if output:
            output.close()


def stop_process(process: subprocess.Popen[bytes], *, timeout: float = STOP_SECONDS) -> None:
    """SIGTERM to the process alone (a Celery worker stops its own pool; signalling the pool's
    processes directly can leave it waiting on them), then SIGKILL to its whole session."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # what is left of its session: pool children
    process.wait()


def wait_until(check: Callable[[], bool], what: str, *, timeout: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    raise StackError(f"{what} did not start within {timeout:.0f}s\n{tail}")


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


@dataclass
class Stack:
    """Running processes of one stack; `close()` (or leaving the `with` block) stops them in order:
    the web server first (no new uploads), then beat, then the workers (they finish their tasks)."""

    env: dict[str, str]
    base_url: str
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)

    def close(self) -> None:
        for name in ("web", "beat", "worker", "notify"):
            if name in self.processes:
                stop_process(self.processes[name])

    def exited(self) -> str | None:
        """The name of a process that exited by itself, if any."""
        return next((name for name, process in self.processes.items() if process.poll() is not None), None)

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def start_stack(
    env: dict[str, str],
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    web_workers: int = 2,
    concurrency: int = 2,
    beat: Beat = "embedded",
    worker_hostname: str | None = None,
    notify_concurrency: int = 1,
    log_dir: Path | None = None,
    timeout: float = 60,
) -> Stack:
    """Start the workers, beat and web on an already migrated database; wait until the web server
    answers (and, when logs go to `log_dir`, until the workers say they are ready). The notify worker
    is named after the parsing one (`notify-<worker_hostname>`)."""
    port = port or free_port()
    stack = Stack(env=env, base_url=f"http://{host}:{port}")

    def log(name: str) -> Path | None:
        if log_dir is None:
            return None
        stack.logs[name] = log_dir / f"{name}.log"
        return stack.logs[name]

    parse_queue, deliveries_queue = stack_queues(env)
    try:
        stack.processes["worker"] = start_process(
            worker_command(
                concurrency=concurrency,
                hostname=worker_hostname,
                beat=beat == "embedded",
                queues=[parse_queue],
            ),
            env=env,
            log=log("worker"),
        )
        stack.processes["notify"] = start_process(
            worker_command(
                concurrency=notify_concurrency,
                hostname=f"notify-{worker_hostname}" if worker_hostname else "notify@%h",
                queues=[deliveries_queue],
            ),
            env=env,
            log=log("notify"),
        )
        if beat == "separate":
            schedule = Path(env["DISPATCHLAB_DATA_DIR"]) / "celerybeat-schedule"
            stack.processes["beat"] = start_process(beat_command(schedule=schedule), env=env, log=log("beat"))
        # Under ASGI each request runs in a thread of its own: persistent connections would stay
        # open after their thread ends.
        web_env = {**env, "DISPATCHLAB_DB_CONN_MAX_AGE": "0"}
        stack.processes["web"] = start_process(
            web_command(host=host, port=port, workers=web_workers), env=web_env, log=log("web")
        )
        for name in ("worker", "notify"):
            if name in stack.logs:
                worker_log = stack.logs[name]
                wait_until(
                    lambda worker_log=worker_log: b"ready." in worker_log.read_bytes(),
                    f"the Celery {name} worker",
                    timeout=timeout,
                    log=worker_log,
                )
        wait_until(
            lambda: answers(stack.base_url + "/api/schema/"),
            "the web server",
            timeout=timeout,
            log=log("web"),
        )
    except BaseException:
        stack.close()
        raise
    return stack


# ---- scratch services for tests and benchmarks: a PostgreSQL database and Redis keys of one run


def create_database(admin_url: str, name: str) -> str:
    """Create database `name` on the server of `admin_url`; its URL."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return f"{admin_url.rpartition('/')[0]}/{name}"


def drop_database(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def forget_redis_keys(redis_url: str, marker: str) -> None:
    """Delete the queues and bindings whose names hold `marker` (a run id)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"*{marker}*"):
        client.delete(key)
    for key in client.scan_iter(match="_kombu.binding.*"):
        for member in client.smembers(key):
            if marker.encode() in member:
                client.srem(key, member)
    client.close()
