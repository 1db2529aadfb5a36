"""The backend sweep: every candidate backend installed on this host for the component a crash names,
run at the model's shapes read from the log, each checked against a float32 torch reference on its whole
output and timed, ranked; the fastest correct one that the server can be told to use is the proposed fix.

    python -m worker sweep REPORT_OR_LOG --component moe|attention|gemm|sampling [--out F] [--json]

Checking reuses worker.probes' rule (atol = rtol = 1e-2, an element fails only past both; 100% of the
output must match, 95% for MoE). Timing: CUDA events after warm-ups, the median of REPEATS calls; on a
host without a GPU, time.perf_counter around each call (CPU figures say nothing about a GPU). Rates go
against the datasheet peak (worker.peaks) and, where one was measured, the achievable anchor of that GPU
(ACHIEVABLE: H200 bf16 GEMM ~790 TFLOP/s, FP8 ~1440, copy ~4300 GB/s, bench/gpu_probes.py). A candidate
that refuses (import error, arch refusal, missing cubins on an offline host) is recorded with the library's
own message; FlashInfer JIT builds with their state (cached, built in N s, building: timed out) in a
persistent cache (DISPATCHLAB_JIT_CACHE, default ~/.cache/dispatchlab/jit). torch, triton and flashinfer
are imported lazily.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import re
import socket
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from dispatchlab.core.flags import release_for
from dispatchlab.core.shapes import ModelShapesRead, read_shapes_file, read_shapes_from_document
from worker import probes
from worker.inventory import flashinfer_artifacts
from worker.peaks import peak_for, peaks_for
from worker.probes import ATOL, RTOL, ProbeResult, ProbeStatus

REPEATS = 20
WARMUP = 3
DEFAULT_TOKENS = 4096  # MoE tokens per call, attention sequence length on GPU
CPU_TOKENS = 64  # on CPU: the torch candidates only show they run and are right
DEFAULT_JIT_TIMEOUT_S = 120.0
JIT_CACHE_ENV = "DISPATCHLAB_JIT_CACHE"

# Achievable figures measured on the device machine (bench/gpu_probes.py ANCHORS), by peaks.Peak.model.
ACHIEVABLE: dict[str, dict[str, float]] = {
    "H200 SXM": {"bf16": 790.0, "fp8": 1440.0, "memory": 4300.0},
}


class SweepComponent(StrEnum):
    MOE = "moe"
    ATTENTION = "attention"
    GEMM = "gemm"
    SAMPLING = "sampling"


# The server flag each component's winner is proposed for (SGLang spelling; the catalog checks the value).
FLAG_FOR = {
    SweepComponent.MOE: "--moe-runner-backend",
    SweepComponent.ATTENTION: "--attention-backend",
    SweepComponent.GEMM: "--fp8-gemm-backend",
    SweepComponent.SAMPLING: "--sampling-backend",
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
class _Run:
    torch: Any
    device: str
    gpu: str | None
    arch: str | None
    capability: tuple[int, int]
    shapes: dict[str, int]
    dtype: Any
    jit_timeout_s: float


Candidate = Callable[[_Run, SweepEntry], None]


# ---------------------------------------------------------------- timing


def _sync(run: _Run) -> None:
    if run.device == "cuda":
        run.torch.cuda.synchronize()


def _time_ms(run: _Run, fn: Callable[[], Any], repeats: int = REPEATS) -> float:
    for _ in range(WARMUP):
        fn()
    _sync(run)
    if run.device == "cuda":
        return probes._timed(run.torch, fn, repeats)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return float(statistics.median(times))


def _rate(
    run: _Run, e: SweepEntry, ms: float, *, flops: float = 0.0, nbytes: float = 0.0, metric: str
) -> None:
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


def _check(e: SweepEntry, out: Any, ref: Any) -> None:
    probes._check(e.result, out, ref, required=e.required)
    e.result.extra["checked_elements"] = int(ref.numel())


# ---------------------------------------------------------------- MoE


@dataclass
class _Moe:
    x: Any
    w13: Any  # [E, 2I, H]: rows [gate; up] (SGLang's w13 order)
    w2: Any  # [E, H, I]
    ids: Any  # [T, k] int64
    weights: Any  # [T, k] float32


def _moe_inputs(run: _Run) -> _Moe:
    torch, s = run.torch, run.shapes
    gen = torch.Generator(device=run.device).manual_seed(0)
    e, h, i, t, k = s["num_experts"], s["hidden_size"], s["moe_intermediate_size"], s["tokens"], s["top_k"]
    dt, dev = run.dtype, run.device
    w13 = (torch.randn(e, 2 * i, h, generator=gen, device=dev) * h**-0.5).to(dt)
    w2 = (torch.randn(e, h, i, generator=gen, device=dev) * i**-0.5).to(dt)
    x = torch.randn(t, h, generator=gen, device=dev).to(dt)
    probs = torch.randn(t, e, generator=gen, device=dev).softmax(dim=-1)
    weights, ids = probs.topk(k, dim=-1)
    return _Moe(x, w13, w2, ids, (weights / weights.sum(dim=-1, keepdim=True)).float())


def _moe_loop(torch: Any, m: _Moe, *, dtype: Any) -> Any:
    """sum_j w_j * W2 (silu(gate) * up) one expert at a time, in `dtype` (float32: the reference)."""
    inter = m.w2.shape[2]
    out = torch.zeros(m.x.shape[0], m.x.shape[1], device=m.x.device, dtype=torch.float32)
    flat = m.ids.reshape(-1)
    tokens = torch.arange(m.x.shape[0], device=m.x.device).repeat_interleave(m.ids.shape[1])
    row_weights = m.weights.reshape(-1)
    for expert in flat.unique().tolist():
        rows = (flat == expert).nonzero().squeeze(-1)
        toks = tokens[rows]
        h = m.x[toks].to(dtype) @ m.w13[expert].to(dtype).t()
        act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        y = act @ m.w2[expert].to(dtype).t()
        out.index_add_(0, toks, y.float() * row_weights[rows, None])
    return out


def _moe_flops(s: dict[str, int]) -> float:
    return 6.0 * s["tokens"] * s["top_k"] * s["hidden_size"] * s["moe_intermediate_size"]


def _moe_torch(run: _Run, e: SweepEntry, m: _Moe, ref: Any) -> None:
    torch = run.torch

    def call() -> Any:
        return _moe_loop(torch, m, dtype=run.dtype).to(run.dtype)

    _check(e, call(), ref)
    _rate(run, e, _time_ms(run, call), flops=_moe_flops(run.shapes), metric="bf16")


def _moe_triton(run: _Run, e: SweepEntry, m: _Moe, ref: Any) -> None:
    if importlib.util.find_spec("triton") is None:
        raise _Unavailable(ProbeStatus.NOT_INSTALLED, "triton is not installed")
    module = importlib.import_module("worker.repro.triton_moe")
    e.result.extra["triton"] = getattr(importlib.import_module("triton"), "__version__", None)
    # the repro's kernel takes w13 as [up; gate]-agnostic halves: gate first, as here
    start = time.perf_counter()
    out = module.triton_moe(m.x, m.weights, m.ids, m.w13, m.w2)
    _sync(run)
    e.jit = {
        "state": "built",
        "seconds": round(time.perf_counter() - start, 3),
        "cache": os.environ.get("TRITON_CACHE_DIR"),
    }
    _check(e, out, ref)
    _rate(
        run,
        e,
        _time_ms(run, lambda: module.triton_moe(m.x, m.weights, m.ids, m.w13, m.w2)),
        flops=_moe_flops(run.shapes),
        metric="bf16",
    )


def _moe_grouped(run: _Run, e: SweepEntry, m: _Moe, ref: Any) -> None:
    torch = run.torch
    grouped = getattr(torch, "_grouped_mm", None)
    if grouped is None:
        raise _Unavailable(ProbeStatus.NOT_INSTALLED, f"torch {torch.__version__} has no torch._grouped_mm")
    s, inter = run.shapes, run.shapes["moe_intermediate_size"]
    w13_t, w2_t = m.w13.transpose(1, 2), m.w2.transpose(1, 2)

    def call() -> Any:
        flat = m.ids.reshape(-1)
        order = flat.argsort(stable=True)
        rows_token = order // s["top_k"]
        offsets = torch.bincount(flat, minlength=s["num_experts"]).cumsum(0).to(torch.int32)
        h = grouped(m.x[rows_token], w13_t, offs=offsets, out_dtype=run.dtype)
        act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        y = grouped(act, w2_t, offs=offsets, out_dtype=run.dtype)
        out = torch.zeros(s["tokens"], s["hidden_size"], device=run.device)
        out.index_add_(0, rows_token, y.float() * m.weights.reshape(-1)[order][:, None])
        return out.to(run.dtype)

    _check(e, call(), ref)
    _rate(run, e, _time_ms(run, call), flops=_moe_flops(s), metric="bf16")


def _moe_flashinfer_cutlass(run: _Run, e: SweepEntry, m: _Moe, ref: Any) -> None:
    torch, s = run.torch, run.shapes
    _need_flashinfer()
    _need_gpu(run)
    ctx = _probe_context(run)
    fused_moe = probes._flashinfer(ctx, "flashinfer.fused_moe")
    e.jit = _jit_state(
        ctx, e.result, probes._CUTLASS_MOE_BUILD, "FlashInfer's CUTLASS fused MoE", r"fused_moe_\d+"
    )
    inter = s["moe_intermediate_size"]
    w31 = torch.cat((m.w13[:, inter:], m.w13[:, :inter]), dim=1).contiguous()  # CUTLASS wants [up; gate]
    out = torch.empty(s["tokens"], s["hidden_size"], device=run.device, dtype=run.dtype)

    def call() -> Any:
        return fused_moe.cutlass_fused_moe(
            input=m.x,
            token_selected_experts=m.ids.to(torch.int32),
            token_final_scales=m.weights,
            fc1_expert_weights=w31,
            fc2_expert_weights=m.w2,
            output_dtype=run.dtype,
            quant_scales=None,
            output=out,
        )

    call()
    _sync(run)
    _check(e, out, ref)
    _rate(run, e, _time_ms(run, call), flops=_moe_flops(s), metric="bf16")


def _moe_flashinfer_trtllm(run: _Run, e: SweepEntry, m: _Moe, ref: Any) -> None:
    """trtllm-gen's MoE through the probe of the same name (MXFP4 weights: random codes, so the output is
    not compared: the candidate says `unchecked` and is never proposed; what matters is whether it runs
    here or the library's refusal)."""
    _need_flashinfer()
    _need_gpu(run)
    _need_cubins()
    ctx = _probe_context(run)
    probe = probes.PROBES["flashinfer_trtllm_moe_fp4"]
    result = probes._run_one(probe, ctx)
    keep = e.result.name, e.result.backend
    e.result = result
    e.result.name, e.result.backend = keep
    if result.status == ProbeStatus.PASSED and not result.checked:
        e.result.extra["unchecked"] = "random MXFP4 codes: the output is not compared with a reference"
    if result.status not in (ProbeStatus.PASSED, ProbeStatus.INCORRECT_NUMERICAL):
        raise _Recorded()


def _moe_flashinfer_cutedsl(run: _Run, e: SweepEntry, m: _Moe, ref: Any) -> None:
    _need_flashinfer()
    _need_gpu(run)
    module = importlib.import_module("flashinfer")
    names = [n for n in dir(module) if "cute" in n.lower() and "moe" in n.lower()]
    if not names:
        raise _Unavailable(
            ProbeStatus.NOT_INSTALLED,
            f"flashinfer {getattr(module, '__version__', '?')} exports no CuTe-DSL fused MoE",
        )
    raise _Unavailable(
        ProbeStatus.SKIPPED,
        f"found {', '.join(names)}: the sweep does not drive the CuTe-DSL MoE yet (it takes NVFP4 weights)",
    )


MOE_CANDIDATES: list[tuple[str, str, str | None, Callable[[_Run, SweepEntry, _Moe, Any], None]]] = [
    ("torch_loop", "torch (per-expert bmm loop)", None, _moe_torch),
    ("torch_grouped_mm", "torch._grouped_mm", None, _moe_grouped),
    ("triton", "triton (worker.repro.triton_moe)", "triton", _moe_triton),
    ("flashinfer_cutlass", "flashinfer cutlass_fused_moe", "flashinfer_cutlass", _moe_flashinfer_cutlass),
    ("flashinfer_trtllm", "flashinfer trtllm-gen (MXFP4)", "flashinfer_trtllm", _moe_flashinfer_trtllm),
    ("flashinfer_cutedsl", "flashinfer CuTe-DSL", "flashinfer_cutedsl", _moe_flashinfer_cutedsl),
]


# ---------------------------------------------------------------- attention


def _attention_inputs(run: _Run) -> tuple[Any, Any, Any]:
    torch, s = run.torch, run.shapes
    gen = torch.Generator(device=run.device).manual_seed(0)
    hq, hkv, d, n = s["num_attention_heads"], s["num_key_value_heads"], s["head_dim"], s["tokens"]
    q = torch.randn(1, hq, n, d, generator=gen, device=run.device).to(run.dtype)
    k = torch.randn(1, hkv, n, d, generator=gen, device=run.device).to(run.dtype)
    v = torch.randn(1, hkv, n, d, generator=gen, device=run.device).to(run.dtype)
    return q, k, v


def _expand(torch: Any, kv: Any, group: int) -> Any:
    return kv.repeat_interleave(group, dim=1) if group > 1 else kv


def _attention_reference(run: _Run, q: Any, k: Any, v: Any) -> Any:
    """float32 causal attention, one query head at a time (keeps memory at one [n, n] score matrix)."""
    torch = run.torch
    group = q.shape[1] // k.shape[1]
    out = torch.empty(q.shape, device=run.device, dtype=torch.float32)
    for head in range(q.shape[1]):
        out[0, head] = probes._attention_reference(
            torch,
            q[0, head : head + 1],
            k[0, head // group : head // group + 1],
            v[0, head // group : head // group + 1],
            causal=True,
        )[0]
    return out


def _attention_flops(s: dict[str, int]) -> float:
    return 4.0 * s["num_attention_heads"] * s["tokens"] ** 2 * s["head_dim"] / 2


def _sdpa(backend: str) -> Callable[[_Run, SweepEntry, tuple[Any, Any, Any], Any], None]:
    def candidate(run: _Run, e: SweepEntry, qkv: tuple[Any, Any, Any], ref: Any) -> None:
        torch = run.torch
        attention = importlib.import_module("torch.nn.attention")
        kernel = getattr(attention.SDPBackend, backend)
        q, k, v = qkv
        group = q.shape[1] // k.shape[1]
        ke, ve = _expand(torch, k, group), _expand(torch, v, group)

        def call() -> Any:
            with attention.sdpa_kernel([kernel]):
                return torch.nn.functional.scaled_dot_product_attention(q, ke, ve, is_causal=True)

        _check(e, call(), ref)
        _rate(run, e, _time_ms(run, call), flops=_attention_flops(run.shapes), metric="bf16")

    return candidate


def _flashinfer_prefill(run: _Run, e: SweepEntry, qkv: tuple[Any, Any, Any], ref: Any) -> None:
    _need_flashinfer()
    _need_gpu(run)
    ctx = _probe_context(run)
    fi = probes._flashinfer(ctx)
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in qkv)  # NHD

    def call() -> Any:
        return fi.single_prefill_with_kv_cache(q, k, v, causal=True)

    start = time.perf_counter()
    out = call()
    _sync(run)
    e.jit = {"state": "loaded", "seconds": round(time.perf_counter() - start, 3)}
    _check(e, out.transpose(0, 1).unsqueeze(0), ref)
    _rate(run, e, _time_ms(run, call), flops=_attention_flops(run.shapes), metric="bf16")


def _flex_attention(run: _Run, e: SweepEntry, qkv: tuple[Any, Any, Any], ref: Any) -> None:
    """torch's flex_attention compiled: Triton kernels generated for this GPU (SGLang `flex_attention`)."""
    _need_gpu(run)
    torch = run.torch
    flex = importlib.import_module("torch.nn.attention.flex_attention")
    q, k, v = qkv
    n = q.shape[2]
    mask = flex.create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n, device=run.device)
    compiled = torch.compile(flex.flex_attention)

    def call() -> Any:
        return compiled(q, k, v, block_mask=mask, enable_gqa=q.shape[1] != k.shape[1])

    start = time.perf_counter()
    out = call()
    _sync(run)
    e.jit = {
        "state": "built",
        "seconds": round(time.perf_counter() - start, 3),
        "cache": os.environ.get("TRITON_CACHE_DIR"),
    }
    _check(e, out, ref)
    _rate(run, e, _time_ms(run, call), flops=_attention_flops(run.shapes), metric="bf16")


ATTENTION_CANDIDATES: list[tuple[str, str, str | None, Callable[[_Run, SweepEntry, Any, Any], None]]] = [
    ("sdpa_math", "torch SDPA math", "torch_native", _sdpa("MATH")),
    ("sdpa_efficient", "torch SDPA efficient", "torch_native", _sdpa("EFFICIENT_ATTENTION")),
    ("sdpa_flash", "torch SDPA flash", "torch_native", _sdpa("FLASH_ATTENTION")),
    ("sdpa_cudnn", "torch SDPA cuDNN", "torch_native", _sdpa("CUDNN_ATTENTION")),
    ("flashinfer_prefill", "flashinfer single_prefill", "flashinfer", _flashinfer_prefill),
    ("flex_attention", "torch flex_attention (Triton)", "flex_attention", _flex_attention),
]


# ---------------------------------------------------------------- GEMM and sampling


def _gemm_inputs(run: _Run) -> tuple[Any, Any]:
    torch, s = run.torch, run.shapes
    gen = torch.Generator(device=run.device).manual_seed(0)
    a = torch.randn(s["tokens"], s["hidden_size"], generator=gen, device=run.device).to(run.dtype)
    b = (
        torch.randn(s["hidden_size"], s["moe_intermediate_size"], generator=gen, device=run.device)
        * s["hidden_size"] ** -0.5
    ).to(run.dtype)
    return a, b


def _gemm_torch(run: _Run, e: SweepEntry, ab: tuple[Any, Any], ref: Any) -> None:
    a, b = ab
    _check(e, a @ b, ref)
    flops = 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    _rate(run, e, _time_ms(run, lambda: a @ b), flops=flops, metric="bf16")


def _gemm_fp8(run: _Run, e: SweepEntry, ab: tuple[Any, Any], ref: Any) -> None:
    _need_gpu(run)
    torch = run.torch
    a, b = ab
    sa, sb = a.float().abs().max() / 448, b.float().abs().max() / 448
    a8 = (a.float() / sa).to(torch.float8_e4m3fn)
    b8 = (b.float() / sb).to(torch.float8_e4m3fn).t().contiguous().t()

    def call() -> Any:
        return torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=run.dtype)

    e.result.extra["quantized"] = "per-tensor float8_e4m3fn: the tolerance is bf16's, so rounding shows"
    _check(e, call(), ref)
    _rate(run, e, _time_ms(run, call), flops=2.0 * a.shape[0] * a.shape[1] * b.shape[1], metric="fp8")


GEMM_CANDIDATES: list[tuple[str, str, str | None, Callable[[_Run, SweepEntry, Any, Any], None]]] = [
    ("torch_mm", "torch matmul (cuBLAS on GPU)", None, _gemm_torch),
    ("torch_scaled_mm_fp8", "torch._scaled_mm FP8 (cuBLASLt)", None, _gemm_fp8),
]


def _sampling_inputs(run: _Run) -> Any:
    torch = run.torch
    gen = torch.Generator(device=run.device).manual_seed(0)
    vocab = 32768 if run.device == "cuda" else 4096
    return (torch.randn(run.shapes["tokens"], vocab, generator=gen, device=run.device) * 3).softmax(dim=-1)


TOP_K = 50


def _top_k_renorm_ref(torch: Any, probs: Any) -> Any:
    values, idx = probs.float().topk(TOP_K, dim=-1)
    out = torch.zeros_like(probs, dtype=torch.float32)
    return out.scatter_(-1, idx, values / values.sum(dim=-1, keepdim=True))


def _sampling_torch(run: _Run, e: SweepEntry, probs: Any, ref: Any) -> None:
    """SGLang's pytorch path: sort, keep the first TOP_K, renormalise (not the reference's topk/scatter)."""
    torch = run.torch

    def call() -> Any:
        ordered, idx = probs.sort(dim=-1, descending=True)
        keep = torch.arange(probs.shape[-1], device=probs.device) < TOP_K
        kept = ordered * keep
        return torch.zeros_like(probs).scatter_(-1, idx, kept / kept.sum(dim=-1, keepdim=True))

    _check(e, call(), ref)
    _rate(run, e, _time_ms(run, call), nbytes=2.0 * probs.numel() * 4, metric="memory")


def _sampling_flashinfer(run: _Run, e: SweepEntry, probs: Any, ref: Any) -> None:
    _need_flashinfer()
    _need_gpu(run)
    sampling = probes._flashinfer(_probe_context(run), "flashinfer.sampling")

    def call() -> Any:
        return sampling.top_k_renorm_probs(probs, TOP_K)

    _check(e, call(), ref)
    _rate(run, e, _time_ms(run, call), nbytes=2.0 * probs.numel() * 4, metric="memory")


SAMPLING_CANDIDATES: list[tuple[str, str, str | None, Callable[[_Run, SweepEntry, Any, Any], None]]] = [
    ("pytorch", "torch top-k renorm", "pytorch", _sampling_torch),
    ("flashinfer", "flashinfer top_k_renorm_probs", "flashinfer", _sampling_flashinfer),
]


# ---------------------------------------------------------------- running


class _Unavailable(Exception):
    def __init__(self, status: ProbeStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Recorded(Exception):
    """The candidate already recorded its outcome (a probe's result)."""


def _need_gpu(run: _Run) -> None:
    if run.device != "cuda":
        raise _Unavailable(ProbeStatus.SKIPPED, "needs a CUDA GPU; this host has none")


def _need_cubins() -> None:
    """FlashInfer's download-at-first-use kernels, as the inventory finds them."""
    status = flashinfer_artifacts()
    if not status.available:
        raise _Unavailable(
            ProbeStatus.NOT_INSTALLED, f"FlashInfer's cubins are not on this host: {status.reason}"
        )


def _need_flashinfer() -> None:
    if importlib.util.find_spec("flashinfer") is None:
        raise _Unavailable(
            ProbeStatus.NOT_INSTALLED, "flashinfer is not installed (pip install flashinfer-python)"
        )


def _probe_context(run: _Run) -> Any:
    _need_flashinfer()
    ctx = probes._Context(
        torch=run.torch,
        gpu=run.gpu,
        arch=run.arch,
        capability=run.capability,
        shapes=probes.ModelShapes.from_mapping(run.shapes),
        jit_timeout_s=run.jit_timeout_s,
    )
    ctx.modules = _MODULES
    return ctx


_MODULES: dict[str, Any] = {}  # FlashInfer JIT modules built in this process, shared by the sweep's probes


def _jit_state(ctx: Any, r: ProbeResult, code: str, what: str, pattern: str) -> dict[str, Any]:
    """Build (or find cached) a FlashInfer JIT module in a child with the time limit: cached when it
    took under 5 s, built in N s otherwise; a build cut at the limit raises TIMEOUT with its progress."""
    start = time.perf_counter()
    try:
        probes._build_in_child(ctx, r, code, what, pattern)
    except probes._Stop as stop:
        raise _Unavailable(stop.status, f"building: {stop}") from None
    took = round(time.perf_counter() - start, 3)
    return {"state": "cached" if took < 5 else "built", "seconds": took}


def jit_cache_dirs(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Persistent JIT caches (set unless the host set its own): FlashInfer's workspace and Triton's."""
    env = os.environ if environ is None else environ
    base = Path(env.get(JIT_CACHE_ENV) or Path.home() / ".cache" / "dispatchlab" / "jit")
    env.setdefault("FLASHINFER_WORKSPACE_BASE", str(base / "flashinfer"))
    env.setdefault("TRITON_CACHE_DIR", str(base / "triton"))
    return {"flashinfer": env["FLASHINFER_WORKSPACE_BASE"], "triton": env["TRITON_CACHE_DIR"]}


def _run_candidate(run: _Run, e: SweepEntry, fn: Callable[..., None], inputs: Any, ref: Any) -> None:
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn(run, e, inputs, ref)
    except _Unavailable as why:
        e.result.status, e.result.error = why.status, str(why)
        e.available = why.status not in (ProbeStatus.NOT_INSTALLED, ProbeStatus.SKIPPED)
    except _Recorded:
        pass
    except Exception as error:  # the library's refusal, in its own words
        e.result.error = probes._error_line(error)
        notes = list(dict.fromkeys(str(w.message).strip() for w in caught))[:5]
        e.result.error_detail = "\n".join([f"{probes._error_type(error)}: {error}"[:4000], *notes])
        e.result.status = probes._classify(e.result.error_detail, below_arch=False)
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


def rank(entries: list[SweepEntry]) -> list[SweepEntry]:
    """Correct candidates by time, fastest first (rank 1, 2, ...); the rest after, unranked."""
    correct = sorted(
        (e for e in entries if e.correct and e.result.ms is not None), key=lambda e: e.result.ms or 0.0
    )
    for position, e in enumerate(correct, start=1):
        e.rank = position
    return correct + [e for e in entries if e not in correct]


# Candidates that are ours, not the server's kernel behind the flag value they map to: their run shows the
# library works on this arch, their speed is not the server's.
STAND_INS = {
    "triton": "the repro's own Triton MoE kernel stands in for the server's fused_moe_triton: it shows Triton "
    "MoE compiles and is correct on this GPU, not how fast the server's kernel is"
}


def propose(
    component: SweepComponent, ranked: list[SweepEntry], server: str = "sglang"
) -> dict[str, Any] | None:
    """The fastest correct candidate the server's flag accepts (per its catalog)."""
    flag = FLAG_FOR[component]
    spec = release_for(server, None).get(flag) or {}
    choices = spec.get("choices") or []
    for e in ranked:
        if e.rank is None or e.flag_value is None:
            continue
        if choices and e.flag_value not in choices:
            continue
        dest = spec.get("dest") or flag.lstrip("-").replace("-", "_")
        return {
            "candidate": e.result.name,
            "flag": flag,
            "value": e.flag_value,
            "args_patch": {dest: e.flag_value},
            "ms": e.result.ms,
            "why": f"fastest correct candidate with a {server} value for {flag} (rank {e.rank})"
            + (f"; a stand-in: {STAND_INS[e.result.name]}" if e.result.name in STAND_INS else ""),
            "stand_in": e.result.name in STAND_INS,
        }
    return None


def shapes_from_source(path: Path) -> ModelShapesRead:
    """A log's shapes, or a report document's (`dispatchlab report --json`): its args dump and any config
    it carries are turned back into the lines the reader knows."""
    if path.suffix != ".json":
        return read_shapes_file(path)
    document = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(document, dict):
        raise ValueError("a report's JSON document is an object")
    return read_shapes_from_document(document)


def _start(shapes: dict[str, int], dtype_name: str, jit_timeout_s: float) -> _Run:
    torch: Any = importlib.import_module("torch")
    device, gpu, arch, capability = "cpu", None, None, (0, 0)
    with contextlib.suppress(Exception):
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            device, gpu, capability = "cuda", torch.cuda.get_device_name(), (int(major), int(minor))
            arch = f"sm_{major}{minor}"
    dtype = getattr(torch, dtype_name if dtype_name in ("bfloat16", "float16", "float32") else "bfloat16")
    return _Run(torch, device, gpu, arch, capability, shapes, dtype, jit_timeout_s)


def run_sweep(
    component: str,
    read: ModelShapesRead,
    *,
    tokens: int | None = None,
    jit_timeout_s: float = DEFAULT_JIT_TIMEOUT_S,
    only: list[str] | None = None,
    source: str = "",
) -> SweepReport:
    """Run every candidate of `component` at the per-rank shapes of `read`; never raises for a
    candidate's failure (an unknown component raises ValueError before anything runs)."""
    kind = SweepComponent(component)
    caches = jit_cache_dirs()
    shapes = dict(read.per_rank())
    dtype_name = str(read.value("dtype") or "bfloat16")
    run = _start(shapes, dtype_name, jit_timeout_s)
    shapes["tokens"] = tokens or (DEFAULT_TOKENS if run.device == "cuda" else CPU_TOKENS)
    notes: list[str] = []
    if dtype_name not in ("bfloat16", "float16", "float32"):
        notes.append(f"the model's dtype {dtype_name} is not swept: candidates run in bfloat16")
    quant = read.value("quantization")
    if quant:
        notes.append(
            f"the checkpoint is quantized ({quant}); the MoE and GEMM candidates run bf16 weights unless named"
        )
    if run.device != "cuda":
        notes.append("no GPU: CPU timings (perf_counter) rank the torch candidates only; no % of peak")
    table, inputs, ref, required = _prepare(kind, run)
    entries: list[SweepEntry] = []
    for name, backend, flag_value, fn in table:
        if only and name not in only:
            continue
        result = ProbeResult(name, backend, str(kind), arch=run.arch, gpu=run.gpu, shape=dict(shapes))
        e = SweepEntry(result, flag_value=flag_value, required=required)
        _run_candidate(run, e, fn, inputs, ref)
        entries.append(e)
    ranked = rank(entries)
    return SweepReport(
        component=str(kind),
        device=run.device,
        gpu=run.gpu,
        arch=run.arch,
        hostname=socket.gethostname(),
        shapes=shapes,
        provenance=read.to_dict(),
        timing=(
            f"CUDA events, median of {REPEATS} after {WARMUP} warm-ups"
            if run.device == "cuda"
            else f"time.perf_counter, median of {REPEATS} after {WARMUP} warm-ups (CPU)"
        ),
        entries=ranked,
        proposed_fix=propose(kind, ranked),
        jit_cache=caches,
        source=source,
        notes=notes,
    )


def _prepare(kind: SweepComponent, run: _Run) -> tuple[list[Any], Any, Any, float]:
    torch = run.torch
    if kind == SweepComponent.MOE:
        m = _moe_inputs(run)
        return MOE_CANDIDATES, m, _moe_loop(torch, m, dtype=torch.float32), 0.95
    if kind == SweepComponent.ATTENTION:
        qkv = _attention_inputs(run)
        return ATTENTION_CANDIDATES, qkv, _attention_reference(run, *qkv), 1.0
    if kind == SweepComponent.GEMM:
        a, b = _gemm_inputs(run)
        return GEMM_CANDIDATES, (a, b), a.float() @ b.float(), 1.0
    probs = _sampling_inputs(run)
    return SAMPLING_CANDIDATES, probs, _top_k_renorm_ref(torch, probs), 1.0


# ---------------------------------------------------------------- for people


def table_lines(report: SweepReport) -> list[str]:
    head = [
        "rank",
        "candidate",
        "flag value",
        "status",
        "checked",
        "max err",
        "ms",
        "rate",
        "% peak",
        "% anchor",
        "jit",
        "error",
    ]
    rows = [head]
    for e in report.entries:
        r = e.result
        rate = (
            f"{r.tflops:g} TFLOP/s"
            if r.tflops is not None
            else ("-" if r.gbps is None else f"{r.gbps:g} GB/s")
        )
        checked = "-" if not r.checked else f"{(r.matched_ratio or 0) * 100:.1f}%"
        rows.append(
            [
                "-" if e.rank is None else str(e.rank),
                r.name,
                e.flag_value or "(baseline)",
                str(r.status) if r.checked or not r.runs else "unchecked",
                checked,
                "-" if r.max_error is None else f"{r.max_error:.3g}",
                "-" if r.ms is None else f"{r.ms:.3f}",
                rate,
                "-" if r.peak_fraction is None else f"{r.peak_fraction * 100:.0f}%",
                "-" if e.anchor_fraction is None else f"{e.anchor_fraction * 100:.0f}%",
                (f"{e.jit.get('state')} {e.jit.get('seconds', '')}s" if e.jit else "-"),
                (r.error or "")[:140],
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head) - 1)]
    lines = [
        f"{report.component} sweep on {report.gpu or 'CPU'} {report.arch or ''} ({report.hostname}); {report.timing}",
        f"shapes per rank: {report.shapes}; read: {', '.join(report.provenance.get('read', [])) or 'none'};"
        f" inferred: {', '.join(report.provenance.get('inferred', [])) or 'none'};"
        f" defaulted: {', '.join(report.provenance.get('defaulted', [])) or 'none'}",
        f"tolerance atol=rtol={ATOL:g}, whole output against a float32 torch reference",
    ]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    fix = report.proposed_fix
    lines.append(
        f"proposed fix: {fix['flag']} {fix['value']} ({fix['why']})"
        if fix
        else "proposed fix: none (no correct candidate with a server flag value)"
    )
    lines += [f"note: {n}" for n in report.notes]
    return lines
