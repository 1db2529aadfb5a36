"""The MoE candidates: a torch per-expert loop and torch._grouped_mm (baselines), the repro's Triton MoE
(a stand-in for the server's), FlashInfer's CUTLASS fused MoE, trtllm-gen (through the probe of that
name) and CuTe-DSL; checked on the whole output against the float32 loop, 95% of the elements must match."""

from __future__ import annotations

import importlib
import importlib.util
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from worker.probes import PROBES
from worker.probes.harness import ProbeStatus, import_once, run_one
from worker.probes.moe import CUTLASS_MOE_BUILD
from worker.sweep.harness import (
    Recorded,
    Run,
    SweepEntry,
    Unavailable,
    check,
    jit_state,
    need_cubins,
    need_flashinfer,
    need_gpu,
    probe_context,
    rate,
    sync,
    time_ms,
)


@dataclass
class _Moe:
    x: Any
    w13: Any  # [E, 2I, H]: rows [gate; up] (SGLang's w13 order)
    w2: Any  # [E, H, I]
    ids: Any  # [T, k] int64
    weights: Any  # [T, k] float32


def moe_inputs(run: Run) -> _Moe:
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


def moe_loop(torch: Any, m: _Moe, *, dtype: Any) -> Any:
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


def _moe_torch(run: Run, e: SweepEntry, m: _Moe, ref: Any) -> None:
    torch = run.torch

    def call() -> Any:
        return moe_loop(torch, m, dtype=run.dtype).to(run.dtype)

    check(e, call(), ref)
    rate(run, e, time_ms(run, call), flops=_moe_flops(run.shapes), metric="bf16")


def _moe_triton(run: Run, e: SweepEntry, m: _Moe, ref: Any) -> None:
    if importlib.util.find_spec("triton") is None:
        raise Unavailable(ProbeStatus.NOT_INSTALLED, "triton is not installed")
    module = importlib.import_module("worker.repro.triton_moe")
    e.result.extra["triton"] = getattr(importlib.import_module("triton"), "__version__", None)
    # the repro's kernel takes w13 as [up; gate]-agnostic halves: gate first, as here
    start = time.perf_counter()
    out = module.triton_moe(m.x, m.weights, m.ids, m.w13, m.w2)
    sync(run)
    e.jit = {
        "state": "built",
        "seconds": round(time.perf_counter() - start, 3),
        "cache": os.environ.get("TRITON_CACHE_DIR"),
    }
    check(e, out, ref)
    rate(
        run,
        e,
        time_ms(run, lambda: module.triton_moe(m.x, m.weights, m.ids, m.w13, m.w2)),
        flops=_moe_flops(run.shapes),
        metric="bf16",
    )


def _moe_grouped(run: Run, e: SweepEntry, m: _Moe, ref: Any) -> None:
    torch = run.torch
    grouped = getattr(torch, "_grouped_mm", None)
    if grouped is None:
        raise Unavailable(ProbeStatus.NOT_INSTALLED, f"torch {torch.__version__} has no torch._grouped_mm")
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

    check(e, call(), ref)
    rate(run, e, time_ms(run, call), flops=_moe_flops(s), metric="bf16")


def _moe_flashinfer_cutlass(run: Run, e: SweepEntry, m: _Moe, ref: Any) -> None:
    torch, s = run.torch, run.shapes
    need_flashinfer()
    need_gpu(run)
    ctx = probe_context(run)
    fused_moe = import_once(ctx, "flashinfer.fused_moe")
    e.jit = jit_state(ctx, e.result, CUTLASS_MOE_BUILD, "FlashInfer's CUTLASS fused MoE", r"fused_moe_\d+")
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
    sync(run)
    check(e, out, ref)
    rate(run, e, time_ms(run, call), flops=_moe_flops(s), metric="bf16")


def _moe_flashinfer_trtllm(run: Run, e: SweepEntry, m: _Moe, ref: Any) -> None:
    """trtllm-gen's MoE through the probe of the same name (MXFP4 weights: random codes, so the output is
    not compared: the candidate says `unchecked` and is never proposed; what matters is whether it runs
    here or the library's refusal)."""
    need_flashinfer()
    need_gpu(run)
    need_cubins()
    ctx = probe_context(run)
    probe = PROBES["flashinfer_trtllm_moe_fp4"]
    result = run_one(probe, ctx)
    keep = e.result.name, e.result.backend
    e.result = result
    e.result.name, e.result.backend = keep
    if result.status == ProbeStatus.PASSED and not result.checked:
        e.result.extra["unchecked"] = "random MXFP4 codes: the output is not compared with a reference"
    if result.status not in (ProbeStatus.PASSED, ProbeStatus.INCORRECT_NUMERICAL):
        raise Recorded()


def _moe_flashinfer_cutedsl(run: Run, e: SweepEntry, m: _Moe, ref: Any) -> None:
    need_flashinfer()
    need_gpu(run)
    module = importlib.import_module("flashinfer")
    names = [n for n in dir(module) if "cute" in n.lower() and "moe" in n.lower()]
    if not names:
        raise Unavailable(
            ProbeStatus.NOT_INSTALLED,
            f"flashinfer {getattr(module, '__version__', '?')} exports no CuTe-DSL fused MoE",
        )
    raise Unavailable(
        ProbeStatus.SKIPPED,
        f"found {', '.join(names)}: the sweep does not drive the CuTe-DSL MoE yet (it takes NVFP4 weights)",
    )


MOE_CANDIDATES: list[tuple[str, str, str | None, Callable[[Run, SweepEntry, _Moe, Any], None]]] = [
    ("torch_loop", "torch (per-expert bmm loop)", None, _moe_torch),
    ("torch_grouped_mm", "torch._grouped_mm", None, _moe_grouped),
    ("triton", "triton (worker.repro.triton_moe)", "triton", _moe_triton),
    ("flashinfer_cutlass", "flashinfer cutlass_fused_moe", "flashinfer_cutlass", _moe_flashinfer_cutlass),
    ("flashinfer_trtllm", "flashinfer trtllm-gen (MXFP4)", "flashinfer_trtllm", _moe_flashinfer_trtllm),
    ("flashinfer_cutedsl", "flashinfer CuTe-DSL", "flashinfer_cutedsl", _moe_flashinfer_cutedsl),
]
