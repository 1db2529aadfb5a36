"""The probes' one harness: what a probe is and returns, how it is run, timed and checked.

- `ProbeResult` / `ProbeStatus`: a result shaped like a flashinfer-bench evaluation (see worker.probes).
- `timed` / `measure`: CUDA events after warm-ups; the median of a short burst is the headline, a
  ~200 ms sustained run and the SM clocks go to `extra`. `rate` turns a time into TFLOP/s or GB/s and
  the share of the datasheet peak (worker.peaks).
- `check` / `check_output`: flashinfer-bench's rule, atol = rtol = 1e-2, an element fails only past
  both; `perturb` pushes every element past the tolerance first (the control run).
- `open_context` / `run_one`: a probe never raises; a failure is classified from its own words
  (UNSUPPORTED_ARCH, COMPILE_ERROR, MISSING_ARTIFACTS, RUNTIME_ERROR) and GPU memory is freed after it.

Every component module (gemm, attention, moe, memory, jit) and the backend sweep (worker.sweep) use
these, never their own. DEVICE, CHECK_ROWS and `measure` are read through this module (`harness.DEVICE`)
so that one setting reaches every component.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from worker.inventory import ArtifactState, ArtifactStatus, flashinfer_artifacts
from worker.peaks import peak_for

DEFAULT_JIT_TIMEOUT_S = 240.0
DEVICE = "cuda"

CHECK_ROWS = 256  # output rows compared against the float32 reference
BURST_MS = 12.0  # timing windows of `measure`
SUSTAINED_MS = 200.0
MODEL_SHAPES_ENV = "DISPATCHLAB_PROBE_MODEL_SHAPES"
ATOL = RTOL = 1e-2


class ProbeStatus(StrEnum):
    PASSED = "PASSED"  # compared with the reference, and within the tolerance
    INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
    UNCHECKED = "UNCHECKED"  # ran, but its output was not compared with anything
    MISSING_ARTIFACTS = "MISSING_ARTIFACTS"  # FlashInfer's downloaded kernels are not on this host
    RUNTIME_ERROR = "RUNTIME_ERROR"
    UNSUPPORTED_ARCH = "UNSUPPORTED_ARCH"
    COMPILE_ERROR = "COMPILE_ERROR"
    NOT_INSTALLED = "NOT_INSTALLED"
    SKIPPED = "SKIPPED"
    TIMEOUT = "TIMEOUT"


RAN = frozenset({ProbeStatus.PASSED, ProbeStatus.INCORRECT_NUMERICAL, ProbeStatus.UNCHECKED})


class Component(StrEnum):
    GEMM = "gemm"
    ATTENTION = "attention"
    MOE = "moe"
    MEMORY = "memory"
    JIT = "jit"


@dataclass
class ProbeResult:
    name: str
    backend: str
    component: str
    status: ProbeStatus = ProbeStatus.SKIPPED
    error: str | None = None  # "<ExceptionType>: <first line>", or why the probe did not run
    max_error: float | None = None  # max |out - ref| over the checked elements
    max_rel_error: float | None = None  # max |out - ref| / |ref| where |ref| >= atol
    matched_ratio: float | None = None  # share of elements within atol + rtol * |ref|
    checked: bool = False  # compared against a reference
    ms: float | None = None  # median latency
    tflops: float | None = None
    gbps: float | None = None
    peak_fraction: float | None = None  # of the datasheet bf16/fp8/fp4 TFLOP/s or memory GB/s
    shape: dict[str, Any] = field(default_factory=dict)
    arch: str | None = None
    gpu: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # compile time, target, resolved kernel path ...
    error_detail: str | None = None  # the whole message (and warnings) when it failed

    @property
    def runs(self) -> bool:
        return self.status in RAN

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        head = {"name": self.name, "backend": self.backend, "component": self.component, "runs": self.runs}
        data.update(head, status=str(self.status))
        safe: dict[str, Any] = _json_safe(head | data)
        return safe

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeResult:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["status"] = ProbeStatus(values.get("status", ProbeStatus.RUNTIME_ERROR))
        return cls(**values)


@dataclass(frozen=True)
class ModelShapes:
    """The model's kernel shapes; defaults are DeepSeek-V3-like MoE and Llama-like GQA attention."""

    hidden_size: int = 7168
    moe_intermediate_size: int = 2048
    num_experts: int = 256
    top_k: int = 8
    tokens: int = 4096
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128

    # Hugging Face config.json spellings of the same numbers.
    ALIASES = {
        "n_routed_experts": "num_experts",
        "num_local_experts": "num_experts",
        "num_experts_per_tok": "top_k",
        "num_tokens": "tokens",
    }

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> ModelShapes:
        if not data:
            return cls()
        known = {f.name for f in fields(cls)}
        values: dict[str, int] = {}
        for key, value in data.items():
            name = cls.ALIASES.get(key, key)
            if name not in known or value is None:
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or int(value) != value
                or value <= 0
            ):
                raise ValueError(f"model shape {key}={value!r}: a positive integer is needed")
            values[name] = int(value)
        return cls(**values)


class Stop(Exception):
    """A probe decided its own outcome (skipped for memory, timed out building ...)."""

    def __init__(self, status: ProbeStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Context:
    """What the probes of one run share: torch (None where it cannot run, and `unavailable` says why),
    the GPU, the model's shapes, the libraries imported so far."""

    torch: Any = None
    unavailable: tuple[ProbeStatus, str] | None = None
    gpu: str | None = None
    arch: str | None = None
    capability: tuple[int, int] = (0, 0)
    shapes: ModelShapes = field(default_factory=ModelShapes)
    jit_timeout_s: float = DEFAULT_JIT_TIMEOUT_S
    modules: dict[str, Any] = field(default_factory=dict)
    artifacts: ArtifactStatus | None = None  # FlashInfer's downloaded kernels, looked up when first needed
    perturb: bool = False  # the control run: push every checked output past the tolerance


ProbeFn = Callable[[Context, ProbeResult], None]


@dataclass(frozen=True)
class Probe:
    name: str
    backend: str
    component: Component
    description: str
    fn: ProbeFn
    needs: str = "torch"  # "torch", "triton" or "flashinfer" (which also need torch)
    min_capability: tuple[int, int] | None = None  # below it, a failure is the arch's refusal
    capabilities: frozenset[tuple[int, int]] | None = None  # outside them, likewise
    downloads: bool = False  # its kernels are cubins FlashInfer downloads at first use (trtllm-gen)


# ---------------------------------------------------------------- timing and checking


def timed(torch: Any, fn: Callable[[], Any], runs: int) -> float:
    """Median milliseconds of `runs` back-to-back calls, each between two CUDA events."""
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)
    ]
    for begin, finish in events:
        begin.record()
        fn()
        finish.record()
    torch.cuda.synchronize()
    return float(statistics.median(begin.elapsed_time(finish) for begin, finish in events))


def _sm_clock(torch: Any) -> int | None:
    with contextlib.suppress(Exception):
        return int(torch.cuda.clock_rate())
    return None


def measure(
    ctx: Context,
    r: ProbeResult,
    fn: Callable[[], Any],
    *,
    flops: float = 0.0,
    nbytes: float = 0.0,
    metric: str,
) -> None:
    """Time `fn` after warm-ups: the headline is the median over a short burst (about BURST_MS, as a
    benchmark of the kernel would time it); the median over about SUSTAINED_MS of back-to-back calls goes
    to extra.sustained_ms, with the SM clock after each: a card at its power limit clocks down under a
    long run of heavy GEMMs (seen on an H200: bf16 8192^3 at ~790 TFLOP/s in bursts, ~690 sustained)."""
    torch = ctx.torch
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    estimate = max(timed(torch, fn, 1), 1e-3)
    burst = timed(torch, fn, int(min(200, max(10, BURST_MS / estimate))))
    r.extra["sm_clock_mhz"] = _sm_clock(torch)
    sustained = timed(torch, fn, int(min(500, max(3, SUSTAINED_MS / estimate))))
    r.extra["sustained_ms"] = round(sustained, 4)
    r.extra["sustained_sm_clock_mhz"] = _sm_clock(torch)
    rate(ctx, r, burst, flops=flops, nbytes=nbytes, metric=metric)


def check(r: ProbeResult, out: Any, ref: Any, *, required: float = 1.0, perturb: bool = False) -> None:
    """flashinfer-bench's rule: an element fails only past both atol and rtol * |ref|; NaN never passes.
    `perturb` moves every element by twice its tolerance first (the control run)."""
    got, want = out.float(), ref.float()
    if perturb:
        got = got + 2 * (ATOL + RTOL * want.abs())
        r.extra["perturbed"] = "every element moved by 2 x (atol + rtol * |ref|) before the check"
    diff = (got - want).abs()
    finite = got.isfinite()
    within = (diff <= ATOL + RTOL * want.abs()) & finite
    r.matched_ratio = float(within.float().mean().item())
    r.checked = True
    non_finite = int((~finite).sum().item())
    if non_finite:
        r.extra["non_finite"] = non_finite
    finite_diff = diff[finite]
    r.max_error = float(finite_diff.max().item()) if finite_diff.numel() else None
    big = (want.abs() >= ATOL) & finite
    rel = diff[big] / want.abs()[big]
    r.max_rel_error = float(rel.max().item()) if rel.numel() else None
    if r.matched_ratio >= required:
        r.status = ProbeStatus.PASSED
    else:
        r.status = ProbeStatus.INCORRECT_NUMERICAL
        r.error = (
            f"{(1 - r.matched_ratio) * 100:.2f}% of elements outside atol=rtol={ATOL:g}"
            f" (at most {(1 - required) * 100:g}% allowed); max abs error {r.max_error}"
        )


def check_output(ctx: Context, r: ProbeResult, out: Any, ref: Any, *, required: float = 1.0) -> None:
    check(r, out, ref, required=required, perturb=ctx.perturb)


def rate(
    ctx: Context, r: ProbeResult, ms: float, *, flops: float = 0.0, nbytes: float = 0.0, metric: str
) -> None:
    r.ms = round(ms, 4)
    if flops:
        r.tflops = round(flops / ms / 1e9, 1)
        achieved = r.tflops
    else:
        r.gbps = round(nbytes / ms / 1e6, 1)
        achieved = r.gbps
    peak = peak_for(ctx.gpu, metric)
    r.extra["peak_metric"] = metric
    if peak:
        r.peak_fraction = round(achieved / peak, 3)


def free_gib(ctx: Context) -> float:
    free, _ = ctx.torch.cuda.mem_get_info()
    return float(free) / (1 << 30)


def require_memory(ctx: Context, nbytes: float, what: str) -> None:
    need, free = nbytes / (1 << 30), free_gib(ctx)
    if need > 0.9 * free:
        raise Stop(ProbeStatus.SKIPPED, f"{what} needs {need:.1f} GiB of GPU memory, {free:.1f} GiB free")


# ---------------------------------------------------------------- libraries and their JIT builds


def import_once(ctx: Context, name: str = "flashinfer") -> Any:
    """Import flashinfer (or one of its modules) once per run, timing the first import."""
    if name not in ctx.modules:
        start = time.perf_counter()
        ctx.modules[name] = importlib.import_module(name)
        ctx.modules[f"{name}:import_s"] = round(time.perf_counter() - start, 3)
    return ctx.modules[name]


def first_call(ctx: Context, r: ProbeResult, fn: Callable[[], Any]) -> Any:
    """The first call, which JIT-builds and loads the module; its time goes to extra.first_call_s."""
    start = time.perf_counter()
    out = fn()
    ctx.torch.cuda.synchronize()
    r.extra["first_call_s"] = round(time.perf_counter() - start, 3)
    return out


def ninja_progress(jit_dir: Path, pattern: str) -> str:
    builds = sorted(
        (p for p in jit_dir.glob("*/build.ninja") if re.fullmatch(pattern, p.parent.name)),
        key=lambda p: p.stat().st_mtime,
    )
    if not builds:
        return "no build started"
    objects = re.findall(r"^build (\S+\.o): ", builds[-1].read_text(encoding="utf-8"), re.M)
    done = sum(Path(o).exists() for o in objects)
    return f"{done} of {len(objects)} objects of {builds[-1].parent.name} built"


def build_in_child(ctx: Context, r: ProbeResult, code: str, what: str, pattern: str) -> None:
    """Build a FlashInfer JIT module in a child process with a time limit: the CUTLASS fused MoE is some
    180 CUTLASS translation units (many minutes the first time on a host, then cached). Killed at the
    limit, the build keeps what it compiled, and ninja resumes it on the next run."""
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        child.communicate(timeout=ctx.jit_timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        jit_dir = Path(import_once(ctx, "flashinfer.jit.env").FLASHINFER_JIT_DIR)
        progress = ninja_progress(jit_dir, pattern)
        r.extra["jit_progress"] = progress
        raise Stop(
            ProbeStatus.TIMEOUT,
            f"JIT build of {what} not finished after {ctx.jit_timeout_s:g} s ({progress}); the next run resumes it",
        ) from None
    r.extra["build_s"] = round(time.perf_counter() - start, 3)
    # On failure the call below raises the same error in this process, where it is classified.


# ---------------------------------------------------------------- running one probe


def open_context(shapes: ModelShapes, jit_timeout_s: float) -> Context:
    ctx = Context(shapes=shapes, jit_timeout_s=jit_timeout_s)
    try:
        torch: Any = importlib.import_module("torch")
    except ImportError:
        ctx.unavailable = (ProbeStatus.NOT_INSTALLED, "torch is not installed")
        return ctx
    except Exception as error:
        ctx.unavailable = (ProbeStatus.RUNTIME_ERROR, f"import torch failed: {error_line(error)}")
        return ctx
    if getattr(torch.version, "hip", None):
        ctx.unavailable = (ProbeStatus.SKIPPED, "ROCm GPUs are not probed yet")
        return ctx
    try:
        available = torch.cuda.is_available()
    except Exception as error:
        available, why = False, error_line(error)
    else:
        why = f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA GPU"
    if not available:
        ctx.unavailable = (ProbeStatus.SKIPPED, f"no GPU: {why}")
        return ctx
    major, minor = torch.cuda.get_device_capability()
    ctx.torch, ctx.gpu, ctx.capability = torch, torch.cuda.get_device_name(), (int(major), int(minor))
    ctx.arch = f"sm_{major}{minor}"
    return ctx


def run_one(probe: Probe, ctx: Context) -> ProbeResult:
    r = ProbeResult(probe.name, probe.backend, str(probe.component), arch=ctx.arch, gpu=ctx.gpu)
    if ctx.unavailable is not None:
        r.status, r.error = ctx.unavailable
        return r
    if probe.needs != "torch" and importlib.util.find_spec(probe.needs) is None:
        r.status = ProbeStatus.NOT_INSTALLED
        hint = " (pip install flashinfer-python)" if probe.needs == "flashinfer" else ""
        r.error = f"{probe.needs} is not installed{hint}"
        return r
    if probe.downloads:
        if ctx.artifacts is None:
            ctx.artifacts = flashinfer_artifacts()
        r.extra["artifacts"] = str(ctx.artifacts.state)
        if not ctx.artifacts.available and ctx.artifacts.state != ArtifactState.NOT_INSTALLED:
            r.status = ProbeStatus.MISSING_ARTIFACTS
            r.error = f"FlashInfer's downloaded kernels are not on this host: {ctx.artifacts.reason}"
            r.error_detail = f"fix: {ctx.artifacts.fix}"
            return r
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            probe.fn(ctx, r)
        if r.status in (ProbeStatus.SKIPPED, ProbeStatus.PASSED) and not r.checked:
            r.status = ProbeStatus.UNCHECKED  # ran to the end, compared with nothing
    except Stop as stop:
        r.status, r.error = stop.status, str(stop)
    except Exception as error:
        _record_failure(probe, ctx, r, error, caught)
    finally:
        _release(ctx)
    return r


def _record_failure(
    probe: Probe, ctx: Context, r: ProbeResult, error: BaseException, caught: list[warnings.WarningMessage]
) -> None:
    r.error = error_line(error)
    notes = list(dict.fromkeys(str(w.message).strip() for w in caught))[:5]
    r.error_detail = "\n".join([f"{error_type(error)}: {error}"[:4000], *notes])
    r.status = classify(r.error_detail, below_arch=_outside_arch(probe, ctx))
    for key in ("ms", "tflops", "gbps", "peak_fraction"):
        setattr(r, key, None)


_OOM = re.compile(r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED", re.I)
_FETCH = re.compile(r"Failed to (?:get|download)|download|Connection|HTTP|URL|Max retries", re.I)
# FlashInfer's own words when a cubin (or its checksums.txt) could not be fetched.
_DOWNLOAD = re.compile(
    r"Failed to (?:get|download) (?:checksums\.txt|\S*\.cubin|cubin)|download(?:ing)? (?:of )?cubin", re.I
)
_ARCH = re.compile(
    r"compute capability|capability \d|architecture|\bSM ?\d{2,3}\b|\bsm_?\d{2,3}[af]?\b|no kernel image"
    r"|not supported on (?:this )?(?:device|GPU)|only supported (?:on|in CUDA for)|unsupported (?:GPU|arch|device)",
    re.I,
)
_COMPILE = re.compile(
    r"Ninja build failed|nvcc|ptxas|CompilationError|compil(?:e|ation) (?:error|failed)", re.I
)


def classify(text: str, *, below_arch: bool) -> ProbeStatus:
    if _OOM.search(text):
        return ProbeStatus.RUNTIME_ERROR
    if _DOWNLOAD.search(text):
        return ProbeStatus.MISSING_ARTIFACTS
    if _ARCH.search(text):
        return ProbeStatus.UNSUPPORTED_ARCH
    if _COMPILE.search(text):
        return ProbeStatus.COMPILE_ERROR
    if below_arch and not _FETCH.search(text):
        return ProbeStatus.UNSUPPORTED_ARCH
    return ProbeStatus.RUNTIME_ERROR


def _outside_arch(probe: Probe, ctx: Context) -> bool:
    if probe.min_capability is not None and ctx.capability < probe.min_capability:
        return True
    return probe.capabilities is not None and ctx.capability not in probe.capabilities


def error_type(error: BaseException) -> str:
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def error_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{error_type(error)}: {lines[0] if lines else ''}".rstrip(": ")[:500]


def _release(ctx: Context) -> None:
    gc.collect()
    if ctx.torch is not None:
        with contextlib.suppress(Exception):
            ctx.torch.cuda.empty_cache()


def context_broken(ctx: Context) -> str | None:
    """The error a trivial CUDA call raises once a kernel has broken the context, else None."""
    if ctx.torch is None:
        return None
    try:
        ctx.torch.cuda.synchronize()
        ctx.torch.ones(1, device=DEVICE).add_(1).item()
    except Exception as error:
        return error_line(error)
    return None


def _json_safe(value: Any) -> Any:
    """NaN and infinities are not JSON: report them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value
