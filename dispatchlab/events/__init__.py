"""What happened, told to whoever listens: the apps' domain events.

The report pipeline (`reports`) and the apps built on it announce small typed events; an app that
wants to react subscribes a handler where it starts (its `AppConfig.ready()`), as paperless-ngx's
apps connect their handlers to `document_consumption_finished`. The one who announces knows nobody
who listens: `reports` imports none of `decisions`, `gpu`, `notify`.

Each subscriber runs after the announcing transaction commits, as a Celery task of its own
(`events.handle`, on the dashboard's queue): one that raises neither fails the announcer nor keeps
the others from running, and is retried (dispatchlab.taskpolicy.RETRY_SUBSCRIBER). A handler
therefore takes the event's primitives, reads what it needs from the database, and is safe to run
twice.

    ReportParsed          reports   -> decisions (records go stale, the document lists them),
                                       gpu (a confirm's output decides its outcome)
    FailureGroupOpened    reports   -> notify (group.new)
    FailureGroupRecurred  reports   -> notify (group.returned, when the group was closed)
    DecisionTurnedStale   decisions -> notify (decision.stale)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from django.db import transaction

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    """An event: JSON primitives only, so it travels through the broker as it is."""

    name: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ReportParsed(Event):
    """A report's analysis ended: `succeeded` when its document is stored, not when it failed."""

    name: ClassVar[str] = "report.parsed"
    report_id: int
    succeeded: bool


@dataclass(frozen=True)
class FailureGroupOpened(Event):
    """A freshly uploaded report is the first of a new failure group."""

    name: ClassVar[str] = "failure_group.opened"
    group_id: int
    report_id: int


@dataclass(frozen=True)
class FailureGroupRecurred(Event):
    """A freshly uploaded report landed in an existing failure group (not a re-match or a re-parse)."""

    name: ClassVar[str] = "failure_group.recurred"
    group_id: int
    report_id: int


@dataclass(frozen=True)
class DecisionTurnedStale(Event):
    """A decision record turned stale (once per staleness). `url`: the record's dashboard path."""

    name: ClassVar[str] = "decision.turned_stale"
    project_id: int
    record_id: int
    number: int
    title: str
    reason: str
    url: str


EVENTS: dict[str, type[Event]] = {
    kind.name: kind for kind in (ReportParsed, FailureGroupOpened, FailureGroupRecurred, DecisionTurnedStale)
}

E = TypeVar("E", bound=Event)
Handler = Callable[[Any], None]


@dataclass(frozen=True)
class Subscription:
    event: type[Event]
    handler: Handler

    @property
    def key(self) -> str:
        """The handler's name in task messages: a worker runs only handlers subscribed by its own apps."""
        return f"{self.handler.__module__}.{self.handler.__qualname__}"


_subscriptions: dict[str, Subscription] = {}


def subscribe(event: type[E], handler: Callable[[E], None]) -> None:
    """Call `handler(event)` after each announcement of this kind commits (idempotent per handler)."""
    subscription = Subscription(event, handler)
    _subscriptions[subscription.key] = subscription


def subscribers(event: type[Event]) -> list[Subscription]:
    return [s for s in _subscriptions.values() if s.event is event]


def announce(event: Event) -> None:
    """Tell every subscriber, each by a task of its own, once the caller's transaction commits (at once
    outside one). A broker that is down loses the news, never the caller's work (robust on_commit)."""
    for subscription in subscribers(type(event)):
        transaction.on_commit(lambda key=subscription.key: _send(key, event), robust=True)


def _send(key: str, event: Event) -> None:
    from dispatchlab.events.tasks import event_handle_task

    event_handle_task.delay(key, event.name, event.to_dict())


def handle(*, key: str, event_name: str, fields: dict[str, Any]) -> bool:
    """Run one subscriber on one event (the task's service). False when this process knows no such
    subscriber or event (a web and a worker of different versions): nothing to retry."""
    subscription = _subscriptions.get(key)
    kind = EVENTS.get(event_name)
    if subscription is None or kind is None or subscription.event is not kind:
        logger.error("no subscriber %s for event %s here; dropped", key, event_name)
        return False
    subscription.handler(kind(**fields))
    return True
