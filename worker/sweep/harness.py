"""The sweep's harness: a candidate's entry and the report, timing, rates, the check, and running one
candidate so that it never raises. Checking and CUDA-event timing are worker.probes.harness's; on a host
without a GPU a candidate is timed with time.perf_counter around each call."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.inventory import flashinfer_artifacts
from worker.peaks import peak_for, peaks_for
from worker.probes import harness as probe_harness
from worker.probes.harness import (
    ATOL,
    RTOL,
    Context,
    ModelShapes,
    ProbeResult,
    ProbeStatus,
    Stop,
    build_in_child,
    classify,
    error_line,
    error_type,
)

REPEATS = 20
WARMUP = 3
DEFAULT_JIT_TIMEOUT_S = 120.0
JIT_CACHE_ENV = "DISPATCHLAB_JIT_CACHE"

# Achievable figures measured on the device machine (bench/gpu_probes.py ANCHORS), by peaks.Peak.model.
ACHIEVABLE: dict[str, dict[str, float]] = {
    "H200 SXM": {"bf16": 790.0, "fp8": 1440.0, "memory": 4300.0},
}


@dataclass
class SweepEntry:
    """One candidate: a probe result (status, errors, timing, rates) plus what the sweep adds."""

    result: ProbeResult
    flag_value: str | None = None  # the server's value for this backend; None: a baseline, no server flag
    required: float = 1.0  # share of elements that must match
    anchor_fraction: float | None = None
    available: bool = True  # False: not installed, or cannot run on this host at all
    jit: dict[str, Any] = field(default_factory=dict)  # {"state": cached|built|building, "seconds": N}
    rank: int | None = None

    @property
    def correct(self) -> bool:
        return self.result.status == ProbeStatus.PASSED and self.result.checked

    def to_dict(self) -> dict[str, Any]:
        data = self.result.to_dict()
        data.update(
            flag_value=self.flag_value,
            tolerance={"atol": ATOL, "rtol": RTOL, "required_match": self.required},
            anchor_fraction=self.anchor_fraction,
            available=self.available,
            correct=self.correct,
            jit=self.jit,
            rank=self.rank,
        )
        return data


@dataclass
class SweepReport:
    component: str
    device: str  # "cuda" or "cpu"
    gpu: str | None
    arch: str | None
    hostname: str
    shapes: dict[str, Any]  # the shapes run, per rank
    provenance: dict[str, Any]  # ModelShapesRead.to_dict()
    timing: str
    entries: list[SweepEntry]
    proposed_fix: dict[str, Any] | None
    jit_cache: dict[str, str]
    source: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "component": self.component,
            "device": self.device,
            "gpu": self.gpu,
            "arch": self.arch,
            "hostname": self.hostname,
            "source": self.source,
            "shapes": self.shapes,
            "provenance": self.provenance,
            "timing": self.timing,
            "tolerance": {"atol": ATOL, "rtol": RTOL},
            "candidates": [e.to_dict() for e in self.entries],
            "proposed_fix": self.proposed_fix,
            "jit_cache": self.jit_cache,
            "notes": self.notes,
        }


@dataclass
class Run:
    torch: Any
    device: str
    gpu: str | None
    arch: str | None
    capability: tuple[int, int]
    shapes: dict[str, int]
    dtype: Any
    jit_timeout_s: float


Candidate = Callable[[Run, SweepEntry], None]


# ---------------------------------------------------------------- timing


def sync(run: Run) -> None:
    if run.device == "cuda":
        run.torch.cuda.synchronize()


def time_ms(run: Run, fn: Callable[[], Any], repeats: int = REPEATS) -> float:
    for _ in range(WARMUP):
        fn()
    sync(run)
    if run.device == "cuda":
        return probe_harness.timed(run.torch, fn, repeats)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return float(statistics.median(times))


def rate(run: Run, e: SweepEntry, ms: float, *, flops: float = 0.0, nbytes: float = 0.0, metric: str) -> None:
    r = e.result
    r.ms = round(ms, 4)
    achieved = round(flops / ms / 1e9, 3) if flops else round(nbytes / ms / 1e6, 3)
    if flops:
        r.tflops = achieved
    else:
        r.gbps = achieved
    r.extra["peak_metric"] = metric
    if run.device != "cuda":
        return  # a CPU time against a GPU's datasheet means nothing
    peak = peak_for(run.gpu, metric)
    if peak:
        r.peak_fraction = round(achieved / peak, 3)
    row = peaks_for(run.gpu)
    anchor = ACHIEVABLE.get(row.model, {}).get(metric) if row else None
    if anchor:
        e.anchor_fraction = round(achieved / anchor, 3)
        r.extra["anchor"] = anchor


def check(e: SweepEntry, out: Any, ref: Any) -> None:
    probe_harness.check(e.result, out, ref, required=e.required)
    e.result.extra["checked_elements"] = int(ref.numel())


# ---------------------------------------------------------------- running one candidate


class Unavailable(Exception):
    def __init__(self, status: ProbeStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class Recorded(Exception):
    """The candidate already recorded its outcome (a probe's result)."""


def need_gpu(run: Run) -> None:
    if run.device != "cuda":
        raise Unavailable(ProbeStatus.SKIPPED, "needs a CUDA GPU; this host has none")


def need_cubins() -> None:
    """FlashInfer's download-at-first-use kernels, as the inventory finds them."""
    status = flashinfer_artifacts()
    if not status.available:
        raise Unavailable(
            ProbeStatus.NOT_INSTALLED, f"FlashInfer's cubins are not on this host: {status.reason}"
        )


def need_flashinfer() -> None:
    if importlib.util.find_spec("flashinfer") is None:
        raise Unavailable(
            ProbeStatus.NOT_INSTALLED, "flashinfer is not installed (pip install flashinfer-python)"
        )


def probe_context(run: Run) -> Any:
    need_flashinfer()
    ctx = Context(
        torch=run.torch,
        gpu=run.gpu,
        arch=run.arch,
        capability=run.capability,
        shapes=ModelShapes.from_mapping(run.shapes),
        jit_timeout_s=run.jit_timeout_s,
    )
    ctx.modules = _MODULES
    return ctx


_MODULES: dict[str, Any] = {}  # FlashInfer JIT modules built in this process, shared by the sweep's probes


def jit_state(ctx: Any, r: ProbeResult, code: str, what: str, pattern: str) -> dict[str, Any]:
    """Build (or find cached) a FlashInfer JIT module in a child with the time limit: cached when it
    took under 5 s, built in N s otherwise; a build cut at the limit raises TIMEOUT with its progress."""
    start = time.perf_counter()
    try:
        build_in_child(ctx, r, code, what, pattern)
    except Stop as stop:
        raise Unavailable(stop.status, f"building: {stop}") from None
    took = round(time.perf_counter() - start, 3)
    return {"state": "cached" if took < 5 else "built", "seconds": took}


def jit_cache_dirs(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Persistent JIT caches (set unless the host set its own): FlashInfer's workspace and Triton's."""
    env = os.environ if environ is None else environ
    base = Path(env.get(JIT_CACHE_ENV) or Path.home() / ".cache" / "dispatchlab" / "jit")
    env.setdefault("FLASHINFER_WORKSPACE_BASE", str(base / "flashinfer"))
    env.setdefault("TRITON_CACHE_DIR", str(base / "triton"))
    return {"flashinfer": env["FLASHINFER_WORKSPACE_BASE"], "triton": env["TRITON_CACHE_DIR"]}


def run_candidate(run: Run, e: SweepEntry, fn: Callable[..., None], inputs: Any, ref: Any) -> None:
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn(run, e, inputs, ref)
    except Unavailable as why:
        e.result.status, e.result.error = why.status, str(why)
        e.available = why.status not in (ProbeStatus.NOT_INSTALLED, ProbeStatus.SKIPPED)
    except Recorded:
        pass
    except Exception as error:  # the library's refusal, in its own words
        e.result.error = error_line(error)
        notes = list(dict.fromkeys(str(w.message).strip() for w in caught))[:5]
        e.result.error_detail = "\n".join([f"{error_type(error)}: {error}"[:4000], *notes])
        e.result.status = classify(e.result.error_detail, below_arch=False)
        if isinstance(error, ImportError | ModuleNotFoundError):
            e.result.status, e.available = ProbeStatus.NOT_INSTALLED, False
        if run.device != "cuda" and re.search(r"driver|No viable backend", e.result.error_detail, re.I):
            e.available = False
        for key in ("ms", "tflops", "gbps", "peak_fraction"):
            setattr(e.result, key, None)
        e.anchor_fraction = None
    finally:
        with contextlib.suppress(Exception):
            if run.device == "cuda":
                run.torch.cuda.empty_cache()
