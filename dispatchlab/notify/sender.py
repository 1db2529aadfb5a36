"""One webhook POST within a total deadline, to an address resolved and checked once. Django-free.

urllib's timeout is per socket operation: a server answering one byte every few seconds holds it for
as long as it likes. Here the deadline covers the lookup, the connection, TLS, the request and the
answer's headers: when it passes, the connection is shut down under whatever is waiting on it. Only the
status (and Retry-After) is read; the body an endpoint answers with is never read, stored or shown.
"""

from __future__ import annotations

import contextlib
import http
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from dispatchlab.notify.addresses import AddressRefused, IPAddress, IPNetwork, checked_addresses


@dataclass(frozen=True)
class HttpAnswer:
    status: int | None  # None: no HTTP answer (refused address, connection error, timeout)
    error: str  # "" when 2xx
    seconds: float
    retry_after: float | None = None
    # The whole request went out: without an answer, the endpoint may still have received it.
    sent: bool = False
    refused: bool = False  # the address is not one webhooks may reach: not worth retrying


class Deadline:
    """The end of one attempt. Every blocking step gets the time left as its timeout, and a timer
    shuts the connection down at the end, which wakes a read that keeps receiving a byte at a time."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.expired = False
        self._lock = threading.Lock()
        self._watched: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def remaining(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        return left

    def watch(self, sock: socket.socket) -> None:
        # A duplicate descriptor: TLS takes the original over, shutting down either ends the connection.
        with self._lock:
            self._watched.append(sock.dup())
            if self.expired:
                self._shut()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            self._shut()

    def _shut(self) -> None:
        for sock in self._watched:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            for sock in self._watched:
                sock.close()
            self._watched.clear()


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to addresses resolved and checked beforehand, never to what a second lookup says; the
    Host header (and for HTTPS the SNI and the certificate check) keep the URL's host name."""

    def __init__(self, host: str, port: int, *, addresses: Sequence[IPAddress], deadline: Deadline) -> None:
        super().__init__(host, port, timeout=deadline.remaining())
        self._addresses = addresses
        self._deadline = deadline

    def _open(self) -> socket.socket:
        failure: OSError = OSError("no address to connect to")
        for address in self._addresses:
            try:
                sock = socket.create_connection((str(address), self.port), timeout=self._deadline.remaining())
            except OSError as error:
                failure = error
                continue
            self._deadline.watch(sock)
            return sock
        raise failure

    def connect(self) -> None:
        self.sock = self._open()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _PinnedHTTPSConnection(_PinnedHTTPConnection):
    default_port = http.client.HTTPS_PORT

    def connect(self) -> None:
        context = ssl.create_default_context()
        self.sock = context.wrap_socket(self._open(), server_hostname=self.host)


def _resolve_in_time(
    host: str, port: int, allowed: Sequence[IPNetwork], deadline: Deadline
) -> list[IPAddress]:
    """checked_addresses, given up on at the deadline (getaddrinfo itself cannot be interrupted)."""
    outcome: list[list[IPAddress] | BaseException] = []

    def lookup() -> None:
        try:
            outcome.append(checked_addresses(host, port, allowed))
        except (OSError, UnicodeError, AddressRefused) as error:
            outcome.append(error)

    thread = threading.Thread(target=lookup, daemon=True)
    thread.start()
    thread.join(deadline.remaining())
    if not outcome:
        raise TimeoutError("the name lookup did not end in time")
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def resolve_checked(host: str, port: int, allowed: Sequence[IPNetwork], *, timeout: float) -> list[IPAddress]:
    """checked_addresses, given up on after `timeout` seconds (TimeoutError): for a web request, which a
    member's slow name server must not hold."""
    deadline = Deadline(timeout)
    try:
        return _resolve_in_time(host, port, allowed, deadline)
    finally:
        deadline.close()


def _http_error(status: int) -> str:
    try:
        return f"HTTP {status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    with contextlib.suppress(ValueError):
        return max(0.0, float(value.strip()))
    return None  # an HTTP date: the exponential backoff will do


def _describe(error: BaseException) -> str:
    """What went wrong, in our words: nothing the endpoint sent (a status line of an internal service
    that does not speak HTTP could hold anything) is quoted."""
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"TLS certificate not accepted: {error.verify_message}"[:300]
    if isinstance(error, ssl.SSLError):
        return f"TLS failed ({error.reason or type(error).__name__})"
    if isinstance(error, http.client.HTTPException):
        return f"the answer is not HTTP ({type(error).__name__})"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror[:300]
    return type(error).__name__


def http_post(
    url: str, body: bytes, headers: dict[str, str], *, timeout: float, allowed: Sequence[IPNetwork]
) -> HttpAnswer:
    """One POST, ended after `timeout` seconds in all; never raises for what the network, the resolver
    or the server does."""
    started = time.monotonic()
    deadline = Deadline(timeout)
    parts = urlsplit(url)
    host = parts.hostname or ""
    https = parts.scheme.lower() == "https"
    port = parts.port or (http.client.HTTPS_PORT if https else http.client.HTTP_PORT)
    target = urlunsplit(("", "", parts.path or "/", parts.query, ""))
    step = f"resolving {host}"
    sent = False
    connection: _PinnedHTTPConnection | None = None
    try:
        addresses = _resolve_in_time(host, port, allowed, deadline)
        connection_class = _PinnedHTTPSConnection if https else _PinnedHTTPConnection
        connection = connection_class(host, port, addresses=addresses, deadline=deadline)
        step = "connecting"
        connection.connect()
        step = "sending"
        connection.request("POST", target, body=body, headers=headers)
        sent, step = True, "waiting for the answer"
        response = connection.getresponse()
        status = response.status
        error = "" if 200 <= status < 300 else _http_error(status)
        retry_after = _retry_after(response.getheader("Retry-After"))
        return HttpAnswer(status, error, time.monotonic() - started, retry_after, sent=True)
    except AddressRefused as refused:
        return HttpAnswer(None, f"refused: {refused}", time.monotonic() - started, refused=True)
    except (OSError, UnicodeError, http.client.HTTPException, ValueError) as error:
        if deadline.expired or isinstance(error, TimeoutError):
            text = f"timed out after {timeout:g} s {step}"
        elif isinstance(error, socket.gaierror | UnicodeError):
            text = f"{host} does not resolve"
        else:
            text = _describe(error)
        return HttpAnswer(None, text, time.monotonic() - started, sent=sent)
    finally:
        if connection is not None:
            connection.close()
        deadline.close()
