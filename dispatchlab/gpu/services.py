"""Everything that changes GPU hosts, confirm runs and probe runs. Views, tasks and commands call these.

A confirm run: `confirm_plan` reads the launch from the report's document and applies the top
diagnosis's fix; `confirm_create` stores the (possibly edited) launch and sends a `gpu.confirm` job to
the queue of the report's arch, where it waits until a host of that arch takes it. What the worker
answers, and the outcome drawn from it, is dispatchlab.gpu.confirm_outcomes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from dispatchlab.core.launch import (
    DiffLine,
    Launch,
    LaunchError,
    apply_patch,
    check_launch,
    flag_problems,
    launch_diff,
    launch_from_command,
    launch_from_document,
)
from dispatchlab.gpu.models import (
    ConfirmRun,
    GpuHost,
    ProbeRun,
    alive_since,
)
from dispatchlab.messaging.contract import (
    CONFIRM_TASK,
    PROBE_TASK,
    ConfirmJob,
    arch_queue,
    cancel_queue,
    gpu_queue,
    host_queue,
)
from dispatchlab.reports.models import Project, Report

logger = logging.getLogger(__name__)

SMOKE_PROMPT = "The capital of France is"
# Which probes the worker runs after a confirm, by the failing component the diagnosis names.
COMPONENT_WORDS = {
    "moe": ("moe", "expert"),
    "attention": ("attention", "attn", "fa3", "mla", "decode", "prefill", "sdpa"),
    "gemm": ("gemm", "fp8", "fp4", "nvfp4", "mxfp4", "matmul", "cublas", "scaled_mm"),
}


class ConfirmRejected(ValueError):
    """The confirm cannot be queued (no launch, a launch dispatchlab does not run). For people."""


FLAT_ARGS = (
    "'args' must be a flat object of flag to value: a string, number, true/false/null or a list of those"
)
FLAT_ENV = "'env' must be a flat map of variable names to strings"
_SCALARS = (str, int, float, bool, type(None))


def _kind_of(value: Any) -> str:
    return (
        "an object" if isinstance(value, dict) else "a nested list" if isinstance(value, list) else "a value"
    )


def check_flat_patch(args_patch: dict[str, Any] | None, env_patch: dict[str, Any] | None) -> None:
    """ConfirmRejected unless the patches are flat. A nested value would be stored on the run and read
    back by every task that loads it; past Python's recursion limit that read fails and the run would
    stay `running` for ever."""
    for flag, value in (args_patch or {}).items():
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(item, _SCALARS) and not isinstance(item, list) for item in items):
            raise ConfirmRejected(f"{FLAT_ARGS} ({str(flag)[:80]} holds {_kind_of(value)})")
    for name, value in (env_patch or {}).items():
        if not isinstance(value, _SCALARS):
            raise ConfirmRejected(f"{FLAT_ENV} ({str(name)[:80]} holds {_kind_of(value)})")


# ---------------------------------------------------------------- hosts


def hosts_alive() -> list[GpuHost]:
    return list(GpuHost.objects.filter(stopped=False, last_seen__gte=alive_since()))


def hosts_for_queue(queue: str) -> list[GpuHost]:
    """Live hosts that consume this queue."""
    return [host for host in hosts_alive() if queue in (host.queues or [])]


def host_heartbeat(*, payload: dict[str, Any]) -> GpuHost:
    name = str(payload.get("host") or "")[:200]
    if not name:
        raise ValueError("a heartbeat without a host name")
    inventory = payload.get("inventory") or {}
    arches = sorted(
        {g.get("arch") for g in inventory.get("gpus") or [] if isinstance(g, dict) and g.get("arch")}
    )
    now = timezone.now()
    host, _ = GpuHost.objects.get_or_create(name=name, defaults={"first_seen": now})
    host.last_seen = now
    host.stopped = bool(payload.get("stopping"))
    host.busy = bool(payload.get("busy"))
    host.arches = arches
    host.queues = [str(q) for q in payload.get("queues") or []]
    host.inventory = inventory
    host.launchers = [str(x) for x in payload.get("launchers") or []]
    host.model_roots = [str(x) for x in payload.get("model_roots") or []]
    host.save()
    if not host.stopped:
        # Jobs that waited for a host of this arch are now in reach of one.
        ConfirmRun.objects.filter(status=ConfirmRun.Status.WAITING_FOR_HOST, queue__in=host.queues).update(
            status=ConfirmRun.Status.QUEUED
        )
    return host


def host_status_for_arch(arch: str | None) -> dict[str, Any]:
    """What a report page says about confirming on a GPU: which live hosts could take its job."""
    queue = arch_queue(arch)
    hosts = hosts_for_queue(queue)
    if hosts:
        message = (
            f"{len(hosts)} live GPU host{'s' if len(hosts) != 1 else ''} of {arch or 'any arch'}: "
            + ", ".join(h.name for h in hosts)
        )
    elif arch:
        others = sorted({a for h in hosts_alive() for a in h.arches})
        seen = f" (live hosts: {', '.join(others)})" if others else " (no GPU host is alive)"
        message = (
            f"No live GPU host of {arch}{seen}: a confirm waits in queue {queue} until "
            f"`python -m worker` runs on a {arch} host."
        )
    else:
        message = "The log does not say which GPU arch it ran on; a confirm goes to any GPU host (queue gpu)."
        if not hosts_alive():
            message += " No GPU host is alive."
    return {"arch": arch, "queue": queue, "hosts": hosts, "available": bool(hosts), "message": message}


# ---------------------------------------------------------------- confirm runs


@dataclass
class ConfirmPlan:
    report: Report
    launch: Launch | None
    fixed: Launch | None
    fix_args: dict[str, Any] = field(default_factory=dict)
    fix_env: dict[str, Any] = field(default_factory=dict)
    fix_summary: str = ""
    signature_id: str = ""
    signature_title: str = ""
    diff: list[DiffLine] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    reason: str = ""  # why no confirm can be built, for people
    nothing_to_confirm: bool = False  # no diagnosis with a fix: only an edited launch may run
    probes: list[str] = field(default_factory=list)
    host_status: dict[str, Any] = field(default_factory=dict)


def _top_fix(document: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The top match that has a fix, and that fix."""
    for match in document.get("matches") or []:
        fix = match.get("fix") or {}
        if fix.get("args") or fix.get("env"):
            return match, fix
    return {}, {}


def _probe_components(document: dict[str, Any], match: dict[str, Any]) -> list[str]:
    text = " ".join(
        [
            str(match.get("id") or ""),
            str(match.get("title") or ""),
            " ".join(f"{k} {v}" for k, v in (match.get("fix") or {}).get("args", {}).items()),
            " ".join(document.get("kernels") or []),
        ]
    ).lower()
    found = [component for component, words in COMPONENT_WORDS.items() if any(w in text for w in words)]
    return [f"component:{c}" for c in found]


def confirm_plan(*, report: Report) -> ConfirmPlan:
    document = report.document or {}
    match, fix = _top_fix(document)
    plan = ConfirmPlan(
        report=report, launch=None, fixed=None, host_status=host_status_for_arch(report.arch or None)
    )
    plan.signature_id = str(match.get("id") or "")
    plan.signature_title = str(match.get("title") or "")
    plan.fix_args = dict(fix.get("args") or {})
    plan.fix_env = dict(fix.get("env") or {})
    plan.fix_summary = str(fix.get("summary") or "")
    plan.probes = _probe_components(document, match)
    if report.status != Report.Status.DONE:
        plan.reason = "the report is not parsed yet"
        return plan
    launch = None
    if report.launch_command.strip():
        try:
            launch = launch_from_command(report.launch_command)
        except LaunchError:
            launch = None
    launch = launch or launch_from_document(document)
    if launch is None:
        plan.reason = (
            "the log shows neither a launch command nor an args dump to re-run; paste the command line below"
        )
        return plan
    plan.launch = launch
    plan.fixed = apply_patch(launch, args=plan.fix_args, env=plan.fix_env)
    plan.diff = launch_diff(launch, plan.fixed)
    plan.problems = flag_problems(plan.fixed, version=report.server_version or None)
    if not match:
        plan.nothing_to_confirm = True
        plan.reason = nothing_to_confirm_reason(document)
    return plan


def nothing_to_confirm_reason(document: dict[str, Any]) -> str:
    """Why a confirm of this report's launch as it is would be a blind re-run, and what to do instead."""
    matches = document.get("matches") or []
    diagnosis = (
        f"the diagnosis ({matches[0].get('title') or matches[0].get('id')}) has no fix"
        if matches
        else "no diagnosis with a fix explains this crash"
    )
    return (
        f"nothing to confirm: {diagnosis}, so the launch would re-run exactly as it crashed. Run the "
        "backend sweep for the failing component (`python -m worker sweep REPORT_OR_LOG --component "
        "moe|attention|gemm|sampling`) or edit the launch below (a backend, a flag) and confirm that"
    )


def _job_settings() -> dict[str, int]:
    return {
        "time_limit_s": int(getattr(settings, "DISPATCHLAB_CONFIRM_TIME_LIMIT", 1800)),
        "ready_timeout_s": int(getattr(settings, "DISPATCHLAB_CONFIRM_READY_TIMEOUT", 1200)),
        "concurrency": int(getattr(settings, "DISPATCHLAB_CONFIRM_CONCURRENCY", 4)),
    }


def _send(task: str, kwargs: dict[str, Any], queue: str) -> None:
    from dispatchlab.config.celery import app

    app.send_task(task, kwargs=kwargs, queue=queue)


def confirm_create(
    *,
    report: Report,
    user: AbstractBaseUser | None,
    command: str | None = None,
    args_patch: dict[str, Any] | None = None,
    env_patch: dict[str, Any] | None = None,
    probes: list[str] | None = None,
) -> ConfirmRun:
    """Queue a confirm of the report's launch with its fix applied (or of `command`, as edited by a
    person). Raises ConfirmRejected with a reason a person can act on."""
    check_flat_patch(args_patch, env_patch)
    plan = confirm_plan(report=report)
    if report.status != Report.Status.DONE:
        raise ConfirmRejected("the report is not parsed yet")
    if command is not None and command.strip():
        try:
            launch = launch_from_command(command)
        except LaunchError as error:
            raise ConfirmRejected(str(error)) from None
        if args_patch or env_patch:
            launch = apply_patch(launch, args=args_patch or {}, env=env_patch or {})
    else:
        if plan.launch is None:
            raise ConfirmRejected(plan.reason or "no launch to confirm")
        fix_args = plan.fix_args if args_patch is None else args_patch
        fix_env = plan.fix_env if env_patch is None else env_patch
        launch = apply_patch(plan.launch, args=fix_args, env=fix_env)
    try:
        check_launch(launch)
    except LaunchError as error:
        raise ConfirmRejected(str(error)) from None
    if plan.nothing_to_confirm and plan.launch is not None and _same_launch(launch, plan.launch):
        raise ConfirmRejected(plan.reason or nothing_to_confirm_reason(report.document or {}))
    arch = report.arch or None
    queue = arch_queue(arch)
    waiting = not hosts_for_queue(queue)
    with transaction.atomic():
        # The same launch already waiting for a host or in the queue: join it, do not queue it twice.
        joined = (
            ConfirmRun.objects.select_for_update()
            .filter(
                report=report,
                status__in=[ConfirmRun.Status.WAITING_FOR_HOST, ConfirmRun.Status.QUEUED],
                launcher=launch.launcher,
                args=launch.args(),
                env=dict(launch.env),
            )
            .order_by("created_at", "id")
            .first()
        )
        if joined is not None:
            joined.joined = True
            return joined
        confirm = ConfirmRun.objects.create(
            project=report.project,
            report=report,
            created_by=user if user is not None and user.is_authenticated else None,
            status=ConfirmRun.Status.WAITING_FOR_HOST if waiting else ConfirmRun.Status.QUEUED,
            arch=arch or "",
            queue=queue,
            signature_id=plan.signature_id,
            launcher=launch.launcher,
            args=launch.args(),
            env=dict(launch.env),
            original_command=plan.launch.command() if plan.launch else "",
            fix_args=plan.fix_args if args_patch is None else args_patch,
            fix_env=plan.fix_env if env_patch is None else env_patch,
            probes=list(plan.probes if probes is None else probes),
        )
        job: ConfirmJob = {
            "confirm_id": confirm.id,
            "report_id": report.id,
            "launch": {"launcher": launch.launcher, "args": launch.args(), "env": dict(launch.env)},
            "server": launch.server if launch.server != "unknown" else (report.server or "unknown"),
            "arch": arch,
            "smoke_prompt": SMOKE_PROMPT,
            "probes": list(confirm.probes),
            "model_shapes": {},
            **_job_settings(),  # type: ignore[typeddict-item]
        }
        confirm.job = dict(job)
        confirm.save(update_fields=["job"])
        transaction.on_commit(lambda: _send(CONFIRM_TASK, {"job": dict(job)}, queue), robust=True)
    return confirm


def _same_launch(a: Launch, b: Launch) -> bool:
    return a.launcher == b.launcher and a.args() == b.args() and dict(a.env) == dict(b.env)


def confirm_cancel(*, confirm: ConfirmRun, user: AbstractBaseUser | None) -> ConfirmRun:
    """Cancel a waiting, queued or running confirm: it is marked cancelled at once and the worker
    that holds (or will take) it hears so on the confirm's cancel queue and stops the launch's whole
    process group. ConfirmRejected when it has already finished."""
    with transaction.atomic():
        locked = ConfirmRun.objects.select_for_update().get(pk=confirm.pk)
        if locked.status not in ConfirmRun.CANCELLABLE:
            raise ConfirmRejected(
                f"confirm run {locked.pk} is {locked.get_status_display()}: only a waiting, queued or "
                "running confirm can be cancelled"
            )
        was = locked.get_status_display()
        who = getattr(user, "username", "") if user is not None and user.is_authenticated else ""
        locked.status = ConfirmRun.Status.CANCELLED
        locked.error = f"cancelled while {was}" + (f" by {who}" if who else "")
        locked.finished_at = timezone.now()
        locked.save(update_fields=["status", "error", "finished_at"])
        confirm_id = locked.pk
        transaction.on_commit(lambda: _send_cancel(confirm_id), robust=True)
    return locked


def _send_cancel(confirm_id: int) -> None:
    from dispatchlab.config.celery import app

    with app.connection_for_write() as connection:
        queue = connection.SimpleQueue(cancel_queue(confirm_id), serializer="json")
        try:
            queue.put({"confirm_id": confirm_id})
        finally:
            queue.close()


# ---------------------------------------------------------------- probes


def probe_request(
    *,
    project: Project | None,
    host: GpuHost | None = None,
    arch: str | None = None,
    probes: list[str] | None = None,
) -> ProbeRun:
    queue = host_queue(host.name) if host is not None else arch_queue(arch)
    with transaction.atomic():
        run = ProbeRun.objects.create(
            project=project, host=host, host_name=host.name if host else "", queue=queue, arch=arch or ""
        )
        kwargs = {"job": {"probe_run_id": run.id, "probes": list(probes or []), "model_shapes": {}}}
        transaction.on_commit(lambda: _send(PROBE_TASK, kwargs, queue), robust=True)
    return run


def probes_store(*, payload: dict[str, Any], confirm: ConfirmRun | None = None) -> ProbeRun:
    inventory = payload.get("inventory") or {}
    gpus = inventory.get("gpus") or []
    host = GpuHost.objects.filter(name=str(payload.get("host") or "")).first()
    run = None
    if payload.get("probe_run_id"):
        run = ProbeRun.objects.filter(id=int(payload["probe_run_id"])).first()
    if run is None:
        run = ProbeRun(project=confirm.project if confirm else None, confirm=confirm, queue=gpu_queue())
    run.host = host or run.host
    run.host_name = str(payload.get("host") or run.host_name)[:200]
    run.status = ProbeRun.Status.DONE
    run.finished_at = timezone.now()
    run.gpu_name = str(gpus[0].get("name") or "") if gpus else ""
    run.arch = str(gpus[0].get("arch") or "") if gpus else run.arch
    run.versions = inventory.get("versions") or {}
    run.results = [p for p in payload.get("probes") or [] if isinstance(p, dict)]
    run.save()
    return run
