"""Webhook endpoints of a project, the events sent to them, each delivery and each of its attempts; and
whether a failure group is closed (by a confirmed fix or an accepted decision), so a new report in it
can be told apart as a group coming back.

Status lives on the rows: a Delivery is pending -> sending -> delivered | failed | skipped, an Endpoint
is paused (by a person, or by itself after DISPATCHLAB_NOTIFY_PAUSE_AFTER failed deliveries in a row).
"""

from __future__ import annotations

import secrets
import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from dispatchlab.notify.payloads import EndpointKind, EventKind
from dispatchlab.reports.models import FailureGroup, Project, Report


def new_endpoint_secret() -> str:
    return secrets.token_urlsafe(32)


class Endpoint(models.Model):
    """A URL a project's events are POSTed to."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="notify_endpoints")
    name = models.CharField(max_length=100, blank=True)  # "#inference-oncall", for people
    url = models.CharField(max_length=2000)  # checked by services.endpoint_url_problem
    kind = models.CharField(
        max_length=10, choices=[(k.value, k.label) for k in EndpointKind], default=EndpointKind.GENERIC.value
    )
    events = models.JSONField(default=list)  # EventKind values it is subscribed to
    # The HMAC key of X-Dispatchlab-Signature. Kept as is: every delivery signs with it.
    secret = models.CharField(max_length=100, default=new_endpoint_secret)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    # Set while paused: deliveries of new events are recorded as skipped.
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_reason = models.CharField(max_length=300, blank=True)  # "after 5 failed deliveries in a row"
    consecutive_failures = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["project", "created_at", "id"]

    def __str__(self) -> str:
        return self.name or self.url

    @property
    def is_paused(self) -> bool:
        return self.paused_at is not None

    def subscribed(self, kind: str) -> bool:
        return kind == EventKind.TEST or kind in (self.events or [])


class Event(models.Model):
    """Something that happened in a project and was sent to at least one endpoint."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="notify_events")
    kind = models.CharField(max_length=30, choices=[(k.value, k.label) for k in EventKind])
    occurred_at = models.DateTimeField(default=timezone.now)
    payload = models.JSONField(default=dict)  # the generic body (payloads.py), built once
    group = models.ForeignKey(
        FailureGroup, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-occurred_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} in {self.project_id} at {self.occurred_at:%Y-%m-%d %H:%M}"


class Delivery(models.Model):
    """One event to one endpoint: retried as one delivery, attempt after attempt."""

    class Status(models.TextChoices):
        PENDING = "pending", "pending"  # queued, or waiting for its next attempt
        SENDING = "sending", "sending"  # claimed by a worker
        DELIVERED = "delivered", "delivered"
        FAILED = "failed", "failed"  # gave up: no attempts left, or refused for good (4xx)
        SKIPPED = "skipped", "skipped"  # the endpoint was paused

    FINISHED = (Status.DELIVERED, Status.FAILED, Status.SKIPPED)

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="deliveries")
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries")
    uuid = models.UUIDField(default=uuid.uuid4, unique=True)  # X-Dispatchlab-Delivery
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    # When the next attempt is due (the task is sent with this countdown); the sweep re-sends a
    # pending delivery well past it, in case the broker lost the message.
    next_attempt_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    claim_token = models.CharField(max_length=32, blank=True)
    error = models.TextField(blank=True)  # the last attempt's error, or why it was skipped

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="delivery_status_next")]

    def __str__(self) -> str:
        return f"delivery {self.uuid} ({self.status})"


class Attempt(models.Model):
    """One HTTP request of a delivery, as it went."""

    class Outcome(models.TextChoices):
        OK = "ok", "delivered"
        RETRY = "retry", "failed, will retry"
        FAILED = "failed", "failed"

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_rows")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField(default=timezone.now)
    duration_ms = models.PositiveIntegerField(default=0)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    # connection refused, timed out, HTTP 500 ... in our words: what the endpoint answered beyond its
    # status is never stored, it could be an internal service's data shown to every member
    error = models.CharField(max_length=500, blank=True)
    outcome = models.CharField(max_length=10, choices=Outcome.choices)

    class Meta:
        ordering = ["delivery", "number"]
        constraints = [models.UniqueConstraint(fields=["delivery", "number"], name="attempt_unique_number")]


class GroupClosure(models.Model):
    """Whether a failure group is closed, and why. A report created after the close that lands in the
    group reopens it (the group "came back"). The row outlives reopenings: it keeps the last reason."""

    class Kind(models.TextChoices):
        FIX_CONFIRMED = "fix_confirmed", "a confirmed fix"
        DECISION_ACCEPTED = "decision_accepted", "an accepted decision"

    group = models.OneToOneField(FailureGroup, on_delete=models.CASCADE, related_name="closure")
    closed_at = models.DateTimeField(null=True, blank=True)  # None: open
    closed_kind = models.CharField(max_length=20, choices=Kind.choices, blank=True)
    closed_reason = models.CharField(max_length=500, blank=True)  # "fix confirmed by confirm run 7"
    reopened_at = models.DateTimeField(null=True, blank=True)
    reopened_by = models.ForeignKey(
        Report, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    times_reopened = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        state = f"closed {self.closed_at:%Y-%m-%d}" if self.closed_at else "open"
        return f"group {self.group_id}: {state}"
