"""uvicorn's HTTP/1.1 protocol with a deadline for a request's headers.

uvicorn times out an idle keep-alive connection, but a connection that sends nothing yet, or its
headers a byte at a time, is held forever (issue 16, item 9c): no ASGI application sees it, since it
has no request yet. Run with `uvicorn --http dispatchlab.security.deadlines:DeadlineH11Protocol`:
the headers of each request must be complete within DISPATCHLAB_HEADER_TIMEOUT_SECONDS of the
connection opening (or of the previous answer), else the client gets a 408 and the connection closes.
The body's own deadline is EarlyRefusalASGI's (dispatchlab.security.early).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from django.conf import settings
from uvicorn.protocols.http.h11_impl import H11Protocol

TIMEOUT_ANSWER = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: 42\r\n\r\nthe request headers did not come in time\r\n"
)


class DeadlineH11Protocol(H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_seconds: float = settings.DISPATCHLAB_HEADER_TIMEOUT_SECONDS
        self.header_deadline: asyncio.TimerHandle | None = None

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        self.header_deadline = self.loop.call_later(self.header_seconds, self._headers_too_late)

    def _disarm_header_deadline(self) -> None:
        if self.header_deadline is not None:
            self.header_deadline.cancel()
            self.header_deadline = None

    def _serving(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._serving():  # the headers are in: the application has the request
            self._disarm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def _headers_too_late(self) -> None:
        self.header_deadline = None
        if self.transport.is_closing() or self._serving():
            return
        if self.conn.our_state is h11.IDLE and self.conn.their_state is h11.IDLE:
            self.transport.write(TIMEOUT_ANSWER)
        self.transport.close()
