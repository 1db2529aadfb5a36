"""The GPU pages: hosts, confirming a report's fix on a GPU, a confirm run, the compatibility matrix.

Scoping as in views.py: reports and confirm runs come from the user's projects (another project's is a
404); hosts are global. Starting work (a confirm, probes) needs a member; a viewer reads only.

Multi-GPU hosts also show how their GPUs are linked (a matrix like `nvidia-smi topo -m`) and the NCCL
all-reduce probe's bus bandwidth against that link; a report of a multi-GPU crash shows the transports
NCCL chose in its log next to the newest all-reduce measured on a host of its arch.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from dispatchlab.core.launch import Launch
from dispatchlab.front import gpu_figures
from dispatchlab.front.gpu_links import (
    ALLREDUCE_MIN_GPUS,
    allreduce_view,
    first_link,
    link_matrix,
    links_context,
)
from dispatchlab.gpu import selectors as gpu_selectors
from dispatchlab.gpu.models import ConfirmRun, GpuHost
from dispatchlab.gpu.selectors import ALLREDUCE, allreduce_result, kernel_results
from dispatchlab.messaging.broker import worker_starts
from dispatchlab.reports import selectors
from dispatchlab.reports.models import Report

PROBE_COMPONENTS = ("moe", "attention", "gemm", "memory", "jit")
SHOWN_VERSIONS = ("sglang", "vllm", "flashinfer", "sgl-kernel", "torch", "triton")
OUTPUT_TAIL_LINES = 200
STATUS_POLL = "every 2s"
# what a confirm run's line on the report page shows (not its result and job, which can be large)
CONFIRM_ROW = ("id", "status", "created_at", "host_name", "report_id", "result_report_id", "project_id")
# ConfirmRun.status -> badge colour class: fixed green, still fails red, garbage amber, refused grey
BADGE = {
    ConfirmRun.Status.FIXED: "ok",
    ConfirmRun.Status.STILL_FAILS: "fails",
    ConfirmRun.Status.GARBAGE: "garbage",
    ConfirmRun.Status.REFUSED: "refused",
}


def ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 2 * 3600:
        return f"{seconds // 60} min ago"
    if seconds < 2 * 86400:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} days ago"


def _can_start(request: HttpRequest, report: Report) -> bool:
    return selectors.user_can_upload(user=request.user, project=report.project)


def _report_or_404(request: HttpRequest, report_id: int) -> Report:
    return get_object_or_404(
        selectors.reports_visible_to(request.user).select_related("project"), pk=report_id
    )


def _confirm_or_404(request: HttpRequest, confirm_id: int) -> ConfirmRun:
    confirms = gpu_selectors.confirms_visible_to(request.user).select_related(
        "report", "result_report", "project", "host"
    )
    # the reports' documents can be large and the page needs neither
    confirms = confirms.defer("report__document", "result_report__document")
    return get_object_or_404(confirms, pk=confirm_id)


def confirm_badge(confirm: ConfirmRun) -> str:
    return BADGE.get(confirm.status, "pending")


def confirm_sentence(confirm: ConfirmRun) -> str:
    """What the run is doing, in a sentence (the hosts link is the template's)."""
    status = confirm.status
    arch = confirm.arch or "any arch"
    if status == ConfirmRun.Status.WAITING_FOR_HOST:
        return f"Waiting in queue {confirm.queue}: no live host of {arch}."
    if status == ConfirmRun.Status.QUEUED:
        return f"Queued in {confirm.queue}: a live host of {arch} will take it when it is free."
    if status == ConfirmRun.Status.RUNNING:
        since = confirm.started_at or confirm.created_at
        seconds = int((timezone.now() - since).total_seconds())
        return f"Running on host {confirm.host_name or '(unknown)'} for {seconds} s."
    if status == ConfirmRun.Status.PARSING:
        return "The launch has ended; its output is being parsed as a new report."
    if status == ConfirmRun.Status.FIXED:
        result = confirm.result or {}
        ready = result.get("ready_seconds")
        took = f" in {ready:.0f} s" if isinstance(ready, int | float) else ""
        if confirm.is_stand_in:
            return (
                f"Kernel path works ({confirm.evidence_label}): the stand-in became ready{took} and "
                "its kernel steps matched the reference. Kernel-level evidence, not a server "
                "confirmation: the failure group stays open until the server itself is confirmed."
            )
        return f"Fixed: the launch became ready{took} and answered the smoke prompt sensibly."
    if status == ConfirmRun.Status.STILL_FAILS:
        return f"Still fails: {confirm.error}" if confirm.error else "Still fails."
    if status == ConfirmRun.Status.GARBAGE:
        return f"Serves garbage: {_garbage_reason(confirm) or confirm.error}"
    if status == ConfirmRun.Status.REFUSED:
        return "Refused by the worker:"
    if status == ConfirmRun.Status.CANCELLED:
        return f"Cancelled: {confirm.error}." if confirm.error else "Cancelled."
    return str(confirm.get_status_display())


def _garbage_reason(confirm: ConfirmRun) -> str:
    garbage = ((confirm.result or {}).get("smoke") or {}).get("garbage") or {}
    return str(garbage.get("reason") or garbage.get("kind") or "")


def _argv(confirm: ConfirmRun) -> list[dict[str, Any]]:
    """The launch, an argument a line: what the worker ran once it started, else what was queued."""
    if confirm.argv:
        tokens = [str(a) for a in confirm.argv]
        env: list[str] = []
        program = next((i for i, token in enumerate(tokens) if token.startswith("--")), len(tokens))
    else:
        head = Launch(launcher=confirm.launcher).program()
        tokens = [*head, *(str(a) for a in confirm.args)]
        env = [f"{name}={value}" for name, value in sorted((confirm.env or {}).items())]
        program = len(head)
    lines = [{"text": item, "kind": "env"} for item in env]
    for index, token in enumerate(tokens):
        kind = "program" if index < program else "flag" if token.startswith("-") else "value"
        lines.append({"text": token, "kind": kind})
    return lines


# ---- the report page's GPU panel ----


def report_context(request: HttpRequest, report: Report) -> dict[str, Any]:
    """What report.html's "Confirm on GPU" panel and confirm-output banner need (`gpu_*` keys)."""
    from dispatchlab.gpu.confirm_outcomes import signature_confirmations
    from dispatchlab.gpu.services import host_status_for_arch

    context: dict[str, Any] = {
        "gpu_confirm_of": ConfirmRun.objects.filter(result_report=report, project=report.project)
        .only(*CONFIRM_ROW)
        .first(),
        "gpu_links": links_context(request, report),
    }
    if report.status != Report.Status.DONE:
        return context
    confirmations = (signature_confirmations([report.top_match_id]) if report.top_match_id else {}).get(
        report.top_match_id, []
    )[:5]
    # A signature's confirmations come from every project; only the user's own runs are links.
    visible = (
        set(
            gpu_selectors.confirms_visible_to(request.user)
            .filter(id__in=[c.confirm_id for c in confirmations])
            .values_list("id", flat=True)
        )
        if confirmations
        else set()
    )
    # The kernel probes of the newest finished confirm of this crash (or of the run this report is):
    # bars per backend against the chip's peak, right on the report.
    probed = (
        ConfirmRun.objects.filter(project=report.project, finished_at__isnull=False)
        .filter(Q(report=report) | Q(result_report=report))
        .order_by("-finished_at")
        .only("id", "result", "arch")
        .first()
    )
    probe_results = kernel_results((probed.result or {}).get("probes")) if probed else []
    if probe_results:
        assert probed is not None
        context.update(
            gpu_probe_confirm=probed,
            gpu_probes=[_probe_row(p) for p in probe_results],
            gpu_probe_fig=gpu_figures.probe_figure(probe_results, gpu_name=probed.gpu_label or None),
        )
    context.update(
        gpu_panel=True,
        gpu_host_status=host_status_for_arch(report.arch or None),
        gpu_confirms=[
            {"run": run, "badge": confirm_badge(run)}
            for run in ConfirmRun.objects.filter(report=report, project=report.project)
            .only(*CONFIRM_ROW)
            .order_by("-created_at", "-id")[:20]
        ],
        gpu_can_confirm=_can_start(request, report),
        gpu_confirmations=[
            {
                "label": item.label(),
                "outcome": item.outcome,
                "url": reverse("front:confirm", args=[item.confirm_id]) if item.confirm_id in visible else "",
            }
            for item in confirmations
        ],
    )
    return context


# ---- hosts ----


def _gpu_rows(host: GpuHost) -> list[dict[str, Any]]:
    rows = []
    for gpu in host.gpus:
        if not isinstance(gpu, dict):
            continue
        memory = gpu.get("memory_mib")
        pcie = ""
        if gpu.get("pcie_max_gen"):
            pcie = f"Gen{gpu['pcie_max_gen']} x{gpu.get('pcie_max_width') or '?'}"
            if gpu.get("pcie_gen") and (gpu["pcie_gen"], gpu.get("pcie_width")) != (
                gpu["pcie_max_gen"],
                gpu.get("pcie_max_width"),
            ):
                pcie += f" (now Gen{gpu['pcie_gen']} x{gpu.get('pcie_width') or '?'})"
        nvlink = ""
        if gpu.get("nvlinks"):
            nvlink = f"{gpu['nvlinks']} links" + (
                f", v{gpu['nvlink_version']}" if gpu.get("nvlink_version") else ""
            )
        clocks = " / ".join(
            f"{label} {gpu[key]} MHz"
            for label, key in (("SM", "sm_clock_max_mhz"), ("memory", "memory_clock_max_mhz"))
            if gpu.get(key)
        )
        rows.append(
            {
                "index": gpu.get("index"),
                "name": gpu.get("name") or "unknown",
                "arch": gpu.get("arch") or "",
                "capability": gpu.get("capability") or "",
                "memory": f"{memory / 1024:.0f} GiB" if isinstance(memory, int | float) else "",
                "clocks": clocks,
                "power": f"{gpu['power_limit_w']:.0f} W"
                if isinstance(gpu.get("power_limit_w"), int | float)
                else "",
                "pcie": pcie,
                "nvlink": nvlink or "none",
            }
        )
    return rows


def _versions(versions: dict[str, Any]) -> list[tuple[str, str]]:
    """The packages a confirm depends on ("not installed" when the host lacks one), then the rest.
    Empty when the host reported no versions at all."""
    if not versions:
        return []
    shown = [(name, str(versions.get(name) or "not installed")) for name in SHOWN_VERSIONS]
    others = [
        (name, str(value)) for name, value in sorted(versions.items()) if name not in SHOWN_VERSIONS and value
    ]
    return shown + others


def _host_view(row: gpu_selectors.HostRow, now: Any) -> dict[str, Any]:
    host = row.host
    inventory = host.inventory or {}
    if host.stopped:
        state = "stopped"
    elif host.alive:
        state = "alive"
    else:
        state = "not alive"
    probe = row.probe
    results = kernel_results(probe.results if probe else [])
    links = [link for link in inventory.get("links") or [] if isinstance(link, dict)]
    gpu_count = len([g for g in host.gpus if isinstance(g, dict)])
    allreduce = None
    if row.allreduce is not None:
        allreduce = allreduce_view(
            allreduce_result(row.allreduce.results) or {},
            run=row.allreduce,
            fig_id=f"allreduce-fig-{host.pk}",
            link=first_link(links),
        )
    return {
        "host": host,
        "state": state,
        "seen_ago": ago((now - host.last_seen).total_seconds()),
        "gpus": _gpu_rows(host),
        "links": links,
        "link_matrix": link_matrix(host.gpus, links),
        "allreduce": allreduce,
        "allreduce_blocked": ""
        if gpu_count >= ALLREDUCE_MIN_GPUS
        else f"needs at least {ALLREDUCE_MIN_GPUS} GPUs",
        "driver": inventory.get("driver") or "",
        "cuda": inventory.get("cuda_version") or "",
        "torch_cuda": inventory.get("torch_cuda") or "",
        "versions": _versions(host.versions),
        "reason": inventory.get("reason") or "",
        "probe": probe,
        "pending": row.pending,
        "probes": [_probe_row(p) for p in results],
        "probe_fig": gpu_figures.probe_figure(results, gpu_name=probe.gpu_name if probe else None),
        "fig_id": f"probe-fig-{host.pk}",
    }


def _probe_row(probe: dict[str, Any]) -> dict[str, Any]:
    verdict = gpu_selectors.probe_verdict(probe) or "other"
    fraction = probe.get("peak_fraction")
    rate = ""
    if isinstance(probe.get("tflops"), int | float):
        rate = f"{probe['tflops']:.1f} TFLOP/s"
    elif isinstance(probe.get("gbps"), int | float):
        rate = f"{probe['gbps']:.0f} GB/s"
    return {
        "name": probe.get("name") or "",
        "backend": probe.get("backend") or "",
        "component": probe.get("component") or "",
        "verdict": verdict,
        "status": gpu_figures.probe_status_word(probe),
        "percent": f"{fraction * 100:.0f}%"
        if isinstance(fraction, int | float) and verdict == "works"
        else "",
        "rate": rate,
        "ms": f"{probe['ms']:.3f}" if isinstance(probe.get("ms"), int | float) else "",
        "max_error": f"{probe['max_error']:.3g}" if isinstance(probe.get("max_error"), int | float) else "",
        "shape": gpu_figures.shape_text(probe.get("shape")),
        "error": probe.get("error") or "",
    }


def _int_param(request: HttpRequest, name: str) -> int | None:
    raw = request.GET.get(name, "").strip()
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 12 else None


@login_required
@require_GET
def hosts(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    rows = gpu_selectors.hosts_with_probes(request.user, probe_id=_int_param(request, "probe"))
    projects = list(selectors.projects_uploadable_by(request.user))
    starts = worker_starts(url=settings.CELERY_BROKER_URL, data_dir=settings.DATA_DIR)
    return render(
        request,
        "front/gpu/hosts.html",
        {
            "hosts": [_host_view(row, now) for row in rows],
            "probe_projects": projects,
            "worker_starts": starts,
        },
    )


@login_required
@require_POST
def host_probe(request: HttpRequest, host_id: int) -> HttpResponse:
    from dispatchlab.gpu.services import probe_request

    host = get_object_or_404(GpuHost, pk=host_id)
    projects = list(selectors.projects_uploadable_by(request.user))
    slug = request.POST.get("project", "")
    if slug:
        project = next((p for p in projects if p.slug == slug), None)
    else:
        project = projects[0] if len(projects) == 1 else None
    if project is None:
        return HttpResponse(
            "Only a member of the project can ask a host for probes on its behalf.", status=403
        )
    probes = None  # every single-GPU probe
    if request.POST.get("probes") == ALLREDUCE:
        count = len(host.gpus)
        if count < ALLREDUCE_MIN_GPUS:
            message = (
                f"The all-reduce probe needs at least {ALLREDUCE_MIN_GPUS} GPUs; {host.name} has {count}."
            )
            return HttpResponse(message, status=400)
        probes = [ALLREDUCE]
    probe_request(project=project, host=host, probes=probes)
    return redirect(reverse("front:hosts") + f"#host-{host.pk}")


# ---- confirm a report's fix ----


def _confirm_form(
    request: HttpRequest,
    report: Report,
    *,
    command: str | None = None,
    probes: list[str] | None = None,
    error: str = "",
    status: int = 200,
) -> HttpResponse:
    from dispatchlab.gpu.services import confirm_plan

    plan = confirm_plan(report=report)
    if command is None:
        command = plan.fixed.command() if plan.fixed is not None else ""
    if probes is None:
        probes = list(plan.probes)
    checked = {p.removeprefix("component:") for p in probes}
    context = {
        "report": report,
        "plan": plan,
        "command": command,
        "probe_choices": [
            {"name": c, "value": f"component:{c}", "checked": c in checked} for c in PROBE_COMPONENTS
        ],
        "error": error,
        "can_confirm": _can_start(request, report),
        "changed": sum(1 for line in plan.diff if line.kind != "same"),
    }
    return render(request, "front/gpu/confirm_new.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def confirm_new(request: HttpRequest, report_id: int) -> HttpResponse:
    from dispatchlab.gpu.services import ConfirmRejected, confirm_create

    report = _report_or_404(request, report_id)
    if request.method != "POST":
        return _confirm_form(request, report)
    command = request.POST.get("command", "")[:20_000]
    allowed = {f"component:{c}" for c in PROBE_COMPONENTS}
    probes = [p for p in request.POST.getlist("probes") if p in allowed]
    if not _can_start(request, report):
        message = "You may read this project's reports but not start runs on its behalf (you are a viewer)."
        return _confirm_form(request, report, command=command, probes=probes, error=message, status=403)
    try:
        confirm = confirm_create(report=report, user=request.user, command=command, probes=probes)
    except ConfirmRejected as rejected:
        return _confirm_form(request, report, command=command, probes=probes, error=str(rejected), status=400)
    return redirect("front:confirm", confirm_id=confirm.pk)


# ---- a confirm run ----


def _status_context(confirm: ConfirmRun) -> dict[str, Any]:
    context: dict[str, Any] = {
        "confirm": confirm,
        "badge": confirm_badge(confirm),
        "sentence": confirm_sentence(confirm),
        "poll": STATUS_POLL if not confirm.is_finished else "",
        "cancellable": confirm.status in ConfirmRun.CANCELLABLE,
    }
    if confirm.status in (ConfirmRun.Status.RUNNING, ConfirmRun.Status.PARSING):
        context["show_output"] = True
        context["output_tail"], context["output_cut"] = gpu_selectors.confirm_output_tail(
            confirm, lines=OUTPUT_TAIL_LINES
        )
    return context


@login_required
@require_GET
def confirm_status(request: HttpRequest, confirm_id: int) -> HttpResponse:
    """The polled fragment: status and output tail. Once the run is finished it sends the browser to
    the confirm page (HX-Redirect), which draws the results."""
    confirm = _confirm_or_404(request, confirm_id)
    response = render(request, "front/gpu/partials/confirm_status.html", _status_context(confirm))
    if confirm.is_finished and request.headers.get("HX-Request"):
        response["HX-Redirect"] = reverse("front:confirm", args=[confirm.pk])
    return response


def _smoke(confirm: ConfirmRun) -> dict[str, Any] | None:
    smoke = (confirm.result or {}).get("smoke")
    if not isinstance(smoke, dict):
        return None
    garbage = smoke.get("garbage") if isinstance(smoke.get("garbage"), dict) else {}
    known = {"text", "error", "garbage", "prompt"}
    extra = [
        (key.replace("_", " "), value)
        for key, value in smoke.items()
        if key not in known and isinstance(value, int | float | str) and not isinstance(value, bool)
    ]
    return {
        "prompt": smoke.get("prompt") or (confirm.job or {}).get("smoke_prompt") or "",
        "text": smoke.get("text"),
        "error": smoke.get("error") or "",
        "garbage": bool(garbage.get("garbage")),
        "kind": garbage.get("kind") or "",
        "reason": garbage.get("reason") or "",
        "extra": extra,
    }


def _throughput_rows(confirm: ConfirmRun) -> list[dict[str, Any]]:
    rows = []
    for point in (confirm.result or {}).get("throughput") or []:
        if not isinstance(point, dict):
            continue
        rate = point.get("tokens_per_s")
        rows.append(
            {
                "concurrency": point.get("concurrency"),
                "requests": point.get("requests"),
                "completion_tokens": point.get("completion_tokens"),
                "seconds": f"{point['seconds']:.1f}" if isinstance(point.get("seconds"), int | float) else "",
                "tokens_per_s": f"{rate:.1f}" if isinstance(rate, int | float) else "",
                "errors": point.get("errors") or 0,
            }
        )
    return rows


@login_required
@require_GET
def confirm(request: HttpRequest, confirm_id: int) -> HttpResponse:
    confirm = _confirm_or_404(request, confirm_id)
    result = confirm.result or {}
    probes = kernel_results(result.get("probes"))
    allreduce = allreduce_result(result.get("probes"))
    gpus = (result.get("inventory") or {}).get("gpus") or []
    gpu_name = gpus[0].get("name") if gpus and isinstance(gpus[0], dict) else None
    new_report = confirm.result_report
    context = {
        **_status_context(confirm),
        "report": confirm.report,
        "new_report": new_report,
        "can_compare": new_report is not None and new_report.status == Report.Status.DONE,
        "argv": _argv(confirm),
        "result": result,
        "smoke": _smoke(confirm),
        "throughput": _throughput_rows(confirm),
        "throughput_fig": gpu_figures.confirm_throughput_figure(
            result.get("throughput") or [], unit=confirm.throughput_unit
        ),
        "throughput_unit": confirm.throughput_unit,
        "identity": confirm.launcher_identity,
        "weights": confirm.weights,
        "probes": [_probe_row(p) for p in probes],
        "probe_fig": gpu_figures.probe_figure(probes, gpu_name=gpu_name),
        "allreduce": allreduce_view(
            allreduce,
            run=None,
            fig_id="confirm-allreduce-fig",
            link=first_link((result.get("inventory") or {}).get("links")),
        )
        if allreduce is not None
        else None,
        "versions": _versions((result.get("inventory") or {}).get("versions") or {}),
        "gpu_label": confirm.gpu_label,
    }
    if confirm.is_finished and confirm.status not in (ConfirmRun.Status.REFUSED, ConfirmRun.Status.CANCELLED):
        context["output_tail"], context["output_cut"] = gpu_selectors.confirm_output_tail(
            confirm, lines=OUTPUT_TAIL_LINES
        )
    return render(request, "front/gpu/confirm.html", context)


@login_required
@require_http_methods(["POST"])
def confirm_cancel(request: HttpRequest, confirm_id: int) -> HttpResponse:
    """The page's Cancel button: a waiting, queued or running confirm is cancelled."""
    from dispatchlab.gpu.services import ConfirmRejected
    from dispatchlab.gpu.services import confirm_cancel as cancel

    confirm = _confirm_or_404(request, confirm_id)
    if not _can_start(request, confirm.report):
        return HttpResponse("You may read this project's runs but not cancel them.", status=403)
    try:
        cancel(confirm=confirm, user=request.user)
    except ConfirmRejected as rejected:
        return HttpResponse(str(rejected), status=400)
    return redirect("front:confirm", confirm_id=confirm.pk)


# ---- compatibility ----


@login_required
@require_GET
def compat(request: HttpRequest) -> HttpResponse:
    return render(request, "front/gpu/compat.html", {"matrix": gpu_selectors.compat_matrix(request.user)})
