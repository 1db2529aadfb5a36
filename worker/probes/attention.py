"""Attention probes: torch SDPA through each of its backends, and FlashInfer's single decode and prefill
(GQA at the model's head counts), checked against softmax(q k^T / sqrt(d)) v in float32."""

from __future__ import annotations

import importlib
import math
from typing import Any

from worker.probes import harness
from worker.probes.harness import Context, ProbeFn, ProbeResult, first_call, import_once

SDPA_SHAPE = (8, 32, 4096, 128)  # batch, heads, sequence, head dim: as much work as the 8192^3 GEMM
DECODE_KV_LEN = 65536
PREFILL_LEN = 8192


def attention_reference(torch: Any, q: Any, k: Any, v: Any, *, causal: bool) -> Any:
    """softmax(q k^T / sqrt(d)) v in float32; q, k, v as [heads, seq, dim]."""
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        rows, cols = scores.shape[-2], scores.shape[-1]
        mask = torch.ones(rows, cols, dtype=torch.bool, device=q.device).tril(cols - rows)
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v.float()


def sdpa(backend: str) -> ProbeFn:
    def probe(ctx: Context, r: ProbeResult) -> None:
        torch = ctx.torch
        attention = importlib.import_module("torch.nn.attention")
        kernel = getattr(attention.SDPBackend, backend)
        b, h, s, d = SDPA_SHAPE
        r.shape = {"batch": b, "heads": h, "seq": s, "head_dim": d, "causal": True, "dtype": "bfloat16"}
        q, k, v = (torch.randn(b, h, s, d, device=harness.DEVICE, dtype=torch.bfloat16) for _ in range(3))

        def run() -> Any:
            with attention.sdpa_kernel([kernel]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

        out = run()
        harness.check_output(
            ctx, r, out[0, :2], attention_reference(torch, q[0, :2], k[0, :2], v[0, :2], causal=True)
        )
        del out
        harness.measure(ctx, r, run, flops=4.0 * b * h * s * s * d / 2, metric="bf16")

    return probe


def flashinfer_decode(ctx: Context, r: ProbeResult) -> None:
    torch, s = ctx.torch, ctx.shapes
    fi = import_once(ctx)
    r.extra["import_s"] = ctx.modules.get("flashinfer:import_s")
    hq, hkv, d, length = s.num_attention_heads, s.num_key_value_heads, s.head_dim, DECODE_KV_LEN
    r.shape = {"qo_heads": hq, "kv_heads": hkv, "head_dim": d, "kv_len": length, "dtype": "bfloat16"}
    q = torch.randn(hq, d, device=harness.DEVICE, dtype=torch.bfloat16)
    k = torch.randn(length, hkv, d, device=harness.DEVICE, dtype=torch.bfloat16)
    v = torch.randn(length, hkv, d, device=harness.DEVICE, dtype=torch.bfloat16)

    def run() -> Any:
        return fi.single_decode_with_kv_cache(q, k, v)

    out = first_call(ctx, r, run)
    group = hq // hkv
    qg = q.float().view(hkv, group, d)
    probs = (torch.einsum("hgd,lhd->hgl", qg, k.float()) / math.sqrt(d)).softmax(dim=-1)
    ref = torch.einsum("hgl,lhd->hgd", probs, v.float()).reshape(hq, d)
    harness.check_output(ctx, r, out, ref)
    harness.measure(ctx, r, run, nbytes=float(k.numel() + v.numel() + 2 * q.numel()) * 2, metric="memory")


def flashinfer_prefill(ctx: Context, r: ProbeResult) -> None:
    torch, s = ctx.torch, ctx.shapes
    fi = import_once(ctx)
    r.extra["import_s"] = ctx.modules.get("flashinfer:import_s")
    hq, hkv, d, n = s.num_attention_heads, s.num_key_value_heads, s.head_dim, PREFILL_LEN
    r.shape = {"qo_heads": hq, "kv_heads": hkv, "head_dim": d, "seq": n, "causal": True, "dtype": "bfloat16"}
    q = torch.randn(n, hq, d, device=harness.DEVICE, dtype=torch.bfloat16)
    k = torch.randn(n, hkv, d, device=harness.DEVICE, dtype=torch.bfloat16)
    v = torch.randn(n, hkv, d, device=harness.DEVICE, dtype=torch.bfloat16)

    def run() -> Any:
        return fi.single_prefill_with_kv_cache(q, k, v, causal=True)

    out = first_call(ctx, r, run)
    heads = min(2, hq // hkv)  # query heads that share kv head 0
    ref = attention_reference(
        torch, q[:, :heads].transpose(0, 1), k[:, :1].transpose(0, 1), v[:, :1].transpose(0, 1), causal=True
    )
    harness.check_output(ctx, r, out[:, :heads].transpose(0, 1), ref)
    harness.measure(ctx, r, run, flops=4.0 * n * n * hq * d / 2, metric="bf16")
