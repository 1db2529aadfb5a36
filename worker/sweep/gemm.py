"""The GEMM candidates: torch's matmul (cuBLAS on a GPU) and FP8 torch._scaled_mm (cuBLASLt), one
tokens x hidden by hidden x intermediate product, against a float32 matmul."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from worker.sweep.harness import (
    Run,
    SweepEntry,
    check,
    need_gpu,
    rate,
    time_ms,
)


def gemm_inputs(run: Run) -> tuple[Any, Any]:
    torch, s = run.torch, run.shapes
    gen = torch.Generator(device=run.device).manual_seed(0)
    a = torch.randn(s["tokens"], s["hidden_size"], generator=gen, device=run.device).to(run.dtype)
    b = (
        torch.randn(s["hidden_size"], s["moe_intermediate_size"], generator=gen, device=run.device)
        * s["hidden_size"] ** -0.5
    ).to(run.dtype)
    return a, b


def _gemm_torch(run: Run, e: SweepEntry, ab: tuple[Any, Any], ref: Any) -> None:
    a, b = ab
    check(e, a @ b, ref)
    flops = 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    rate(run, e, time_ms(run, lambda: a @ b), flops=flops, metric="bf16")


def _gemm_fp8(run: Run, e: SweepEntry, ab: tuple[Any, Any], ref: Any) -> None:
    need_gpu(run)
    torch = run.torch
    a, b = ab
    sa, sb = a.float().abs().max() / 448, b.float().abs().max() / 448
    a8 = (a.float() / sa).to(torch.float8_e4m3fn)
    b8 = (b.float() / sb).to(torch.float8_e4m3fn).t().contiguous().t()

    def call() -> Any:
        return torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=run.dtype)

    e.result.extra["quantized"] = "per-tensor float8_e4m3fn: the tolerance is bf16's, so rounding shows"
    check(e, call(), ref)
    rate(run, e, time_ms(run, call), flops=2.0 * a.shape[0] * a.shape[1] * b.shape[1], metric="fp8")


GEMM_CANDIDATES: list[tuple[str, str, str | None, Callable[[Run, SweepEntry, Any, Any], None]]] = [
    ("torch_mm", "torch matmul (cuBLAS on GPU)", None, _gemm_torch),
    ("torch_scaled_mm_fp8", "torch._scaled_mm FP8 (cuBLASLt)", None, _gemm_fp8),
]
