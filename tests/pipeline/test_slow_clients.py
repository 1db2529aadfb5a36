"""Slow clients against the production-shaped web server (uvicorn, as `dispatchlab.stack` and compose run it).

Behind gunicorn's sync workers, four anonymous clients sending a large body one byte a second held every
worker and the site stopped answering (issue 11, item 2). Here 50 such clients trickle bodies into the
login form and the CI webhook while a reader keeps loading pages: each page must still come within a
few seconds.
"""

from __future__ import annotations

import contextlib
import socket
import time
import urllib.request
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.pipeline

SLOW_CLIENTS = 50
TRICKLE_SECONDS = 20
GET_WITHIN_SECONDS = 3.0
# Requests that pass every check made from the headers, so the server does wait for their bodies
# (the default body deadline gives them DISPATCHLAB_BODY_GRACE_SECONDS, longer than this test).
TARGETS = (
    ("/accounts/login/", "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 60000\r\n"),
    (
        "/api/v1/hooks/ci",
        "Content-Type: multipart/form-data; boundary=xyz\r\nContent-Length: 1000000\r\n"
        f"X-Dispatchlab-Project: pipeline\r\nX-Dispatchlab-Signature: sha256={'0' * 64}\r\n",
    ),
)


def _open_slow_client(host: str, port: int, target: tuple[str, str]) -> socket.socket:
    path, headers = target
    sock = socket.create_connection((host, port), timeout=10)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{headers}\r\n".encode())
    return sock


def _timed_get(url: str) -> float:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=30) as response:
        response.read()
        assert response.status == 200
    return time.monotonic() - started


def test_fifty_slow_body_clients_leave_pages_answering(stack):
    address = urlsplit(stack.base_url)
    host, port = address.hostname, address.port
    clients = [_open_slow_client(host, port, TARGETS[n % len(TARGETS)]) for n in range(SLOW_CLIENTS)]
    waits: list[float] = []
    try:
        deadline = time.monotonic() + TRICKLE_SECONDS
        while time.monotonic() < deadline:
            for client in clients:
                client.sendall(b"a")  # one byte a second each: every one of them still talking
            waits.append(_timed_get(stack.base_url + "/accounts/login/"))
            waits.append(_timed_get(stack.base_url + "/api/schema/"))
            time.sleep(max(0.0, 1 - waits[-1] - waits[-2]))
        still_open = 0
        for client in clients:
            with contextlib.suppress(OSError):
                client.sendall(b"a")
                still_open += 1
    finally:
        for client in clients:
            client.close()
    assert still_open == SLOW_CLIENTS, "the server dropped slow clients: the test did not hold them"
    assert len(waits) >= TRICKLE_SECONDS, waits
    assert max(waits) < GET_WITHIN_SECONDS, f"slowest page {max(waits):.2f}s: {sorted(waits)[-5:]}"


# ---------------------------------------------------------------- issue 16, item 9c: deadlines

HEADER_SECONDS = 2
BODY_GRACE_SECONDS = 2
GIVE_UP_SECONDS = 30  # far past both deadlines: a server that never cuts the client off fails here


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory: pytest.TempPathFactory):
    """uvicorn as `dispatchlab.stack` runs it, on the embedded defaults, with short read deadlines."""
    from dispatchlab.stack import (
        free_port,
        manage,
        stack_env,
        start_process,
        stop_process,
        wait_until,
        web_command,
    )

    folder = tmp_path_factory.mktemp("strict")
    env = stack_env(
        data_dir=folder,
        DISPATCHLAB_SECRET_KEY="slow-clients-" + "x" * 40,
        DISPATCHLAB_ALLOWED_HOSTS="127.0.0.1",
        DISPATCHLAB_HEADER_TIMEOUT_SECONDS=str(HEADER_SECONDS),
        DISPATCHLAB_BODY_GRACE_SECONDS=str(BODY_GRACE_SECONDS),
        DISPATCHLAB_BODY_MIN_BYTES_PER_SECOND="1000",
    )
    env.pop("DISPATCHLAB_DATABASE_URL", None)
    env.pop("DISPATCHLAB_BROKER_URL", None)
    manage(env, "migrate", "-v0")
    port = free_port()
    process = start_process(
        web_command(host="127.0.0.1", port=port, workers=1), env=env, log=folder / "web.log"
    )
    try:
        wait_until(lambda: _connects(port), "uvicorn", timeout=60, log=folder / "web.log")
        yield port
    finally:
        stop_process(process)


def _connects(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _rest_of(sock: socket.socket, answer: bytes) -> bytes:
    """The whole answer once its first bytes came: the head and the body may arrive in two packets."""
    sock.settimeout(5)
    while True:
        try:
            more = sock.recv(65536)
        except (TimeoutError, ConnectionResetError):
            return answer
        if not more:
            return answer
        answer += more


def _dribble_until_cut(sock: socket.socket, data: bytes) -> bytes:
    """Send `data` a byte every 0.2 s (then nothing) until the server answers or closes; what it said."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + GIVE_UP_SECONDS
    remaining = data
    while time.monotonic() < deadline:
        try:
            answer = sock.recv(65536)
            return _rest_of(sock, answer) if answer else b"(closed)"
        except TimeoutError:
            pass
        except ConnectionResetError:
            return b"(reset)"
        if remaining:
            try:
                sock.sendall(remaining[:1])
            except OSError:
                return b"(closed)"
            remaining = remaining[1:]
    raise AssertionError(f"the server still held the connection after {GIVE_UP_SECONDS}s")


def test_a_client_dribbling_its_headers_is_cut_off(strict_server):
    with socket.create_connection(("127.0.0.1", strict_server), timeout=10) as sock:
        head = b"GET /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Padding: " + b"a" * 1000
        answer = _dribble_until_cut(sock, head)
    assert answer.startswith(b"HTTP/1.1 408") or answer in (b"(closed)", b"(reset)"), answer[:200]


def test_a_client_that_opens_a_connection_and_says_nothing_is_cut_off(strict_server):
    with socket.create_connection(("127.0.0.1", strict_server), timeout=10) as sock:
        answer = _dribble_until_cut(sock, b"")
    assert answer.startswith(b"HTTP/1.1 408") or answer in (b"(closed)", b"(reset)"), answer[:200]


def test_a_client_dribbling_its_body_is_answered_408(strict_server):
    with socket.create_connection(("127.0.0.1", strict_server), timeout=10) as sock:
        sock.sendall(
            b"POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 5000\r\n\r\n"
        )
        answer = _dribble_until_cut(sock, b"u" * 5000)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"bytes a second" in answer, answer[:400]
