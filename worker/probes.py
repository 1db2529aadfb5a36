"""Kernel probes: does a kernel run on this GPU, is it right, and how fast is it against the datasheet.

Each probe runs one kernel the way an inference server would (cuBLAS GEMMs, scaled FP8/FP4 GEMMs, SDPA
backends, a Triton JIT kernel, MoE grouped GEMMs, FlashInfer attention and fused MoE) and returns a
`ProbeResult` shaped like a flashinfer-bench evaluation: a status (PASSED, INCORRECT_NUMERICAL,
UNCHECKED, RUNTIME_ERROR, UNSUPPORTED_ARCH, COMPILE_ERROR, MISSING_ARTIFACTS, NOT_INSTALLED, SKIPPED,
TIMEOUT), the first line of the
exception a refusing kernel raised, the max absolute and relative error against a torch reference
(atol = rtol = 1e-2; an element fails only past both; 100% must match, 95% for MoE), the median latency
over CUDA events after warm-ups (a short burst; a ~200 ms sustained run and the SM clocks in `extra`),
TFLOP/s or GB/s, and the fraction of the datasheet peak (worker.peaks).

PASSED means the output was compared with the reference and matched: a probe that ran to the end without
comparing anything is UNCHECKED. A probe whose kernel FlashInfer downloads at first use (trtllm-gen) answers
MISSING_ARTIFACTS at once, with the fix, where `worker.inventory.flashinfer_artifacts()` finds neither the
cubins nor the download host, instead of waiting on FlashInfer's download retries. `perturb=True` (the
CLI's --perturb) is a control run: every checked output is pushed past the tolerance before the
comparison, so every checked probe must then say INCORRECT_NUMERICAL.

A probe never raises. Without torch, a GPU, Triton or FlashInfer the probes say so (NOT_INSTALLED,
SKIPPED); GPU memory is freed between probes; if one probe leaves the CUDA context broken (an illegal
address is sticky), the probes after it run in a fresh process. torch, triton and flashinfer are imported
inside the functions that use them.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from worker.inventory import ArtifactState, ArtifactStatus, flashinfer_artifacts
from worker.peaks import peak_for

DEFAULT_JIT_TIMEOUT_S = 240.0
DEVICE = "cuda"

# Problem sizes: large enough to fill an H200 and leave its 60 MB L2 far behind, small enough that the
# torch and Triton probes take about 15 s there; FlashInfer's JIT builds come on top (decode ~9 s,
# prefill ~70 s, the CUTLASS fused MoE ~40 min the first time, hence its DEFAULT_JIT_TIMEOUT_S).
GEMM_N = 8192  # m = n = k of the dense GEMMs
TRITON_N = 4096
COPY_BYTES = 2 << 30
SDPA_SHAPE = (8, 32, 4096, 128)  # batch, heads, sequence, head dim
DECODE_KV_LEN = 65536
PREFILL_LEN = 8192
CHECK_ROWS = 256  # output rows compared against the float32 reference
MOE_CHECK_TOKENS = 32
BURST_MS = 12.0  # timing windows of `_measure`
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


class _Stop(Exception):
    """A probe decided its own outcome (skipped for memory, timed out building ...)."""

    def __init__(self, status: ProbeStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Context:
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


ProbeFn = Callable[[_Context, ProbeResult], None]


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


def _timed(torch: Any, fn: Callable[[], Any], runs: int) -> float:
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


def _measure(
    ctx: _Context,
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
    estimate = max(_timed(torch, fn, 1), 1e-3)
    burst = _timed(torch, fn, int(min(200, max(10, BURST_MS / estimate))))
    r.extra["sm_clock_mhz"] = _sm_clock(torch)
    sustained = _timed(torch, fn, int(min(500, max(3, SUSTAINED_MS / estimate))))
    r.extra["sustained_ms"] = round(sustained, 4)
    r.extra["sustained_sm_clock_mhz"] = _sm_clock(torch)
    _rate(ctx, r, burst, flops=flops, nbytes=nbytes, metric=metric)


def _check(r: ProbeResult, out: Any, ref: Any, *, required: float = 1.0, perturb: bool = False) -> None:
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


def _check_ctx(ctx: _Context, r: ProbeResult, out: Any, ref: Any, *, required: float = 1.0) -> None:
    _check(r, out, ref, required=required, perturb=ctx.perturb)


def _rate(
    ctx: _Context, r: ProbeResult, ms: float, *, flops: float = 0.0, nbytes: float = 0.0, metric: str
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


def _free_gib(ctx: _Context) -> float:
    free, _ = ctx.torch.cuda.mem_get_info()
    return float(free) / (1 << 30)


def _require_memory(ctx: _Context, nbytes: float, what: str) -> None:
    need, free = nbytes / (1 << 30), _free_gib(ctx)
    if need > 0.9 * free:
        raise _Stop(ProbeStatus.SKIPPED, f"{what} needs {need:.1f} GiB of GPU memory, {free:.1f} GiB free")


# ---------------------------------------------------------------- GEMMs


def _gemm_bf16(ctx: _Context, r: ProbeResult) -> None:
    torch, n = ctx.torch, GEMM_N
    r.shape = {"m": n, "n": n, "k": n, "dtype": "bfloat16"}
    a = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=DEVICE, dtype=torch.bfloat16)
    torch.mm(a, b, out=c)
    _check_ctx(ctx, r, c[:CHECK_ROWS], a[:CHECK_ROWS].float() @ b.float())
    _measure(ctx, r, lambda: torch.mm(a, b, out=c), flops=2.0 * n**3, metric="bf16")


def _gemm_fp8(fast_accum: bool) -> ProbeFn:
    def probe(ctx: _Context, r: ProbeResult) -> None:
        torch, n = ctx.torch, GEMM_N
        r.shape = {"m": n, "n": n, "k": n, "dtype": "float8_e4m3fn", "scales": "per-tensor"}
        r.extra["use_fast_accum"] = fast_accum
        a = torch.randn(n, n, device=DEVICE).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=DEVICE).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
        scale_a = torch.tensor(0.5, device=DEVICE)
        scale_b = torch.tensor(0.25, device=DEVICE)

        def run() -> Any:
            return torch._scaled_mm(
                a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16, use_fast_accum=fast_accum
            )

        out = run()
        _check_ctx(ctx, r, out[:CHECK_ROWS], (a[:CHECK_ROWS].float() @ b.float()) * 0.125)
        _measure(ctx, r, run, flops=2.0 * n**3, metric="fp8")

    return probe


def _fp4_values(torch: Any, packed: Any) -> Any:
    """float32 values of packed E2M1 pairs (low nibble first). Both operands use the same order, so a
    swapped order would give the same dot products."""
    table = torch.tensor(
        [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
        device=packed.device,
    )
    codes = packed.view(torch.uint8)
    low, high = table[(codes & 0xF).long()], table[(codes >> 4).long()]
    return torch.stack((low, high), dim=-1).reshape(codes.shape[0], codes.shape[1] * 2)


def _gemm_fp4(recipe: str) -> ProbeFn:
    """MXFP4 (E2M1 data, E8M0 scales per 32) or NVFP4 (E4M3 scales per 16) through torch's scaled mm.
    Every scale is 1.0, so the blocked (32x4x4 swizzled) scale layout cannot change the result."""
    block = 32 if recipe == "mxfp4" else 16

    def probe(ctx: _Context, r: ProbeResult) -> None:
        torch, n = ctx.torch, GEMM_N
        fp4 = getattr(torch, "float4_e2m1fn_x2", None)
        if fp4 is None:
            raise _Stop(ProbeStatus.NOT_INSTALLED, f"torch {torch.__version__} has no float4_e2m1fn_x2 dtype")
        scale_dtype = "float8_e8m0fnu" if recipe == "mxfp4" else "float8_e4m3fn"
        r.shape = {
            "m": n,
            "n": n,
            "k": n,
            "dtype": "float4_e2m1fn_x2",
            "scales": f"{scale_dtype} per {block}",
        }
        a_codes = torch.randint(0, 256, (n, n // 2), device=DEVICE, dtype=torch.uint8)
        b_codes = torch.randint(0, 256, (n, n // 2), device=DEVICE, dtype=torch.uint8)
        a, b = a_codes.view(fp4), b_codes.view(fp4).t()
        numel = math.ceil(n / 128) * 128 * math.ceil(n // block / 4) * 4
        if recipe == "mxfp4":
            scale = torch.full((numel,), 127, device=DEVICE, dtype=torch.uint8).view(torch.float8_e8m0fnu)
        else:
            scale = torch.ones(numel, device=DEVICE).to(torch.float8_e4m3fn)
        functional = torch.nn.functional
        if hasattr(functional, "scaled_mm") and hasattr(functional, "ScalingType"):
            r.backend = "torch.nn.functional.scaled_mm"
            kind = (
                functional.ScalingType.BlockWise1x32 if block == 32 else functional.ScalingType.BlockWise1x16
            )
            swizzle = functional.SwizzleType.SWIZZLE_32_4_4

            def run() -> Any:
                return functional.scaled_mm(
                    a,
                    b,
                    scale_a=scale,
                    scale_recipe_a=kind,
                    scale_b=scale,
                    scale_recipe_b=kind,
                    swizzle_a=swizzle,
                    swizzle_b=swizzle,
                    output_dtype=torch.bfloat16,
                )
        else:
            r.backend = "torch._scaled_mm"

            def run() -> Any:
                return torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)

        out = run()
        _check_ctx(
            ctx,
            r,
            out[:CHECK_ROWS],
            _fp4_values(torch, a_codes[:CHECK_ROWS]) @ _fp4_values(torch, b_codes).t(),
        )
        _measure(ctx, r, run, flops=2.0 * n**3, metric="fp4")

    return probe


# ---------------------------------------------------------------- memory


def _memory_copy(ctx: _Context, r: ProbeResult) -> None:
    torch = ctx.torch
    nbytes = min(COPY_BYTES, int(_free_gib(ctx) * (1 << 30) / 4)) // 4 * 4
    r.shape = {"bytes": nbytes, "counted": "read + written"}
    src = torch.randn(nbytes // 4, device=DEVICE)
    dst = torch.empty_like(src)
    dst.copy_(src)
    if ctx.perturb:  # the control run: one wrong element must fail an exact copy
        dst[0] += 1.0
        r.extra["perturbed"] = "one element of the copy changed before the check"
    exact = bool(torch.equal(dst, src))  # a copy is exact; no float temporaries the size of the buffer
    r.checked, r.matched_ratio = True, 1.0 if exact else float((dst == src).float().mean().item())
    r.max_error = r.max_rel_error = 0.0 if exact else float((dst - src).abs().max().item())
    r.status = ProbeStatus.PASSED if exact else ProbeStatus.INCORRECT_NUMERICAL
    _measure(ctx, r, lambda: dst.copy_(src), nbytes=2.0 * nbytes, metric="memory")


# ---------------------------------------------------------------- attention


def _attention_reference(torch: Any, q: Any, k: Any, v: Any, *, causal: bool) -> Any:
    """softmax(q k^T / sqrt(d)) v in float32; q, k, v as [heads, seq, dim]."""
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        rows, cols = scores.shape[-2], scores.shape[-1]
        mask = torch.ones(rows, cols, dtype=torch.bool, device=q.device).tril(cols - rows)
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v.float()


def _sdpa(backend: str) -> ProbeFn:
    def probe(ctx: _Context, r: ProbeResult) -> None:
        torch = ctx.torch
        attention = importlib.import_module("torch.nn.attention")
        kernel = getattr(attention.SDPBackend, backend)
        b, h, s, d = SDPA_SHAPE
        r.shape = {"batch": b, "heads": h, "seq": s, "head_dim": d, "causal": True, "dtype": "bfloat16"}
        q, k, v = (torch.randn(b, h, s, d, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))

        def run() -> Any:
            with attention.sdpa_kernel([kernel]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

        out = run()
        _check_ctx(ctx, r, out[0, :2], _attention_reference(torch, q[0, :2], k[0, :2], v[0, :2], causal=True))
        del out
        _measure(ctx, r, run, flops=4.0 * b * h * s * s * d / 2, metric="bf16")

    return probe


# ---------------------------------------------------------------- Triton JIT

_TRITON_SOURCE = """
import triton
import triton.language as tl


@triton.jit
def probe_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                 stride_cn, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SALT: tl.constexpr):
    # SALT only changes the specialisation key, so that every probe run really compiles.
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    a_tile = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak
    b_tile = b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K, BK):
        acc += tl.dot(tl.load(a_tile), tl.load(b_tile))
        a_tile += BK * stride_ak
        b_tile += BK * stride_bk
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn, acc.to(tl.bfloat16))
"""


@contextlib.contextmanager
def _module_from_source(source: str) -> Iterator[Any]:
    """Import `source` from a real file (Triton reads a kernel's source through inspect)."""
    name = f"_dispatchlab_probe_{uuid.uuid4().hex}"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{name}.py"
        path.write_text(source, encoding="utf-8")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
            yield module
        finally:
            sys.modules.pop(name, None)


def _triton_matmul(ctx: _Context, r: ProbeResult) -> None:
    torch, n, bm, bn, bk = ctx.torch, TRITON_N, 128, 128, 64
    triton = importlib.import_module("triton")
    r.extra["triton"] = getattr(triton, "__version__", None)
    r.shape = {"m": n, "n": n, "k": n, "dtype": "bfloat16", "tile": [bm, bn, bk]}
    a = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=DEVICE, dtype=torch.bfloat16)
    with _module_from_source(_TRITON_SOURCE) as module:
        salt = int.from_bytes(os.urandom(4), "little")

        def run() -> Any:
            return module.probe_matmul[(n // bm, n // bn)](
                a, b, c, n, n, n, *a.stride(), *b.stride(), *c.stride(),
                BM=bm, BN=bn, BK=bk, SALT=salt, num_warps=8, num_stages=3,
            )  # fmt: skip

        start = time.perf_counter()
        compiled = run()
        torch.cuda.synchronize()
        r.extra["compile_s"] = round(time.perf_counter() - start, 3)
        r.extra.update(_triton_target(triton, compiled))
        _check_ctx(ctx, r, c[:CHECK_ROWS], a[:CHECK_ROWS].float() @ b.float())
        _measure(ctx, r, run, flops=2.0 * n**3, metric="bf16")


def _triton_target(triton: Any, compiled: Any) -> dict[str, Any]:
    """What Triton compiled for: the PTX `.target` (sm_90a) and its GPUTarget."""
    found: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        found["target"] = str(triton.runtime.driver.active.get_current_target())
    with contextlib.suppress(Exception):
        target = re.search(r"^\s*\.target\s+(\w+)", compiled.asm["ptx"], re.M)
        found["compiled_for"] = target.group(1) if target else None
    with contextlib.suppress(Exception):
        found["target"] = str(compiled.metadata.target)
    return found


# ---------------------------------------------------------------- MoE


@dataclass
class _MoeInputs:
    x: Any  # [tokens, hidden] bf16
    w31: Any  # [experts, 2 * inter, hidden] bf16: rows [up (w3); gate (w1)], FlashInfer CUTLASS's order
    w2: Any  # [experts, hidden, inter] bf16
    ids: Any  # [tokens, top_k] int32
    weights: Any  # [tokens, top_k] float32, summing to 1 per token


def _moe_bytes(s: ModelShapes) -> float:
    weights = s.num_experts * 3 * s.moe_intermediate_size * s.hidden_size * 2
    rows = s.tokens * s.top_k
    activations = rows * (2 * s.hidden_size + 3 * s.moe_intermediate_size) * 2 * 2
    return weights + activations + 2 * s.moe_intermediate_size * s.hidden_size * 4


def _moe_shape(ctx: _Context, r: ProbeResult) -> None:
    s = ctx.shapes
    r.shape = {
        "tokens": s.tokens,
        "hidden_size": s.hidden_size,
        "moe_intermediate_size": s.moe_intermediate_size,
        "num_experts": s.num_experts,
        "top_k": s.top_k,
        "dtype": "bfloat16",
    }
    _require_memory(ctx, _moe_bytes(s), "this MoE shape")


def _moe_inputs(ctx: _Context, r: ProbeResult) -> _MoeInputs:
    torch, s = ctx.torch, ctx.shapes
    _moe_shape(ctx, r)
    e, h, i = s.num_experts, s.hidden_size, s.moe_intermediate_size
    w31 = torch.randn(e, 2 * i, h, device=DEVICE, dtype=torch.bfloat16).mul_(h**-0.5)
    w2 = torch.randn(e, h, i, device=DEVICE, dtype=torch.bfloat16).mul_(i**-0.5)
    x = torch.randn(s.tokens, h, device=DEVICE, dtype=torch.bfloat16)
    probs = torch.randn(s.tokens, e, device=DEVICE).softmax(dim=-1)
    weights, ids = probs.topk(s.top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return _MoeInputs(x, w31, w2, ids.to(torch.int32), weights.float())


def _moe_reference(torch: Any, m: _MoeInputs, tokens: int) -> Any:
    """The first `tokens` outputs in float32, one expert at a time: sum_j w_j * W2 (silu(gate) * up)."""
    inter = m.w2.shape[2]
    out = torch.zeros(tokens, m.x.shape[1], device=DEVICE)
    pairs: dict[int, list[tuple[int, int]]] = {}
    for t, row in enumerate(m.ids[:tokens].tolist()):
        for j, expert in enumerate(row):
            pairs.setdefault(expert, []).append((t, j))
    for expert, chosen in pairs.items():
        toks = torch.tensor([t for t, _ in chosen], device=DEVICE)
        slots = torch.tensor([j for _, j in chosen], device=DEVICE)
        up_gate = m.x[toks].float() @ m.w31[expert].float().t()
        act = torch.nn.functional.silu(up_gate[:, inter:]) * up_gate[:, :inter]
        y = act @ m.w2[expert].float().t()
        out.index_add_(0, toks, y * m.weights[toks, slots][:, None])
    return out


def _moe_flops(s: ModelShapes) -> float:
    return 6.0 * s.tokens * s.top_k * s.hidden_size * s.moe_intermediate_size


def _moe_grouped_mm(ctx: _Context, r: ProbeResult) -> None:
    torch, s = ctx.torch, ctx.shapes
    m = _moe_inputs(ctx, r)
    inter, k = s.moe_intermediate_size, s.top_k
    w31_t, w2_t = m.w31.transpose(1, 2), m.w2.transpose(1, 2)  # [E, K, N] views, column-major per expert
    grouped: Any = getattr(torch, "_grouped_mm", None)

    def route() -> tuple[Any, Any, Any, Any]:
        flat = m.ids.reshape(-1)
        order = flat.argsort(stable=True)
        rows_token = order // k
        offsets = torch.bincount(flat, minlength=s.num_experts).cumsum(0).to(torch.int32)
        return order, rows_token, offsets, m.weights.reshape(-1)[order]

    def combine(y: Any, rows_token: Any, row_weights: Any) -> Any:
        out = torch.zeros(s.tokens, s.hidden_size, device=DEVICE)
        out.index_add_(0, rows_token, (y.float() * row_weights[:, None]))
        return out.to(torch.bfloat16)

    def run_grouped() -> Any:
        _, rows_token, offsets, row_weights = route()
        xs = m.x[rows_token]
        up_gate = grouped(xs, w31_t, offs=offsets, out_dtype=torch.bfloat16)
        act = torch.nn.functional.silu(up_gate[:, inter:]) * up_gate[:, :inter]
        y = grouped(act, w2_t, offs=offsets, out_dtype=torch.bfloat16)
        return combine(y, rows_token, row_weights)

    def run_loop() -> Any:
        _, rows_token, offsets, row_weights = route()
        xs = m.x[rows_token]
        y = torch.empty(xs.shape[0], s.hidden_size, device=DEVICE, dtype=torch.bfloat16)
        start = 0
        for expert, end in enumerate(offsets.tolist()):
            if end > start:
                up_gate = xs[start:end] @ w31_t[expert]
                act = torch.nn.functional.silu(up_gate[:, inter:]) * up_gate[:, :inter]
                y[start:end] = act @ w2_t[expert]
            start = end
        return combine(y, rows_token, row_weights)

    run, out = run_loop, None
    if grouped is not None:
        try:
            run, out = run_grouped, run_grouped()
        except Exception as error:
            r.extra["grouped_mm_error"] = _error_line(error)
    if out is None:
        r.backend = "torch (per-expert loop)"
        run, out = run_loop, run_loop()
    _check_ctx(ctx, r, out[:MOE_CHECK_TOKENS], _moe_reference(torch, m, MOE_CHECK_TOKENS), required=0.95)
    _measure(ctx, r, run, flops=_moe_flops(s), metric="bf16")
    r.extra["weights_gbps"] = round(3 * s.num_experts * s.hidden_size * inter * 2 / (r.ms or 1.0) / 1e6, 1)


# ---------------------------------------------------------------- FlashInfer


def _flashinfer(ctx: _Context, name: str = "flashinfer") -> Any:
    """Import flashinfer (or one of its modules) once per run, timing the first import."""
    if name not in ctx.modules:
        start = time.perf_counter()
        ctx.modules[name] = importlib.import_module(name)
        ctx.modules[f"{name}:import_s"] = round(time.perf_counter() - start, 3)
    return ctx.modules[name]


def _first_call(ctx: _Context, r: ProbeResult, fn: Callable[[], Any]) -> Any:
    """The first call, which JIT-builds and loads the module; its time goes to extra.first_call_s."""
    start = time.perf_counter()
    out = fn()
    ctx.torch.cuda.synchronize()
    r.extra["first_call_s"] = round(time.perf_counter() - start, 3)
    return out


def _flashinfer_decode(ctx: _Context, r: ProbeResult) -> None:
    torch, s = ctx.torch, ctx.shapes
    fi = _flashinfer(ctx)
    r.extra["import_s"] = ctx.modules.get("flashinfer:import_s")
    hq, hkv, d, length = s.num_attention_heads, s.num_key_value_heads, s.head_dim, DECODE_KV_LEN
    r.shape = {"qo_heads": hq, "kv_heads": hkv, "head_dim": d, "kv_len": length, "dtype": "bfloat16"}
    q = torch.randn(hq, d, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(length, hkv, d, device=DEVICE, dtype=torch.bfloat16)
    v = torch.randn(length, hkv, d, device=DEVICE, dtype=torch.bfloat16)

    def run() -> Any:
        return fi.single_decode_with_kv_cache(q, k, v)

    out = _first_call(ctx, r, run)
    group = hq // hkv
    qg = q.float().view(hkv, group, d)
    probs = (torch.einsum("hgd,lhd->hgl", qg, k.float()) / math.sqrt(d)).softmax(dim=-1)
    ref = torch.einsum("hgl,lhd->hgd", probs, v.float()).reshape(hq, d)
    _check_ctx(ctx, r, out, ref)
    _measure(ctx, r, run, nbytes=float(k.numel() + v.numel() + 2 * q.numel()) * 2, metric="memory")


def _flashinfer_prefill(ctx: _Context, r: ProbeResult) -> None:
    torch, s = ctx.torch, ctx.shapes
    fi = _flashinfer(ctx)
    r.extra["import_s"] = ctx.modules.get("flashinfer:import_s")
    hq, hkv, d, n = s.num_attention_heads, s.num_key_value_heads, s.head_dim, PREFILL_LEN
    r.shape = {"qo_heads": hq, "kv_heads": hkv, "head_dim": d, "seq": n, "causal": True, "dtype": "bfloat16"}
    q = torch.randn(n, hq, d, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(n, hkv, d, device=DEVICE, dtype=torch.bfloat16)
    v = torch.randn(n, hkv, d, device=DEVICE, dtype=torch.bfloat16)

    def run() -> Any:
        return fi.single_prefill_with_kv_cache(q, k, v, causal=True)

    out = _first_call(ctx, r, run)
    heads = min(2, hq // hkv)  # query heads that share kv head 0
    ref = _attention_reference(
        torch, q[:, :heads].transpose(0, 1), k[:, :1].transpose(0, 1), v[:, :1].transpose(0, 1), causal=True
    )
    _check_ctx(ctx, r, out[:, :heads].transpose(0, 1), ref)
    _measure(ctx, r, run, flops=4.0 * n * n * hq * d / 2, metric="bf16")


_CUTLASS_MOE_BUILD = """
import torch
from flashinfer.fused_moe import core
major, minor = torch.cuda.get_device_capability()
core.get_cutlass_fused_moe_module(str(major * 10 + minor))
"""


def _ninja_progress(jit_dir: Path, pattern: str) -> str:
    builds = sorted(
        (p for p in jit_dir.glob("*/build.ninja") if re.fullmatch(pattern, p.parent.name)),
        key=lambda p: p.stat().st_mtime,
    )
    if not builds:
        return "no build started"
    objects = re.findall(r"^build (\S+\.o): ", builds[-1].read_text(encoding="utf-8"), re.M)
    done = sum(Path(o).exists() for o in objects)
    return f"{done} of {len(objects)} objects of {builds[-1].parent.name} built"


def _build_in_child(ctx: _Context, r: ProbeResult, code: str, what: str, pattern: str) -> None:
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
        jit_dir = Path(_flashinfer(ctx, "flashinfer.jit.env").FLASHINFER_JIT_DIR)
        progress = _ninja_progress(jit_dir, pattern)
        r.extra["jit_progress"] = progress
        raise _Stop(
            ProbeStatus.TIMEOUT,
            f"JIT build of {what} not finished after {ctx.jit_timeout_s:g} s ({progress}); the next run resumes it",
        ) from None
    r.extra["build_s"] = round(time.perf_counter() - start, 3)
    # On failure the call below raises the same error in this process, where it is classified.


def _flashinfer_cutlass_moe(ctx: _Context, r: ProbeResult) -> None:
    torch, s = ctx.torch, ctx.shapes
    _flashinfer(ctx)
    fused_moe = _flashinfer(ctx, "flashinfer.fused_moe")
    r.extra["import_s"] = ctx.modules.get("flashinfer:import_s")
    _moe_shape(ctx, r)  # and enough memory, before a build of minutes
    _build_in_child(ctx, r, _CUTLASS_MOE_BUILD, "FlashInfer's CUTLASS fused MoE", r"fused_moe_\d+")
    m = _moe_inputs(ctx, r)
    out = torch.empty(s.tokens, s.hidden_size, device=DEVICE, dtype=torch.bfloat16)

    def run() -> Any:
        return fused_moe.cutlass_fused_moe(
            input=m.x,
            token_selected_experts=m.ids,
            token_final_scales=m.weights,
            fc1_expert_weights=m.w31,
            fc2_expert_weights=m.w2,
            output_dtype=torch.bfloat16,
            quant_scales=None,
            output=out,
        )

    _first_call(ctx, r, run)
    _check_ctx(ctx, r, out[:MOE_CHECK_TOKENS], _moe_reference(torch, m, MOE_CHECK_TOKENS), required=0.95)
    _measure(ctx, r, run, flops=_moe_flops(s), metric="bf16")


def _flashinfer_trtllm_moe_fp4(ctx: _Context, r: ProbeResult) -> None:
    """trtllm-gen's MXFP4-weight MoE (bf16 activations), the path SGLang's flashinfer_trtllm /
    flashinfer_mxfp4 runners take; FlashInfer ships its kernels for SM100/SM103 only, so elsewhere the
    interesting output is the exact refusal. Weights are random codes, so numerics are not checked."""
    torch, s = ctx.torch, ctx.shapes
    _flashinfer(ctx)
    fused_moe = _flashinfer(ctx, "flashinfer.fused_moe")
    r.extra["import_s"] = ctx.modules.get("flashinfer:import_s")
    e, h, i, t, k = s.num_experts, s.hidden_size, s.moe_intermediate_size, s.tokens, s.top_k
    r.shape = {
        "tokens": t,
        "hidden_size": h,
        "moe_intermediate_size": i,
        "num_experts": e,
        "top_k": k,
        "weights": "mxfp4 (e8m0 scales per 32)",
        "activations": "bfloat16",
        "routing": "renormalize",
    }
    _require_memory(ctx, e * 3 * i * h * 0.55 + t * (h + e) * 4, "this MoE shape")
    hidden = torch.randn(t, h, device=DEVICE, dtype=torch.bfloat16).mul_(0.1)
    logits = torch.randn(t, e, device=DEVICE, dtype=torch.bfloat16)
    w13 = torch.randint(0, 256, (e, 2 * i, h // 2), device=DEVICE, dtype=torch.uint8)
    w2 = torch.randint(0, 256, (e, h, i // 2), device=DEVICE, dtype=torch.uint8)
    # E8M0 scale bytes (127 = 2^0), carried in float8_e4m3fn tensors as FlashInfer's own tests do.
    w13_scale = torch.full((e, 2 * i, h // 32), 127, device=DEVICE, dtype=torch.uint8).view(
        torch.float8_e4m3fn
    )
    w2_scale = torch.full((e, h, i // 32), 127, device=DEVICE, dtype=torch.uint8).view(torch.float8_e4m3fn)
    ones = torch.ones(e, device=DEVICE)

    def run() -> Any:
        return fused_moe.trtllm_fp4_block_scale_moe(
            routing_logits=logits,
            routing_bias=None,
            hidden_states=hidden,
            hidden_states_scale=None,  # bf16 activations
            gemm1_weights=w13,
            gemm1_weights_scale=w13_scale,
            gemm1_bias=None,
            gemm1_alpha=None,
            gemm1_beta=None,
            gemm1_clamp_limit=None,
            gemm2_weights=w2,
            gemm2_weights_scale=w2_scale,
            gemm2_bias=None,
            output1_scale_scalar=ones,
            output1_scale_gate_scalar=ones,
            output2_scale_scalar=ones,
            num_experts=e,
            top_k=k,
            n_group=None,
            topk_group=None,
            intermediate_size=i,
            local_expert_offset=0,
            local_num_experts=e,
            routed_scaling_factor=None,
            routing_method_type=1,  # Renormalize: top-k, then softmax over the chosen
            do_finalize=True,
        )

    out = _first_call(ctx, r, run)
    result = out[0] if isinstance(out, list | tuple) else out
    # Random FP4 codes have no reference here: the kernel ran, nothing says its numbers are right.
    r.status = ProbeStatus.UNCHECKED
    r.error = "ran; output not compared with a reference (random MXFP4 codes), only checked finite"
    r.extra["finite"] = bool(result.float().isfinite().all().item())
    _measure(ctx, r, run, flops=_moe_flops(s), metric="fp4")


# ---------------------------------------------------------------- the registry

_SM100 = frozenset({(10, 0), (10, 3)})

PROBES: dict[str, Probe] = {
    p.name: p
    for p in [
        Probe("gemm_bf16", "cublas", Component.GEMM, "bf16 matmul 8192^3 (torch.mm)", _gemm_bf16),
        Probe(
            "gemm_fp8",
            "cublaslt",
            Component.GEMM,
            "FP8 e4m3 torch._scaled_mm 8192^3, per-tensor scales",
            _gemm_fp8(fast_accum=False),
            min_capability=(8, 9),
        ),
        Probe(
            "gemm_fp8_fast_accum",
            "cublaslt",
            Component.GEMM,
            "the same with use_fast_accum=True, as serving stacks pass on Hopper (on an H200 its coarser "
            "accumulation misses atol=rtol=1e-2 on ~2% of outputs at k=8192)",
            _gemm_fp8(fast_accum=True),
            min_capability=(8, 9),
        ),
        Probe(
            "gemm_mxfp4",
            "torch.nn.functional.scaled_mm",
            Component.GEMM,
            "MXFP4 block-scaled matmul 8192^3 (E2M1 data, E8M0 scales per 32)",
            _gemm_fp4("mxfp4"),
            min_capability=(10, 0),
        ),
        Probe(
            "gemm_nvfp4",
            "torch.nn.functional.scaled_mm",
            Component.GEMM,
            "NVFP4 block-scaled matmul 8192^3 (E2M1 data, E4M3 scales per 16)",
            _gemm_fp4("nvfp4"),
            min_capability=(10, 0),
        ),
        Probe("memory_copy", "torch", Component.MEMORY, "device-to-device copy of 2 GiB", _memory_copy),
        *(
            Probe(
                f"sdpa_{short}",
                short,
                Component.ATTENTION,
                f"torch SDPA {backend} backend, causal, 8x32x4096x128 bf16",
                _sdpa(backend),
            )
            for short, backend in [
                ("cudnn", "CUDNN_ATTENTION"),
                ("flash", "FLASH_ATTENTION"),
                ("efficient", "EFFICIENT_ATTENTION"),
                ("math", "MATH"),
            ]
        ),
        Probe(
            "triton_matmul",
            "triton",
            Component.JIT,
            "a Triton bf16 matmul compiled for this GPU (compile time, target)",
            _triton_matmul,
            needs="triton",
        ),
        Probe(
            "moe_grouped_mm",
            "torch._grouped_mm",
            Component.MOE,
            "bf16 MoE layer (route, gate/up, SiLU, down, combine) at the model's shapes",
            _moe_grouped_mm,
        ),
        Probe(
            "flashinfer_decode",
            "flashinfer",
            Component.ATTENTION,
            "FlashInfer single_decode_with_kv_cache, GQA, 64K tokens of KV",
            _flashinfer_decode,
            needs="flashinfer",
        ),
        Probe(
            "flashinfer_prefill",
            "flashinfer",
            Component.ATTENTION,
            "FlashInfer single_prefill_with_kv_cache, causal, 8192 tokens (backend auto)",
            _flashinfer_prefill,
            needs="flashinfer",
        ),
        Probe(
            "flashinfer_cutlass_moe",
            "flashinfer_cutlass",
            Component.MOE,
            "FlashInfer cutlass_fused_moe, bf16, at the model's shapes",
            _flashinfer_cutlass_moe,
            needs="flashinfer",
        ),
        Probe(
            "flashinfer_trtllm_moe_fp4",
            "flashinfer_trtllm",
            Component.MOE,
            "FlashInfer trtllm-gen trtllm_fp4_block_scale_moe (MXFP4 weights, bf16 activations)",
            _flashinfer_trtllm_moe_fp4,
            needs="flashinfer",
            capabilities=_SM100,
            downloads=True,
        ),
    ]
}


def probe_names() -> list[str]:
    return list(PROBES)


def probes_for_component(component: str) -> list[str]:
    wanted = _component(component)
    return [name for name, probe in PROBES.items() if probe.component == wanted]


def probe_catalog() -> list[dict[str, str]]:
    return [
        {"name": p.name, "backend": p.backend, "component": str(p.component), "description": p.description}
        for p in PROBES.values()
    ]


def _component(component: str) -> Component:
    try:
        return Component(component)
    except ValueError:
        raise ValueError(
            f"unknown component {component!r}: one of {', '.join(c.value for c in Component)}"
        ) from None


def model_shapes_from_env() -> dict[str, Any] | None:
    """The model shapes a launcher passes in DISPATCHLAB_PROBE_MODEL_SHAPES (a JSON object)."""
    raw = os.environ.get(MODEL_SHAPES_ENV)
    if not raw:
        return None
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"{MODEL_SHAPES_ENV} must hold a JSON object")
    return data


def run_probes(
    names: Iterable[str] | None = None,
    *,
    model_shapes: Mapping[str, Any] | None = None,
    component: str | None = None,
    jit_timeout_s: float = DEFAULT_JIT_TIMEOUT_S,
    artifacts: ArtifactStatus | None = None,
    perturb: bool = False,
) -> list[ProbeResult]:
    """Run the named probes (all when None), optionally only those of one component, in registry order.
    Unknown names, components or shapes raise ValueError before anything runs; the probes never raise.
    `artifacts` is the host's FlashInfer artifact status when already known (else looked up when a probe
    needs it); `perturb` makes this a control run (see the module's docstring)."""
    selected = _select(names, component)
    shapes = ModelShapes.from_mapping(model_shapes)
    if not selected:
        return []
    ctx = _context(shapes, jit_timeout_s)
    ctx.artifacts, ctx.perturb = artifacts, perturb
    results: list[ProbeResult] = []
    for index, name in enumerate(selected):
        result = _run_one(PROBES[name], ctx)
        results.append(result)
        broken = _context_broken(ctx)
        if broken and index + 1 < len(selected):
            results += _run_rest_in_child(
                selected[index + 1 :], shapes, jit_timeout_s, name, broken, perturb=perturb
            )
            break
    return results


def _select(names: Iterable[str] | None, component: str | None) -> list[str]:
    chosen = list(PROBES) if names is None else list(dict.fromkeys(names))
    unknown = [n for n in chosen if n not in PROBES]
    if unknown:
        raise ValueError(f"unknown probe {', '.join(unknown)}: one of {', '.join(PROBES)}")
    if component is not None:
        wanted = _component(component)
        chosen = [n for n in chosen if PROBES[n].component == wanted]
    order = list(PROBES)
    return sorted(chosen, key=order.index)


def _context(shapes: ModelShapes, jit_timeout_s: float) -> _Context:
    ctx = _Context(shapes=shapes, jit_timeout_s=jit_timeout_s)
    try:
        torch: Any = importlib.import_module("torch")
    except ImportError:
        ctx.unavailable = (ProbeStatus.NOT_INSTALLED, "torch is not installed")
        return ctx
    except Exception as error:
        ctx.unavailable = (ProbeStatus.RUNTIME_ERROR, f"import torch failed: {_error_line(error)}")
        return ctx
    if getattr(torch.version, "hip", None):
        ctx.unavailable = (ProbeStatus.SKIPPED, "ROCm GPUs are not probed yet")
        return ctx
    try:
        available = torch.cuda.is_available()
    except Exception as error:
        available, why = False, _error_line(error)
    else:
        why = f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA GPU"
    if not available:
        ctx.unavailable = (ProbeStatus.SKIPPED, f"no GPU: {why}")
        return ctx
    major, minor = torch.cuda.get_device_capability()
    ctx.torch, ctx.gpu, ctx.capability = torch, torch.cuda.get_device_name(), (int(major), int(minor))
    ctx.arch = f"sm_{major}{minor}"
    return ctx


def _run_one(probe: Probe, ctx: _Context) -> ProbeResult:
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
    except _Stop as stop:
        r.status, r.error = stop.status, str(stop)
    except Exception as error:
        _record_failure(probe, ctx, r, error, caught)
    finally:
        _release(ctx)
    return r


def _record_failure(
    probe: Probe, ctx: _Context, r: ProbeResult, error: BaseException, caught: list[warnings.WarningMessage]
) -> None:
    r.error = _error_line(error)
    notes = list(dict.fromkeys(str(w.message).strip() for w in caught))[:5]
    r.error_detail = "\n".join([f"{_error_type(error)}: {error}"[:4000], *notes])
    r.status = _classify(r.error_detail, below_arch=_outside_arch(probe, ctx))
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


def _classify(text: str, *, below_arch: bool) -> ProbeStatus:
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


def _outside_arch(probe: Probe, ctx: _Context) -> bool:
    if probe.min_capability is not None and ctx.capability < probe.min_capability:
        return True
    return probe.capabilities is not None and ctx.capability not in probe.capabilities


def _error_type(error: BaseException) -> str:
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _error_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{_error_type(error)}: {lines[0] if lines else ''}".rstrip(": ")[:500]


def _release(ctx: _Context) -> None:
    gc.collect()
    if ctx.torch is not None:
        with contextlib.suppress(Exception):
            ctx.torch.cuda.empty_cache()


def _context_broken(ctx: _Context) -> str | None:
    """The error a trivial CUDA call raises once a kernel has broken the context, else None."""
    if ctx.torch is None:
        return None
    try:
        ctx.torch.cuda.synchronize()
        ctx.torch.ones(1, device=DEVICE).add_(1).item()
    except Exception as error:
        return _error_line(error)
    return None


def _run_rest_in_child(
    names: list[str], shapes: ModelShapes, jit_timeout_s: float, culprit: str, broken: str, *, perturb: bool
) -> list[ProbeResult]:
    argv = [sys.executable, "-m", "worker", "probe", "--json", "--jit-timeout", str(jit_timeout_s), *names]
    if perturb:
        argv.append("--perturb")
    env = dict(os.environ, **{MODEL_SHAPES_ENV: json.dumps(asdict(shapes))})
    try:
        done = subprocess.run(
            argv,
            cwd=Path(__file__).resolve().parents[1],
            env=env,
            capture_output=True,
            text=True,
            timeout=max(600.0, jit_timeout_s + 600.0),
            check=False,
        )
        data = json.loads(done.stdout)
        return [ProbeResult.from_dict(p) for p in data["probes"]]
    except (subprocess.TimeoutExpired, ValueError, KeyError, TypeError, OSError) as error:
        why = f"the CUDA context broke after {culprit} ({broken}) and a fresh process failed: {_error_line(error)}"
        return [
            ProbeResult(n, PROBES[n].backend, str(PROBES[n].component), ProbeStatus.RUNTIME_ERROR, error=why)
            for n in names
        ]


def _json_safe(value: Any) -> Any:
    """NaN and infinities are not JSON: report them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


# ---------------------------------------------------------------- for people


def table_lines(results: list[ProbeResult]) -> list[str]:
    """A short table: name, backend, status, ms, TFLOP/s or GB/s, % of peak, then the error if any."""
    rows = [["probe", "backend", "status", "ms", "rate", "% peak", "error"]]
    for r in results:
        if r.tflops is not None:
            rate = f"{r.tflops:g} TFLOP/s"
        else:
            rate = "-" if r.gbps is None else f"{r.gbps:g} GB/s"
        peak = "-" if r.peak_fraction is None else f"{r.peak_fraction * 100:.0f}%"
        ms = "-" if r.ms is None else f"{r.ms:.3f}"
        rows.append([r.name, r.backend, str(r.status), ms, rate, peak, (r.error or "")[:120]])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return lines
