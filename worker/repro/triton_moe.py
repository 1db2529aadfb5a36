"""The repro's "triton" MoE runner: per expert, a Triton matmul JIT-compiled for this GPU (gate/up,
SiLU, down), the unfused shape of what SGLang's Triton runner computes. Imported only on a GPU."""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    inner = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(
            a_ptr + rows[:, None] * stride_am + (k + inner)[None, :] * stride_ak,
            mask=(rows[:, None] < M) & ((k + inner)[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            b_ptr + (k + inner)[:, None] * stride_bk + cols[None, :] * stride_bn,
            mask=((k + inner)[:, None] < K) & (cols[None, :] < N),
            other=0.0,
        )
        acc += tl.dot(a, b)
    tl.store(
        c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn,
        acc.to(c_ptr.dtype.element_ty),
        mask=(rows[:, None] < M) & (cols[None, :] < N),
    )


def matmul(a: Any, b_t: Any) -> Any:
    """a [M,K] @ b_t.T where b_t is [N,K] (weights stored as SGLang stores them)."""
    m, k = a.shape
    n = b_t.shape[0]
    c = torch.empty(m, n, device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(m, 16), triton.cdiv(n, 64))
    _matmul_kernel[grid](
        a, b_t, c, m, n, k, a.stride(0), a.stride(1), b_t.stride(1), b_t.stride(0), c.stride(0), c.stride(1),
        BLOCK_M=16, BLOCK_N=64, BLOCK_K=64,
    )  # fmt: skip
    return c


def triton_moe(x: Any, weights: Any, ids: Any, w13: Any, w2: Any) -> Any:
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for slot in range(ids.shape[1]):
        for expert in ids[:, slot].unique().tolist():
            rows = (ids[:, slot] == expert).nonzero().squeeze(-1)
            h = matmul(x[rows].contiguous(), w13[expert])
            gate, up = h.float().chunk(2, dim=-1)
            y = matmul((torch.nn.functional.silu(gate) * up).to(x.dtype).contiguous(), w2[expert])
            out[rows] += weights[rows, slot : slot + 1] * y.float()
    return out.to(x.dtype)
