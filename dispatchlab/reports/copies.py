"""Copies of a report's text that other apps stored (a notification's payload, a confirm run's output),
which a redaction must reach in its own transaction.

A redaction (dispatchlab.reports.redaction) cannot be an event: the secret must leave every copy in
one commit, or a delivery could still send it. So an app that keeps such copies registers a holder
where it starts (`AppConfig.ready()`), and the redaction reads, redacts and writes them back through
it without importing the app.
"""

from __future__ import annotations

from typing import Any, Protocol

from dispatchlab.reports.models import Report


class QuotedCopies(Protocol):
    def read(self, report: Report) -> dict[str, Any]:
        """The stored texts that may quote the report, as JSON (every string in it is redacted)."""

    def write(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        """Store the redacted texts that changed (inside the redaction's transaction)."""

    def followers(self, report_id: int) -> list[int]:
        """Other reports that may print the same secret and get the same redaction (by pattern)."""


_holders: dict[str, QuotedCopies] = {}


def register_quoted_copies(name: str, holder: QuotedCopies) -> None:
    """`name` keys the holder's texts in the redaction's request (one per app, e.g. its label)."""
    _holders[name] = holder


def quoted_copies() -> dict[str, QuotedCopies]:
    return dict(sorted(_holders.items()))
