"""GEMM probes: the dense matmuls a server runs through cuBLAS / cuBLASLt, in bf16, FP8 (per-tensor scales)
and block-scaled FP4 (MXFP4, NVFP4), checked on CHECK_ROWS output rows against a float32 torch matmul."""

from __future__ import annotations

import math
from typing import Any

from worker.probes import harness
from worker.probes.harness import Context, ProbeFn, ProbeResult, ProbeStatus, Stop

GEMM_N = 8192  # m = n = k: large enough to fill an H200 and leave its 60 MB L2 far behind


def gemm_bf16(ctx: Context, r: ProbeResult) -> None:
    torch, n = ctx.torch, GEMM_N
    r.shape = {"m": n, "n": n, "k": n, "dtype": "bfloat16"}
    a = torch.randn(n, n, device=harness.DEVICE, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=harness.DEVICE, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=harness.DEVICE, dtype=torch.bfloat16)
    torch.mm(a, b, out=c)
    harness.check_output(ctx, r, c[: harness.CHECK_ROWS], a[: harness.CHECK_ROWS].float() @ b.float())
    harness.measure(ctx, r, lambda: torch.mm(a, b, out=c), flops=2.0 * n**3, metric="bf16")


def gemm_fp8(fast_accum: bool) -> ProbeFn:
    def probe(ctx: Context, r: ProbeResult) -> None:
        torch, n = ctx.torch, GEMM_N
        r.shape = {"m": n, "n": n, "k": n, "dtype": "float8_e4m3fn", "scales": "per-tensor"}
        r.extra["use_fast_accum"] = fast_accum
        a = torch.randn(n, n, device=harness.DEVICE).to(torch.float8_e4m3fn)
        b = (
            torch.randn(n, n, device=harness.DEVICE).to(torch.float8_e4m3fn).t()
        )  # column-major, as cuBLASLt wants
        scale_a = torch.tensor(0.5, device=harness.DEVICE)
        scale_b = torch.tensor(0.25, device=harness.DEVICE)

        def run() -> Any:
            return torch._scaled_mm(
                a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16, use_fast_accum=fast_accum
            )

        out = run()
        harness.check_output(
            ctx, r, out[: harness.CHECK_ROWS], (a[: harness.CHECK_ROWS].float() @ b.float()) * 0.125
        )
        harness.measure(ctx, r, run, flops=2.0 * n**3, metric="fp8")

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


def gemm_fp4(recipe: str) -> ProbeFn:
    """MXFP4 (E2M1 data, E8M0 scales per 32) or NVFP4 (E4M3 scales per 16) through torch's scaled mm.
    Every scale is 1.0, so the blocked (32x4x4 swizzled) scale layout cannot change the result."""
    block = 32 if recipe == "mxfp4" else 16

    def probe(ctx: Context, r: ProbeResult) -> None:
        torch, n = ctx.torch, GEMM_N
        fp4 = getattr(torch, "float4_e2m1fn_x2", None)
        if fp4 is None:
            raise Stop(ProbeStatus.NOT_INSTALLED, f"torch {torch.__version__} has no float4_e2m1fn_x2 dtype")
        scale_dtype = "float8_e8m0fnu" if recipe == "mxfp4" else "float8_e4m3fn"
        r.shape = {
            "m": n,
            "n": n,
            "k": n,
            "dtype": "float4_e2m1fn_x2",
            "scales": f"{scale_dtype} per {block}",
        }
        a_codes = torch.randint(0, 256, (n, n // 2), device=harness.DEVICE, dtype=torch.uint8)
        b_codes = torch.randint(0, 256, (n, n // 2), device=harness.DEVICE, dtype=torch.uint8)
        a, b = a_codes.view(fp4), b_codes.view(fp4).t()
        numel = math.ceil(n / 128) * 128 * math.ceil(n // block / 4) * 4
        if recipe == "mxfp4":
            scale = torch.full((numel,), 127, device=harness.DEVICE, dtype=torch.uint8).view(
                torch.float8_e8m0fnu
            )
        else:
            scale = torch.ones(numel, device=harness.DEVICE).to(torch.float8_e4m3fn)
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
        harness.check_output(
            ctx,
            r,
            out[: harness.CHECK_ROWS],
            _fp4_values(torch, a_codes[: harness.CHECK_ROWS]) @ _fp4_values(torch, b_codes).t(),
        )
        harness.measure(ctx, r, run, flops=2.0 * n**3, metric="fp4")

    return probe
