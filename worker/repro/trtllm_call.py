"""The repro's "flashinfer_trtllm" MoE runner: FlashInfer's TensorRT-LLM-gen block-scaled FP4 MoE, the
kernel family of the seed crash (`trtllm_fp4_block_scale_*moe`, cubins `bmm_MxE4m3_MxE2m1..._sm100f`).
FlashInfer builds its module for SM100 only and refuses any other chip before reading an input; the
repro exists to show that refusal, so the weights are MXFP4-shaped placeholders, not a quantization of
the bf16 layer (the answer on an SM100 chip would not match the reference)."""

from __future__ import annotations

from typing import Any


def trtllm_routed_moe(layer: Any, x: Any, weights: Any, ids: Any) -> Any:
    import torch
    from flashinfer.fused_moe import trtllm_fp4_block_scale_moe

    hidden = x.shape[1]
    experts, inter = layer.experts, layer.inter
    device = x.device
    scale_one = torch.full((1,), 127, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    w13 = torch.randint(0, 255, (experts, 2 * inter, hidden // 2), dtype=torch.uint8, device=device)
    s13 = scale_one.expand(experts, 2 * inter, hidden // 32).contiguous()
    w2 = torch.randint(0, 255, (experts, hidden, inter // 2), dtype=torch.uint8, device=device)
    s2 = scale_one.expand(experts, hidden, inter // 32).contiguous()
    ones = torch.ones(experts, dtype=torch.float32, device=device)
    logits = (x.float() @ layer.router.float()).to(torch.bfloat16)
    outputs = trtllm_fp4_block_scale_moe(
        routing_logits=logits,
        routing_bias=None,
        hidden_states=x.to(torch.bfloat16),
        hidden_states_scale=None,
        gemm1_weights=w13,
        gemm1_weights_scale=s13,
        gemm1_bias=None,
        gemm1_alpha=None,
        gemm1_beta=None,
        gemm1_clamp_limit=None,
        gemm2_weights=w2,
        gemm2_weights_scale=s2,
        gemm2_bias=None,
        output1_scale_scalar=ones,
        output1_scale_gate_scalar=ones,
        output2_scale_scalar=ones,
        num_experts=experts,
        top_k=layer.top_k,
        n_group=None,
        topk_group=None,
        intermediate_size=inter,
        local_expert_offset=0,
        local_num_experts=experts,
        routed_scaling_factor=None,
        routing_method_type=1,
        do_finalize=True,
    )
    out = outputs[0] if isinstance(outputs, (list, tuple)) else outputs
    return out.to(x.dtype)
