"""Projects, their members and tokens, uploaded reports and the failure groups they fall into.

Status lives on the Report row (queued -> parsing -> done | failed); Celery only carries ids.
"""

from __future__ import annotations

import secrets
from datetime import datetime
from pathlib import PurePath
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


def new_webhook_secret() -> str:
    return secrets.token_urlsafe(32)


class Project(models.Model):
    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=100, unique=True)
    webhook_secret = models.CharField(max_length=100, default=new_webhook_secret)
    created_at = models.DateTimeField(default=timezone.now)
    # None: DISPATCHLAB_PROJECT_QUOTA_BYTES / DISPATCHLAB_RETENTION_DAYS; 0: no quota / keep forever.
    quota_bytes = models.BigIntegerField(null=True, blank=True)
    retention_days = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        MEMBER = "member", "member"
        VIEWER = "viewer", "viewer"  # reads reports, cannot upload

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "project"], name="membership_unique_user_project")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


class ApiToken(models.Model):
    """A Bearer token for one user in one project. Only a hash of the key is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_tokens")
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16)  # shown to people to tell tokens apart
    read_only = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)  # None: never
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user} in {self.project}{', read-only' if self.read_only else ''})"

    def is_expired(self, now: datetime | None = None) -> bool:
        return self.expires_at is not None and self.expires_at <= (now or timezone.now())


class FailureGroup(models.Model):
    """Reports of one project with the same crash fingerprint."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="failure_groups")
    fingerprint = models.CharField(max_length=64)
    title = models.CharField(max_length=300, blank=True)
    failure_class = models.CharField(max_length=40, blank=True)
    count = models.PositiveIntegerField(default=0)
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-last_seen"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "fingerprint"], name="failuregroup_unique_project_fingerprint"
            )
        ]

    def __str__(self) -> str:
        return self.title or self.fingerprint


class Report(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued", "queued"
        PARSING = "parsing", "parsing"
        DONE = "done", "done"
        FAILED = "failed", "failed"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="reports")
    title = models.CharField(max_length=300, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    progress = models.FloatField(default=0.0)  # percent, 0..100, while parsing
    error = models.TextField(blank=True)  # why it failed, for people
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="reports"
    )
    created_at = models.DateTimeField(default=timezone.now)
    enqueued_at = models.DateTimeField(null=True, blank=True)  # last time a task was sent for it
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The claim: set by the conditional UPDATE that starts a parse, refreshed by progress updates.
    claimed_at = models.DateTimeField(null=True, blank=True)
    claim_token = models.CharField(max_length=32, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    parse_seconds = models.FloatField(null=True, blank=True)

    checksum = models.CharField(max_length=64)  # sha256 over the uploaded bytes, in order
    total_bytes = models.BigIntegerField(default=0)

    document = models.JSONField(null=True, blank=True)  # the `match` document of docs/contract.md
    # Denormalised from the document, for lists and filters.
    failure_class = models.CharField(max_length=40, blank=True, db_index=True)
    top_match_id = models.CharField(max_length=200, blank=True)
    top_match_title = models.CharField(max_length=300, blank=True)
    fingerprint = models.CharField(max_length=64, blank=True)
    server = models.CharField(max_length=20, blank=True)
    server_version = models.CharField(max_length=100, blank=True)
    gpu_name = models.CharField(max_length=200, blank=True)
    arch = models.CharField(max_length=20, blank=True)
    model_name = models.CharField(max_length=300, blank=True)
    outcome = models.CharField(max_length=20, blank=True)
    kb_digest = models.CharField(max_length=64, blank=True)
    # {"attention_backend": "fa3", ..., "draft_attention_backend": "triton"}: main keys as they are,
    # draft keys prefixed "draft_", so `backend_values__attention_backend="fa3"` filters.
    backend_values = models.JSONField(default=dict, blank=True)
    launch_command = models.TextField(blank=True)

    # Set when a CI webhook created the report.
    ci_job = models.CharField(max_length=300, blank=True)
    ci_url = models.URLField(max_length=1000, blank=True)
    ci_commit = models.CharField(max_length=100, blank=True)
    delivery_id = models.CharField(max_length=200, null=True, blank=True)

    group = models.ForeignKey(
        FailureGroup, null=True, blank=True, on_delete=models.SET_NULL, related_name="reports"
    )
    # The worker's normalised plain-text copy and its sparse line index (absolute paths under MEDIA_ROOT);
    # read them with dispatchlab.reports.selectors.report_line_index(report).
    text_path = models.CharField(max_length=500, blank=True)
    index_path = models.CharField(max_length=500, blank=True)
    line_count = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["project", "checksum"], name="report_unique_project_checksum"),
            models.UniqueConstraint(
                fields=["project", "delivery_id"],
                condition=Q(delivery_id__isnull=False),
                name="report_unique_project_delivery",
            ),
        ]
        indexes = [
            models.Index(fields=["project", "-created_at"], name="report_project_created"),
            models.Index(fields=["status", "claimed_at"], name="report_status_claimed"),
        ]

    def __str__(self) -> str:
        return self.title or f"report {self.pk}"

    @property
    def is_finished(self) -> bool:
        return self.status in (self.Status.DONE, self.Status.FAILED)

    def document_field(self, key: str, default: Any = None) -> Any:
        return (self.document or {}).get(key, default)


def report_file_upload_to(instance: ReportFile, filename: str) -> str:
    report = instance.report
    name = PurePath(filename).name or "upload.log"
    return f"uploads/{report.project.slug}/{report.checksum[:2]}/{report.checksum[:16]}/{instance.position}-{name}"


class ReportFile(models.Model):
    """One uploaded file, kept as it arrived. Several files of a report are read in `position` order."""

    report = models.ForeignKey(Report, on_delete=models.CASCADE, related_name="files")
    file = models.FileField(upload_to=report_file_upload_to, max_length=500)
    original_name = models.CharField(max_length=300)
    size = models.BigIntegerField()
    position = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["report", "position"]
        constraints = [
            models.UniqueConstraint(fields=["report", "position"], name="reportfile_unique_report_position")
        ]

    def __str__(self) -> str:
        return self.original_name


class Redaction(models.Model):
    """A person's request to blank a secret out of a report: run by the `reports.redact` task, one at a
    time per report, oldest first. The pattern is kept only until the redaction ran: it usually spells
    the secret it removes."""

    class Status(models.TextChoices):
        QUEUED = "queued", "queued"
        RUNNING = "running", "running"
        DONE = "done", "done"
        REFUSED = "refused", "refused"  # bad pattern, ran too long, log unreadable: `reason` says

    FINISHED = (Status.DONE, Status.REFUSED)

    report = models.ForeignKey(Report, on_delete=models.CASCADE, related_name="redactions")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    reason = models.TextField(blank=True)
    pattern = models.TextField(blank=True)
    first_line = models.PositiveBigIntegerField(null=True, blank=True)
    last_line = models.PositiveBigIntegerField(null=True, blank=True)
    redacted_lines = models.PositiveBigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    claimed_at = models.DateTimeField(null=True, blank=True)
    claim_token = models.CharField(max_length=32, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["report", "id"]
        indexes = [models.Index(fields=["report", "status"], name="redaction_report_status")]

    def __str__(self) -> str:
        return f"redaction {self.pk} of report {self.report_id} ({self.status})"

    @property
    def what(self) -> str:
        """For people, without the pattern."""
        if self.first_line is not None:
            return f"lines {self.first_line}-{self.last_line}"
        return "a pattern"
