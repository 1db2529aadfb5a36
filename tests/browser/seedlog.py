"""A seed-case log (docs: research/seed-case.md, model A) written for the browser tests and the bench:
DeepSeek-V4-Flash NVFP4 on 4x RTX PRO 6000 Blackwell (sm_120), EAGLE, crash while capturing the draft's
CUDA graphs in the SM100-only trtllm-gen MXFP4 MoE kernel. Two lines try to inject markup."""

from __future__ import annotations

HOSTILE = [
    "<script>alert(1)</script>",
    '<img src=x onerror="document.body.dataset.pwned=1">',
]

RANKS = range(4)


def _ts(seconds: int) -> str:
    minutes, sec = divmod(seconds, 60)
    hours, minutes = divmod(14 + minutes, 60)
    return f"2026-05-12 {21 + hours:02d}:{minutes:02d}:{sec:02d}"


def seed_case_lines(filler: int = 300) -> list[str]:
    out: list[str] = [
        "$ python -m sglang.launch_server --model-path /models/DeepSeek-V4-Flash-NVFP4 --tp 4 --context-length 8192 "
        "--moe-runner-backend triton --speculative-algorithm EAGLE --speculative-num-steps 3 "
        "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
        "GPU 0,1,2,3: NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        "GPU 0,1,2,3 Compute Capability: 12.0",
        "sglang: 0.5.10.post1",
        "flashinfer_python: 0.5.3",
        "PyTorch: 2.9.1+cu130",
        f"[{_ts(0)}] server_args=ServerArgs(model_path='/models/DeepSeek-V4-Flash-NVFP4', tokenizer_path='/models/DeepSeek-V4-Flash-NVFP4', "
        "tp_size=4, dp_size=1, context_length=8192, quantization=None, kv_cache_dtype='auto', mem_fraction_static=0.85, "
        "attention_backend=None, moe_runner_backend='triton', speculative_algorithm='EAGLE', speculative_num_steps=3, "
        "speculative_eagle_topk=1, speculative_num_draft_tokens=4, speculative_moe_runner_backend='triton', "
        "cuda_graph_max_bs=64, port=30000)",
    ]
    t = 2
    for rank in RANKS:
        out.append(f"[{_ts(t)} TP{rank}] Init torch distributed begin.")
    t += 1
    for rank in RANKS:
        out.append(f"[{_ts(t)} TP{rank}] Init torch distributed ends. mem usage=0.00 GB")
        out.append(f"[{_ts(t)} TP{rank}] Load weight begin. avail mem=94.50 GB")
    out.append(
        f"[{_ts(t)} TP0] Detected nvfp4 checkpoint. Please note that the format is experimental and subject to change."
    )
    out.append(f"[{_ts(t)} TP0] Use dsv4 attention backend for DeepseekV4ForCausalLM")
    for n in range(filler):
        out.append(f"[{_ts(t + n // 4)} TP{n % 4}] Loading safetensors shard {n % 46 + 1}/46 ... done")
    out.append(f"[{_ts(t + 20)} TP0] WARNING {HOSTILE[0]}")
    out.append(f"[{_ts(t + 20)} TP1] WARNING {HOSTILE[1]}")
    t += 95
    for rank in RANKS:
        out.append(
            f"[{_ts(t)} TP{rank}] Load weight end. type=DeepseekV4ForCausalLM, dtype=torch.bfloat16, avail mem=40.12 GB, mem usage=54.38 GB."
        )
    out.append(f"[{_ts(t)} TP0] Use triton as MoE runner backend.")
    t += 5
    for rank in RANKS:
        out.append(
            f"[{_ts(t)} TP{rank}] KV Cache is allocated. #tokens: 205312, K size: 8.12 GB, V size: 8.12 GB"
        )
        out.append(f"[{_ts(t)} TP{rank}] Memory pool end. avail mem=14.02 GB")
    t += 1
    for rank in RANKS:
        out.append(
            f"[{_ts(t)} TP{rank}] Capture cuda graph begin. This can take up to several minutes. avail mem=13.90 GB"
        )
    t += 20
    for rank in RANKS:
        out.append(
            f"[{_ts(t)} TP{rank}] Capture cuda graph end. Time elapsed: 20.21 s. mem usage=2.10 GB. avail mem=11.80 GB."
        )
    t += 8
    out.append(
        f"[{_ts(t)} TP0] DeepGemm is enabled but the scale_fmt of checkpoint is not ue8m0. This might cause accuracy degradation on Blackwell."
    )
    out.append(f"[{_ts(t)} TP0] Use flashinfer_trtllm_routed as MoE runner backend for NextN draft.")
    for rank in RANKS:
        out.append(
            f"[{_ts(t)} TP{rank}] Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2, 4, 8], avail mem=11.02 GB"
        )
    t += 1
    out += [
        f"[{_ts(t)} TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2890, in run_scheduler_process',
        "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)",
        '  File "/sgl-workspace/sglang/python/sglang/srt/speculative/eagle_worker_v2.py", line 402, in init_cuda_graphs',
        "    self.cuda_graph_runner = EAGLEDraftCudaGraphRunner(self)",
        '  File "/sgl-workspace/sglang/python/sglang/srt/models/deepseek_v4_nextn.py", line 188, in forward',
        "    hidden_states = self.decoder(positions, hidden_states, forward_batch)",
        '  File "/sgl-workspace/sglang/python/sglang/srt/models/deepseek_v4.py", line 702, in forward_mlp',
        "    return self.mlp(hidden_states)",
        '  File "/sgl-workspace/sglang/python/sglang/srt/layers/quantization/mxfp4_flashinfer_trtllm_moe.py", line 311, in apply',
        "    out = trtllm_fp4_block_scale_routed_moe(",
        "Exception: Capture cuda graph failed: Error in function 'trtllm_fp4_block_scale_routed_moe' at "
        "csrc/trtllm_fused_moe_kernel_launcher.cu:1320: MoE kernel requires 10.x architecture. Current device has SM 120",
        "",
        f"[{_ts(t)}] Received sigquit from a child process. It usually means the child failed.",
    ]
    return out


def seed_case_log(filler: int = 300) -> str:
    return "\n".join(seed_case_lines(filler)) + "\n"


def fixed_run_lines(decode_batches: int = 120) -> list[str]:
    """The same launch without speculative decoding and with an SM120 MoE runner: it serves, and the
    log carries SGLang's batch metrics."""
    lines = [
        line.replace(
            " --speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
            "",
        )
        .replace(
            "speculative_algorithm='EAGLE', speculative_num_steps=3, speculative_eagle_topk=1, "
            "speculative_num_draft_tokens=4, speculative_moe_runner_backend='triton', ",
            "",
        )
        .replace("--moe-runner-backend triton", "--moe-runner-backend flashinfer_cutlass")
        .replace("moe_runner_backend='triton'", "moe_runner_backend='flashinfer_cutlass'")
        .replace("Use triton as MoE runner backend.", "Use flashinfer_cutlass as MoE runner backend.")
        for line in seed_case_lines(filler=100)
    ]
    cut = next(i for i, line in enumerate(lines) if "DeepGemm is enabled" in line)
    lines = [line for line in lines[:cut] if "WARNING <" not in line]
    t = 200
    lines.append(f"[{_ts(t)}] The server is fired up and ready to roll!")
    for n in range(decode_batches):
        t += 2
        if n % 10 == 0:
            lines.append(
                f"[{_ts(t)} TP0] Prefill batch. #new-seq: 4, #new-token: 8192, #cached-token: 0, token usage: 0.0{n % 9}, "
                f"#running-req: {n % 32}, #queue-req: {max(0, n % 40 - 30)}, input throughput (token/s): {5200 + 13 * n:.2f}"
            )
        lines.append(
            f"[{_ts(t)} TP0] Decode batch. #running-req: {8 + n % 24}, #token: {4096 + 64 * n}, token usage: 0.{10 + n % 80:02d}, "
            f"cuda graph: True, gen throughput (token/s): {60 + (n * 7) % 25:.2f}, #queue-req: {max(0, n % 40 - 30)}"
        )
    return lines
