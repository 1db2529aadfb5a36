"""The backend sweep's services: create a sweep of a report's component (shapes read from its document),
queue it to `gpu.<arch>`, store the worker's answer, and confirm the full launch with the backend the
sweep proposes (through the confirm service). Thin tasks in sweep_tasks.py call these."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from dispatchlab.core.reading import LogReadError, iter_lines
from dispatchlab.core.shapes import (
    READ_ARGS,
    READ_CONFIG,
    ModelShapesRead,
    read_shapes,
    read_shapes_from_document,
)
from dispatchlab.gpu.models import SweepRun
from dispatchlab.gpu.services import _send
from dispatchlab.messaging.contract import arch_queue
from dispatchlab.messaging.sweep import COMPONENTS, SWEEP_TASK, SweepJob
from dispatchlab.reports.models import Report

# The args dump and the model's config come at start-up: the sweep reads this many lines of the log.
SHAPES_HEAD_LINES = 20_000


class SweepRejected(ValueError):
    """The sweep cannot be asked for (unknown component, report not parsed), or its proposed fix cannot
    be confirmed (no proposed fix). For people."""


# The server flags that choose each component's backend (SGLang and vLLM spellings, without dashes).
COMPONENT_FLAGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("moe", ("moe-runner-backend", "moe-backend", "moe-a2a-backend", "all2all-backend")),
    ("sampling", ("sampling-backend",)),
    ("attention", ("attention-backend", "mm-attention-backend", "mla-backend")),
    ("gemm", ("gemm-runner-backend", "gemm-backend")),
)
# Words of a diagnosis or a crash that name a component, strongest first within each source.
COMPONENT_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("moe", ("moe", "expert", "cutedsl", "cutlass_fused")),
    ("sampling", ("sampling", "sampler", "top_p", "top-p", "min_p")),
    ("attention", ("attention", "attn", "fa3", "flashmla", "mla", "sdpa", "fmha", "prefill", "decode")),
    ("gemm", ("gemm", "matmul", "cublas", "scaled_mm", "fp8", "fp4", "nvfp4", "mxfp4")),
)


@dataclass(frozen=True)
class ComponentGuess:
    """The component a crash names, and why, in words (the report page pre-selects it)."""

    component: str
    why: str
    guessed: bool = True  # False: nothing named one; `component` is the first of COMPONENTS


def _flag_component(flag: str) -> str | None:
    name = flag.lstrip("-").replace("_", "-")
    for component, flags in COMPONENT_FLAGS:
        if any(name == f or name.endswith("-" + f) for f in flags):
            return component
    return None


def _word_component(text: str) -> tuple[str, str] | None:
    lowered = text.lower()
    for component, words in COMPONENT_WORDS:
        for word in words:
            if re.search(rf"(?<![a-z0-9]){re.escape(word)}", lowered):
                return component, word
    return None


def sweep_component_for(document: dict[str, Any]) -> ComponentGuess:
    """The component to sweep for a crash: the backend flag the top diagnosis's fix changes, else a
    word of the diagnosis (id, title), else of the crash (exception, message, kernels)."""
    matches = [m for m in document.get("matches") or [] if isinstance(m, dict)]
    top = matches[0] if matches else {}
    for match in matches:
        fix = match.get("fix") if isinstance(match.get("fix"), dict) else {}
        for flag in fix.get("args") or {}:
            component = _flag_component(str(flag))
            if component:
                return ComponentGuess(component, f"the diagnosis's fix changes {flag}")
    diagnosis = " ".join(str(top.get(key) or "") for key in ("id", "title"))
    found = _word_component(diagnosis)
    if found:
        return ComponentGuess(found[0], f"the diagnosis ({top.get('id')}) says {found[1]!r}")
    crash = document.get("crash") if isinstance(document.get("crash"), dict) else {}
    crash_text = " ".join(
        [str(crash.get("exception") or ""), str(crash.get("message") or "")]
        + [str(k) for k in document.get("kernels") or []]
    )
    found = _word_component(crash_text)
    if found:
        return ComponentGuess(found[0], f"the crash says {found[1]!r}")
    return ComponentGuess(COMPONENTS[0], "nothing in the crash names a component: pick one", guessed=False)


def shapes_of_report(report: Report) -> ModelShapesRead:
    """The model's shapes from the head of the stored log (its args dump and any config values it
    prints, with their line numbers); from the parsed document where the log is gone or reads nothing."""
    paths = []
    for stored in report.files.all():
        try:
            paths.append(stored.file.path)
        except (NotImplementedError, ValueError):  # a storage without local paths
            continue
    if paths:
        try:
            lines = iter_lines(paths)
            head = [line for _, line in zip(range(SHAPES_HEAD_LINES), lines, strict=False)]
        except (OSError, LogReadError):
            head = []
        read = read_shapes(head)
        if read.by_source(READ_ARGS) or read.by_source(READ_CONFIG):
            return read
    return read_shapes_from_document(dict(report.document or {}))


def sweep_create(*, report: Report, component: str, user: Any = None, tokens: int | None = None) -> SweepRun:
    if component not in COMPONENTS:
        raise SweepRejected(f"unknown component {component!r}: one of {', '.join(COMPONENTS)}")
    if report.status != Report.Status.DONE:
        raise SweepRejected("the report is not parsed yet")
    shapes = shapes_of_report(report).to_dict()
    arch = report.arch or ""
    sweep = SweepRun.objects.create(
        project=report.project,
        report=report,
        created_by=user if getattr(user, "is_authenticated", False) else None,
        component=component,
        arch=arch,
        queue=arch_queue(arch or None),
        shapes=shapes,
    )
    job: SweepJob = {"sweep_id": sweep.id, "component": component, "shapes": shapes, "tokens": tokens}
    transaction.on_commit(lambda: _send(SWEEP_TASK, {"job": dict(job)}, sweep.queue))
    return sweep


def sweep_started(*, payload: dict[str, Any]) -> SweepRun | None:
    """A host took the sweep: it is running there. Late or repeated, it never rewinds a finished one."""
    sweep_id = payload.get("sweep_id")
    if not isinstance(sweep_id, int):
        return None
    SweepRun.objects.filter(pk=sweep_id, status=SweepRun.Status.QUEUED).update(
        status=SweepRun.Status.RUNNING,
        host_name=str(payload.get("host") or "")[:200],
        started_at=timezone.now(),
    )
    return SweepRun.objects.filter(pk=sweep_id).first()


def sweep_finished(*, payload: dict[str, Any]) -> SweepRun | None:
    """Store the worker's answer once: a second delivery of a finished sweep changes nothing."""
    sweep_id = payload.get("sweep_id")
    if not isinstance(sweep_id, int):
        return None
    error = str(payload.get("error") or "")
    result = payload.get("result") if isinstance(payload.get("result"), dict) else {}
    # a second delivery updates no row: the sweep is no longer queued or running
    SweepRun.objects.filter(pk=sweep_id, status__in=SweepRun.WAITING).update(
        status=SweepRun.Status.FAILED if error or not result else SweepRun.Status.DONE,
        error=error[:2000],
        result=result,
        host_name=str(payload.get("host") or "")[:200],
        finished_at=timezone.now(),
    )
    return SweepRun.objects.filter(pk=sweep_id).first()


def sweep_confirm(*, sweep: SweepRun, user: Any) -> Any:
    """Queue a confirm of the report's full launch with the sweep's proposed backend (its args patch
    only: the diagnosis's own patch is what the sweep replaces; the launch's environment is kept).
    Raises SweepRejected without a proposed fix, ConfirmRejected as the confirm service does."""
    from dispatchlab.gpu.services import confirm_create

    fix = sweep.proposed_fix
    if sweep.status != SweepRun.Status.DONE or not fix or not isinstance(fix.get("args_patch"), dict):
        raise SweepRejected(
            "this sweep proposes no fix: no correct candidate with a value of the server's flag"
        )
    return confirm_create(report=sweep.report, user=user, args_patch=dict(fix["args_patch"]), env_patch={})
