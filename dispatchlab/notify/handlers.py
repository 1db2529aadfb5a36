"""What notify does when the other apps announce something (dispatchlab.events), subscribed in
NotifyConfig.ready(); and the notification payloads a redaction reaches (dispatchlab.reports.copies).

Each handler runs after the announcing commit, as a task of its own, and may run twice (a retry, a
redelivered message): a group is announced new once, and a closed group reopens once.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from dispatchlab.events import DecisionTurnedStale, FailureGroupOpened, FailureGroupRecurred
from dispatchlab.notify.models import Event
from dispatchlab.notify.payloads import EventKind
from dispatchlab.notify.services import (
    event_payloads_of_report,
    event_payloads_replace,
    notify_decision_stale,
    notify_report_landed,
)
from dispatchlab.reports.models import FailureGroup, Report


def _landed(*, group_id: int, report_id: int, group_created: bool) -> None:
    with transaction.atomic():
        report = Report.objects.filter(id=report_id).first()
        if report is None or not FailureGroup.objects.filter(id=group_id).exists():
            return  # deleted meanwhile: no news
        if group_created and Event.objects.filter(group_id=group_id, kind=EventKind.GROUP_NEW).exists():
            return  # told already (this is a retry or a redelivered message)
        notify_report_landed(report=report, group_id=group_id, group_created=group_created)


def failure_group_opened(event: FailureGroupOpened) -> None:
    """A new failure group: group.new for the project's endpoints."""
    _landed(group_id=event.group_id, report_id=event.report_id, group_created=True)


def failure_group_recurred(event: FailureGroupRecurred) -> None:
    """A report in a known group: group.returned when the group had been closed."""
    _landed(group_id=event.group_id, report_id=event.report_id, group_created=False)


def decision_turned_stale(event: DecisionTurnedStale) -> None:
    notify_decision_stale(
        project=event.project_id,
        record_id=event.record_id,
        number=event.number,
        title=event.title,
        reason=event.reason,
        url=event.url,
    )


class EventPayloads:
    """Stored event payloads quote a report (its title, its crash) and its group."""

    def read(self, report: Report) -> dict[str, Any]:
        payloads = event_payloads_of_report(report_id=report.id, group_id=report.group_id)
        return {str(event_id): payload for event_id, payload in payloads.items()}

    def write(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        event_payloads_replace({int(key): value for key, value in after.items() if before.get(key) != value})

    def followers(self, report_id: int) -> list[int]:
        return []
