"""The attention candidates: torch SDPA through each backend, FlashInfer's single prefill and torch's
flex_attention compiled by Triton; causal, at the model's heads, checked against float32 attention."""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from typing import Any

from worker.probes import attention as probe_attention
from worker.probes.harness import import_once
from worker.sweep.harness import (
    Run,
    SweepEntry,
    check,
    need_flashinfer,
    need_gpu,
    probe_context,
    rate,
    sync,
    time_ms,
)


def attention_inputs(run: Run) -> tuple[Any, Any, Any]:
    torch, s = run.torch, run.shapes
    gen = torch.Generator(device=run.device).manual_seed(0)
    hq, hkv, d, n = s["num_attention_heads"], s["num_key_value_heads"], s["head_dim"], s["tokens"]
    q = torch.randn(1, hq, n, d, generator=gen, device=run.device).to(run.dtype)
    k = torch.randn(1, hkv, n, d, generator=gen, device=run.device).to(run.dtype)
    v = torch.randn(1, hkv, n, d, generator=gen, device=run.device).to(run.dtype)
    return q, k, v


def _expand(torch: Any, kv: Any, group: int) -> Any:
    return kv.repeat_interleave(group, dim=1) if group > 1 else kv


def attention_reference(run: Run, q: Any, k: Any, v: Any) -> Any:
    """float32 causal attention, one query head at a time (keeps memory at one [n, n] score matrix)."""
    torch = run.torch
    group = q.shape[1] // k.shape[1]
    out = torch.empty(q.shape, device=run.device, dtype=torch.float32)
    for head in range(q.shape[1]):
        out[0, head] = probe_attention.attention_reference(
            torch,
            q[0, head : head + 1],
            k[0, head // group : head // group + 1],
            v[0, head // group : head // group + 1],
            causal=True,
        )[0]
    return out


def _attention_flops(s: dict[str, int]) -> float:
    return 4.0 * s["num_attention_heads"] * s["tokens"] ** 2 * s["head_dim"] / 2


def _sdpa(backend: str) -> Callable[[Run, SweepEntry, tuple[Any, Any, Any], Any], None]:
    def candidate(run: Run, e: SweepEntry, qkv: tuple[Any, Any, Any], ref: Any) -> None:
        torch = run.torch
        attention = importlib.import_module("torch.nn.attention")
        kernel = getattr(attention.SDPBackend, backend)
        q, k, v = qkv
        group = q.shape[1] // k.shape[1]
        ke, ve = _expand(torch, k, group), _expand(torch, v, group)

        def call() -> Any:
            with attention.sdpa_kernel([kernel]):
                return torch.nn.functional.scaled_dot_product_attention(q, ke, ve, is_causal=True)

        check(e, call(), ref)
        rate(run, e, time_ms(run, call), flops=_attention_flops(run.shapes), metric="bf16")

    return candidate


def _flashinfer_prefill(run: Run, e: SweepEntry, qkv: tuple[Any, Any, Any], ref: Any) -> None:
    need_flashinfer()
    need_gpu(run)
    ctx = probe_context(run)
    fi = import_once(ctx)
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in qkv)  # NHD

    def call() -> Any:
        return fi.single_prefill_with_kv_cache(q, k, v, causal=True)

    start = time.perf_counter()
    out = call()
    sync(run)
    e.jit = {"state": "loaded", "seconds": round(time.perf_counter() - start, 3)}
    check(e, out.transpose(0, 1).unsqueeze(0), ref)
    rate(run, e, time_ms(run, call), flops=_attention_flops(run.shapes), metric="bf16")


def _flex_attention(run: Run, e: SweepEntry, qkv: tuple[Any, Any, Any], ref: Any) -> None:
    """torch's flex_attention compiled: Triton kernels generated for this GPU (SGLang `flex_attention`)."""
    need_gpu(run)
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
    sync(run)
    e.jit = {
        "state": "built",
        "seconds": round(time.perf_counter() - start, 3),
        "cache": os.environ.get("TRITON_CACHE_DIR"),
    }
    check(e, out, ref)
    rate(run, e, time_ms(run, call), flops=_attention_flops(run.shapes), metric="bf16")


ATTENTION_CANDIDATES: list[tuple[str, str, str | None, Callable[[Run, SweepEntry, Any, Any], None]]] = [
    ("sdpa_math", "torch SDPA math", "torch_native", _sdpa("MATH")),
    ("sdpa_efficient", "torch SDPA efficient", "torch_native", _sdpa("EFFICIENT_ATTENTION")),
    ("sdpa_flash", "torch SDPA flash", "torch_native", _sdpa("FLASH_ATTENTION")),
    ("sdpa_cudnn", "torch SDPA cuDNN", "torch_native", _sdpa("CUDNN_ATTENTION")),
    ("flashinfer_prefill", "flashinfer single_prefill", "flashinfer", _flashinfer_prefill),
    ("flex_attention", "torch flex_attention (Triton)", "flex_attention", _flex_attention),
]
