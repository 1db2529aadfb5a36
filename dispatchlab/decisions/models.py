"""Decision records of a project (DR-7), their links to failures, and the history of every change.

Links are rows, not JSON lists, so "which records concern fingerprint X or signature Y" is an indexed
query on every report page. Groups are linked by fingerprint, not by row: a group left without reports is
deleted and comes back with the next report of that crash, and the record must still find it.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from dispatchlab.core.decisions import DecisionStatus
from dispatchlab.reports.models import Project, Report


class Decision(models.Model):
    class Status(models.TextChoices):
        PROPOSED = DecisionStatus.PROPOSED.value, "proposed"
        ACCEPTED = DecisionStatus.ACCEPTED.value, "accepted"
        REJECTED = DecisionStatus.REJECTED.value, "rejected"
        SUPERSEDED = DecisionStatus.SUPERSEDED.value, "superseded"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="decisions")
    number = models.PositiveIntegerField()  # DR-<number>, a sequence per project
    title = models.CharField(max_length=300)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PROPOSED)
    # Markdown, rendered with dispatchlab.decisions.markdown
    context = models.TextField(blank=True)
    decision = models.TextField(blank=True)
    consequences = models.TextField(blank=True)
    # [{"what": "`--speculative-moe-runner-backend triton`", "outcome": "same crash, ..."}]
    alternatives = models.JSONField(default=list, blank=True)
    # {"flashinfer": ">=0.7"}: PEP 440 specifiers by package (dispatchlab.core.decisions.REVISIT_PACKAGES)
    revisit_when = models.JSONField(default=dict, blank=True)
    superseded_by = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="supersedes"
    )
    # Set by the first log of the project that shows a version meeting revisit_when; a changed
    # revisit_when clears it.
    stale = models.BooleanField(default=False)
    stale_reason = models.CharField(max_length=500, blank=True)
    stale_since = models.DateTimeField(null=True, blank=True)
    stale_report = models.ForeignKey(
        Report, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="decisions"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    status_changed_at = models.DateTimeField(default=timezone.now)  # "Accepted 2026-11-02"

    class Meta:
        ordering = ["project", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["project", "number"], name="decision_unique_project_number")
        ]
        indexes = [models.Index(fields=["project", "status"], name="decision_project_status")]

    def __str__(self) -> str:
        return f"{self.label}: {self.title}"

    @property
    def label(self) -> str:
        return f"DR-{self.number}"


class DecisionLink(models.Model):
    class Kind(models.TextChoices):
        GROUP = "group", "failure group (fingerprint)"
        SIGNATURE = "signature", "signature (id)"
        REPORT = "report", "report (id)"
        UPSTREAM = "upstream", "upstream issue (URL)"

    decision = models.ForeignKey(Decision, on_delete=models.CASCADE, related_name="links")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    target = models.CharField(max_length=500)  # a fingerprint, signature id, report id or URL
    position = models.PositiveSmallIntegerField(default=0)  # the order people gave

    class Meta:
        ordering = ["decision", "kind", "position"]
        constraints = [
            models.UniqueConstraint(
                fields=["decision", "kind", "target"], name="decisionlink_unique_decision_kind_target"
            )
        ]
        indexes = [models.Index(fields=["kind", "target"], name="decisionlink_kind_target")]

    def __str__(self) -> str:
        return f"{self.kind} {self.target}"


class DecisionEdit(models.Model):
    """One change of a record: who (none for a change an upload made), when, and each changed field's
    value before and after: {"status": {"from": "proposed", "to": "accepted"}}."""

    class Kind(models.TextChoices):
        CREATED = "created", "created"
        EDITED = "edited", "edited"
        STALE = "stale", "turned stale"

    decision = models.ForeignKey(Decision, on_delete=models.CASCADE, related_name="edits")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    at = models.DateTimeField(default=timezone.now)
    changes = models.JSONField(default=dict)

    class Meta:
        ordering = ["decision", "at", "id"]

    def __str__(self) -> str:
        return f"{self.decision_id} {self.kind} at {self.at:%Y-%m-%d %H:%M}"
