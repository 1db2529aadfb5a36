"""MoE probes: one MoE layer (route, gate/up, SiLU, down, combine) at the model's shapes through
torch._grouped_mm, FlashInfer's CUTLASS fused MoE and trtllm-gen's MXFP4 MoE; checked on the first
MOE_CHECK_TOKENS tokens against a float32 loop over experts, where 95% of the elements must match."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.probes import harness
from worker.probes.harness import (
    Context,
    ModelShapes,
    ProbeResult,
    ProbeStatus,
    build_in_child,
    error_line,
    first_call,
    import_once,
    require_memory,
)

MOE_CHECK_TOKENS = 32

# Built in a child process with a time limit: some 180 CUTLASS translation units, ~40 min the first time.
CUTLASS_MOE_BUILD = """
import torch
from flashinfer.fused_moe import core
major, minor = torch.cuda.get_device_capability()
core.get_cutlass_fused_moe_module(str(major * 10 + minor))
"""


@dataclass
class _MoeInputs:
    x: Any  # [tokens, hidden] bf16
    w31: Any  # [experts, 2 * inter, hidden] bf16: rows [up (w3); gate (w1)], FlashInfer CUTLASS's order
    w2: Any  # [experts, hidden, inter] bf16
    ids: Any  # [tokens, top_k] int32
    weights: Any  # [tokens, top_k] float32, summing to 1 per token


def moe_bytes(s: ModelShapes) -> float:
    weights = s.num_experts * 3 * s.moe_intermediate_size * s.hidden_size * 2
    rows = s.tokens * s.top_k
    activations = rows * (2 * s.hidden_size + 3 * s.moe_intermediate_size) * 2 * 2
    return weights + activations + 2 * s.moe_intermediate_size * s.hidden_size * 4


def _moe_shape(ctx: Context, r: ProbeResult) -> None:
    s = ctx.shapes
    r.shape = {
        "tokens": s.tokens,
        "hidden_size": s.hidden_size,
        "moe_intermediate_size": s.moe_intermediate_size,
        "num_experts": s.num_experts,
        "top_k": s.top_k,
        "dtype": "bfloat16",
    }
    require_memory(ctx, moe_bytes(s), "this MoE shape")


def _moe_inputs(ctx: Context, r: ProbeResult) -> _MoeInputs:
    torch, s = ctx.torch, ctx.shapes
    _moe_shape(ctx, r)
    e, h, i = s.num_experts, s.hidden_size, s.moe_intermediate_size
    w31 = torch.randn(e, 2 * i, h, device=harness.DEVICE, dtype=torch.bfloat16).mul_(h**-0.5)
    w2 = torch.randn(e, h, i, device=harness.DEVICE, dtype=torch.bfloat16).mul_(i**-0.5)
    x = torch.randn(s.tokens, h, device=harness.DEVICE, dtype=torch.bfloat16)
    probs = torch.randn(s.tokens, e, device=harness.DEVICE).softmax(dim=-1)
    weights, ids = probs.topk(s.top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return _MoeInputs(x, w31, w2, ids.to(torch.int32), weights.float())


def _moe_reference(torch: Any, m: _MoeInputs, tokens: int) -> Any:
    """The first `tokens` outputs in float32, one expert at a time: sum_j w_j * W2 (silu(gate) * up)."""
    inter = m.w2.shape[2]
    out = torch.zeros(tokens, m.x.shape[1], device=harness.DEVICE)
    pairs: dict[int, list[tuple[int, int]]] = {}
    for t, row in enumerate(m.ids[:tokens].tolist()):
        for j, expert in enumerate(row):
            pairs.setdefault(expert, []).append((t, j))
    for expert, chosen in pairs.items():
        toks = torch.tensor([t for t, _ in chosen], device=harness.DEVICE)
        slots = torch.tensor([j for _, j in chosen], device=harness.DEVICE)
        up_gate = m.x[toks].float() @ m.w31[expert].float().t()
        act = torch.nn.functional.silu(up_gate[:, inter:]) * up_gate[:, :inter]
        y = act @ m.w2[expert].float().t()
        out.index_add_(0, toks, y * m.weights[toks, slots][:, None])
    return out


def moe_flops(s: ModelShapes) -> float:
    return 6.0 * s.tokens * s.top_k * s.hidden_size * s.moe_intermediate_size


def moe_grouped_mm(ctx: Context, r: ProbeResult) -> None:
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
        out = torch.zeros(s.tokens, s.hidden_size, device=harness.DEVICE)
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
        y = torch.empty(xs.shape[0], s.hidden_size, device=harness.DEVICE, dtype=torch.bfloat16)
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
            r.extra["grouped_mm_error"] = error_line(error)
    if out is None:
        r.backend = "torch (per-expert loop)"
        run, out = run_loop, run_loop()
    harness.check_output(
        ctx, r, out[:MOE_CHECK_TOKENS], _moe_reference(torch, m, MOE_CHECK_TOKENS), required=0.95
    )
    harness.measure(ctx, r, run, flops=moe_flops(s), metric="bf16")
    r.extra["weights_gbps"] = round(3 * s.num_experts * s.hidden_size * inter * 2 / (r.ms or 1.0) / 1e6, 1)


def flashinfer_cutlass_moe(ctx: Context, r: ProbeResult) -> None:
    torch, s = ctx.torch, ctx.shapes
    import_once(ctx)
    fused_moe = import_once(ctx, "flashinfer.fused_moe")
    r.extra["import_s"] = ctx.modules.get("flashinfer:import_s")
    _moe_shape(ctx, r)  # and enough memory, before a build of minutes
    build_in_child(ctx, r, CUTLASS_MOE_BUILD, "FlashInfer's CUTLASS fused MoE", r"fused_moe_\d+")
    m = _moe_inputs(ctx, r)
    out = torch.empty(s.tokens, s.hidden_size, device=harness.DEVICE, dtype=torch.bfloat16)

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

    first_call(ctx, r, run)
    harness.check_output(
        ctx, r, out[:MOE_CHECK_TOKENS], _moe_reference(torch, m, MOE_CHECK_TOKENS), required=0.95
    )
    harness.measure(ctx, r, run, flops=moe_flops(s), metric="bf16")


def flashinfer_trtllm_moe_fp4(ctx: Context, r: ProbeResult) -> None:
    """trtllm-gen's MXFP4-weight MoE (bf16 activations), the path SGLang's flashinfer_trtllm /
    flashinfer_mxfp4 runners take; FlashInfer ships its kernels for SM100/SM103 only, so elsewhere the
    interesting output is the exact refusal. Weights are random codes, so numerics are not checked."""
    torch, s = ctx.torch, ctx.shapes
    import_once(ctx)
    fused_moe = import_once(ctx, "flashinfer.fused_moe")
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
    require_memory(ctx, e * 3 * i * h * 0.55 + t * (h + e) * 4, "this MoE shape")
    hidden = torch.randn(t, h, device=harness.DEVICE, dtype=torch.bfloat16).mul_(0.1)
    logits = torch.randn(t, e, device=harness.DEVICE, dtype=torch.bfloat16)
    w13 = torch.randint(0, 256, (e, 2 * i, h // 2), device=harness.DEVICE, dtype=torch.uint8)
    w2 = torch.randint(0, 256, (e, h, i // 2), device=harness.DEVICE, dtype=torch.uint8)
    # E8M0 scale bytes (127 = 2^0), carried in float8_e4m3fn tensors as FlashInfer's own tests do.
    w13_scale = torch.full((e, 2 * i, h // 32), 127, device=harness.DEVICE, dtype=torch.uint8).view(
        torch.float8_e4m3fn
    )
    w2_scale = torch.full((e, h, i // 32), 127, device=harness.DEVICE, dtype=torch.uint8).view(
        torch.float8_e4m3fn
    )
    ones = torch.ones(e, device=harness.DEVICE)

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

    out = first_call(ctx, r, run)
    result = out[0] if isinstance(out, list | tuple) else out
    # Random FP4 codes have no reference here: the kernel ran, nothing says its numbers are right.
    r.status = ProbeStatus.UNCHECKED
    r.error = "ran; output not compared with a reference (random MXFP4 codes), only checked finite"
    r.extra["finite"] = bool(result.float().isfinite().all().item())
    harness.measure(ctx, r, run, flops=moe_flops(s), metric="fp4")
