"""What decisions do when the report pipeline announces something (dispatchlab.events), subscribed in
DecisionsConfig.ready()."""

from __future__ import annotations

from dispatchlab.decisions.services import decisions_report_parsed
from dispatchlab.events import ReportParsed


def report_parsed(event: ReportParsed) -> None:
    """A parsed log may make records stale; its document lists the records linked to it. Safe to
    repeat: a record goes stale once, and the document's list is rewritten whole."""
    if event.succeeded:
        decisions_report_parsed(report_id=event.report_id)
