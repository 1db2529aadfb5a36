"""GPU hosts (from heartbeats), confirm runs of a report's fixed launch, kernel probe runs, and the
confirmations a signature's fix has collected."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from dispatchlab.core.launch import REPRO_PREFIX, SERVER_OF_LAUNCHER
from dispatchlab.messaging.contract import HEARTBEAT_SECONDS, HOST_ALIVE_FACTOR
from dispatchlab.reports.models import Project, Report


def alive_since() -> Any:
    """Hosts heard from after this moment are alive."""
    return timezone.now() - timedelta(seconds=HEARTBEAT_SECONDS * HOST_ALIVE_FACTOR)


def evidence_words(*, stand_in: bool, launcher: str, gpu: str, weights: dict[str, Any]) -> str:
    kind = "kernel-level confirm" if stand_in else "server confirm"
    text = f"{kind} with {launcher}" + (f" on {gpu}" if gpu else "")
    if weights.get("kind"):
        text += f" ({weights['kind']} weights{', inferred' if weights.get('inferred') else ''})"
    return text


class GpuHost(models.Model):
    """A machine running `python -m worker`, as its last heartbeat described it."""

    name = models.CharField(max_length=200, unique=True)
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)
    stopped = models.BooleanField(default=False)  # said goodbye at shutdown
    busy = models.BooleanField(default=False)
    arches = models.JSONField(default=list)  # ["sm_90"]
    queues = models.JSONField(default=list)
    inventory = models.JSONField(default=dict)  # `python -m worker inventory --json`
    launchers = models.JSONField(default=list)
    model_roots = models.JSONField(default=list)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def alive(self) -> bool:
        return not self.stopped and self.last_seen >= alive_since()

    @property
    def gpus(self) -> list[dict[str, Any]]:
        return list(self.inventory.get("gpus") or [])

    @property
    def versions(self) -> dict[str, Any]:
        return dict(self.inventory.get("versions") or {})


class ConfirmRun(models.Model):
    """One run of a report's (fixed) launch on a GPU host of the report's arch."""

    class Status(models.TextChoices):
        WAITING_FOR_HOST = "waiting_for_host", "waiting for a host"
        QUEUED = "queued", "queued"
        RUNNING = "running", "running"
        PARSING = "parsing", "parsing the output"
        FIXED = "fixed", "fixed"
        STILL_FAILS = "still_fails", "still fails"
        GARBAGE = "garbage", "serves garbage"
        REFUSED = "refused", "refused"
        CANCELLED = "cancelled", "cancelled"

    FINISHED = (Status.FIXED, Status.STILL_FAILS, Status.GARBAGE, Status.REFUSED, Status.CANCELLED)
    CANCELLABLE = (Status.WAITING_FOR_HOST, Status.QUEUED, Status.RUNNING)

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="confirm_runs")
    report = models.ForeignKey(Report, on_delete=models.CASCADE, related_name="confirm_runs")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED)
    error = models.TextField(blank=True)

    arch = models.CharField(max_length=20, blank=True)
    queue = models.CharField(max_length=200)
    signature_id = models.CharField(max_length=200, blank=True)  # the diagnosis whose fix is tried
    launcher = models.CharField(max_length=100)
    args = models.JSONField(default=list)
    env = models.JSONField(default=dict)
    original_command = models.TextField(blank=True)
    fix_args = models.JSONField(default=dict)
    fix_env = models.JSONField(default=dict)
    probes = models.JSONField(default=list)  # probe names asked for
    job = models.JSONField(default=dict)  # the ConfirmJob message as sent

    host = models.ForeignKey(GpuHost, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    host_name = models.CharField(max_length=200, blank=True)
    argv = models.JSONField(default=list)  # what the worker ran
    result = models.JSONField(default=dict)  # the worker's ConfirmOutcome
    output_bytes = models.BigIntegerField(default=0)
    result_report = models.OneToOneField(
        Report, null=True, blank=True, on_delete=models.SET_NULL, related_name="confirm_of"
    )

    # Not stored: confirm_create sets it when a second confirm of the same launch joined this one.
    joined = False

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"confirm {self.pk} of report {self.report_id}"

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED

    @property
    def gpu_label(self) -> str:
        gpus = (self.result.get("inventory") or {}).get("gpus") or []
        if not gpus:
            return self.arch or ""
        return f"{gpus[0].get('name')} {gpus[0].get('arch') or ''}".strip()

    @property
    def is_stand_in(self) -> bool:
        """A repro program ran, not the server: kernel-level evidence, whatever the worker said."""
        identity = (self.result or {}).get("launcher_identity") or {}
        return self.launcher.startswith(REPRO_PREFIX) or identity.get("kind") == "stand-in"

    @property
    def evidence(self) -> str:
        """ "kernel" for a stand-in run, "server" for a run of the server itself."""
        return "kernel" if self.is_stand_in else "server"

    @property
    def launcher_identity(self) -> dict[str, Any]:
        """What ran, as the worker recorded it; before it answered, what the launch names."""
        identity = (self.result or {}).get("launcher_identity")
        if isinstance(identity, dict) and identity.get("label"):
            return identity
        if self.launcher.startswith(REPRO_PREFIX):
            name = self.launcher[len(REPRO_PREFIX) :]
            return {"kind": "stand-in", "name": self.launcher, "label": f"the {name} stand-in",
                    "version": None, "how": "named by its launcher (the run has not reported yet)",
                    "inferred": True}  # fmt: skip
        server = SERVER_OF_LAUNCHER.get(self.launcher, self.launcher)
        return {"kind": "server", "name": server, "label": server, "version": None,
                "how": "named by its launcher (the run has not reported yet)", "inferred": True}  # fmt: skip

    @property
    def weights(self) -> dict[str, Any]:
        weights = (self.result or {}).get("weights")
        return weights if isinstance(weights, dict) else {}

    @property
    def throughput_unit(self) -> str:
        return "kernel steps/s" if self.is_stand_in else "tokens/s"

    @property
    def evidence_label(self) -> str:
        """In words: "kernel-level confirm with the moe-serve stand-in on H200 sm_90 (reference
        weights)", "server confirm with sglang 0.5.23 on NVIDIA H200 sm_90 (real weights, inferred)"."""
        return evidence_words(
            stand_in=self.is_stand_in,
            launcher=str(self.launcher_identity.get("label") or self.launcher),
            gpu=self.gpu_label,
            weights=self.weights,
        )


class ConfirmOutput(models.Model):
    """A piece of the launch's output as the worker streamed it; `seq` orders them."""

    confirm = models.ForeignKey(ConfirmRun, on_delete=models.CASCADE, related_name="output")
    seq = models.PositiveIntegerField()
    text = models.TextField()

    class Meta:
        ordering = ["confirm", "seq"]
        constraints = [models.UniqueConstraint(fields=["confirm", "seq"], name="confirmoutput_unique_seq")]


class ProbeRun(models.Model):
    """Kernel probes on one host: asked for from the hosts page, or run after a confirm."""

    class Status(models.TextChoices):
        QUEUED = "queued", "queued"
        DONE = "done", "done"

    project = models.ForeignKey(Project, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    host = models.ForeignKey(
        GpuHost, null=True, blank=True, on_delete=models.SET_NULL, related_name="probe_runs"
    )
    host_name = models.CharField(max_length=200, blank=True)
    confirm = models.ForeignKey(
        ConfirmRun, null=True, blank=True, on_delete=models.CASCADE, related_name="probe_runs"
    )
    queue = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    gpu_name = models.CharField(max_length=200, blank=True)
    arch = models.CharField(max_length=20, blank=True)
    versions = models.JSONField(default=dict)
    results = models.JSONField(default=list)  # per probe: the worker's probe dict

    class Meta:
        ordering = ["-created_at", "-id"]


class SignatureConfirmation(models.Model):
    """What a confirm run showed about a signature's fix, shown with the signature wherever it matches:
    "confirmed on NVIDIA H200 sm_90, sglang 0.5.23, 2026-12-02"."""

    signature_id = models.CharField(max_length=200, db_index=True)
    confirm = models.OneToOneField(
        ConfirmRun, on_delete=models.CASCADE, related_name="signature_confirmation"
    )
    outcome = models.CharField(max_length=20)
    gpu_name = models.CharField(max_length=200, blank=True)
    arch = models.CharField(max_length=20, blank=True)
    server = models.CharField(max_length=20, blank=True)
    server_version = models.CharField(max_length=100, blank=True)
    # "server": the server itself ran; "kernel": a repro stand-in ran the kernel path, no model.
    evidence = models.CharField(max_length=10, default="server")
    launcher_label = models.CharField(max_length=200, blank=True)  # "the moe-serve stand-in"
    weights = models.CharField(max_length=20, blank=True)  # real / dummy / reference
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]

    def label(self) -> str:
        when = f"{self.created_at:%Y-%m-%d}"
        where = f"{self.gpu_name} {self.arch}".strip()
        if self.evidence == "kernel":
            verb = {"fixed": "kernel path works", "garbage": "kernel path gives wrong results",
                    "still_fails": "kernel path still fails"}.get(self.outcome, self.outcome)  # fmt: skip
            who = self.launcher_label or "a stand-in"
            weights = f", {self.weights} weights" if self.weights else ""
            return f"{verb}: kernel-level confirm with {who} on {where or 'an unknown GPU'}{weights}, {when}"
        verb = {"fixed": "confirmed", "garbage": "serves garbage", "still_fails": "still fails"}.get(
            self.outcome, self.outcome
        )
        server = f"{self.server} {self.server_version}".strip()
        where = ", ".join(part for part in (where, server) if part)
        weights = f" ({self.weights} weights)" if self.weights and self.weights != "real" else ""
        return f"{verb} on {where}{weights}, {when}"


class SweepRun(models.Model):
    """One backend sweep of a report's crashing component on a host of its arch (worker.sweep)."""

    class Status(models.TextChoices):
        QUEUED = "queued", "queued"
        RUNNING = "running", "running"
        DONE = "done", "done"
        FAILED = "failed", "failed"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="sweep_runs")
    report = models.ForeignKey(Report, on_delete=models.CASCADE, related_name="sweep_runs")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)  # when a host said it took the sweep
    finished_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    error = models.TextField(blank=True)
    component = models.CharField(max_length=20)
    arch = models.CharField(max_length=20, blank=True)
    queue = models.CharField(max_length=200)
    shapes = models.JSONField(default=dict)  # ModelShapesRead.to_dict(): values and where each came from
    host_name = models.CharField(max_length=200, blank=True)
    result = models.JSONField(default=dict)  # the worker's SweepReport

    class Meta:
        ordering = ["-created_at", "-id"]

    WAITING = (Status.QUEUED, Status.RUNNING)

    def __str__(self) -> str:
        return f"{self.component} sweep {self.pk} of report {self.report_id}"

    @property
    def proposed_fix(self) -> dict[str, Any] | None:
        fix = self.result.get("proposed_fix")
        return fix if isinstance(fix, dict) else None
