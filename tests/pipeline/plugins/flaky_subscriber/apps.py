from __future__ import annotations

from pathlib import Path

from django.apps import AppConfig
from django.conf import settings

from dispatchlab.events import ReportParsed

FAILURES_PER_REPORT = 2


def attempts_file(data_dir: Path, report_id: int) -> Path:
    return data_dir / "flaky-subscriber" / f"{report_id}.attempts"


def report_parsed(event: ReportParsed) -> None:
    """Counts its calls in a file (the worker's processes share nothing else) and raises until it has
    failed FAILURES_PER_REPORT times for this report."""
    report_id = event.report_id
    path = attempts_file(Path(settings.DATA_DIR), report_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as attempts:
        attempts.write("attempt\n")
    if path.read_text().count("attempt") <= FAILURES_PER_REPORT:
        raise RuntimeError(f"flaky subscriber fails on report {report_id}")
    with path.open("a") as attempts:
        attempts.write("handled\n")


class FlakySubscriberConfig(AppConfig):
    name = "flaky_subscriber"

    def ready(self) -> None:
        from dispatchlab import events

        events.subscribe(events.ReportParsed, report_parsed)
