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
TARGETS = ("/accounts/login/", "/api/v1/hooks/ci")


def _open_slow_client(host: str, port: int, path: str) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=10)
    sock.sendall(
        (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000000\r\n\r\n"
        ).encode()
    )
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
