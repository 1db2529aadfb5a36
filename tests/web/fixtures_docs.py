"""Hand-written match documents (docs/web-spec.md shape) for the page, figure and compare tests.

CRASH_DOC follows the seed case (DeepSeek-V4-Flash NVFP4 with an MXFP4 MTP draft on sm_120, TP4,
EAGLE): the draft's MoE resolves to the SM100-only TRT-LLM-gen kernel and CUDA graph capture crashes.
FIXED_DOC is the same launch without speculative decoding, serving with batch metrics.
VLLM_OOM_DOC has no timestamps (the timeline falls back to line numbers) and no draft model.
"""

from __future__ import annotations

import copy
from typing import Any

RANKS = ["TP0", "TP1", "TP2", "TP3"]
T0 = "2025-11-20T09:14:"


def _t(seconds: float) -> str:
    minutes, rest = divmod(seconds, 60)
    return f"2025-11-20T09:{14 + int(minutes):02d}:{rest:06.3f}"


def _phases(
    model: str, spans: list[tuple[str, int, int | None, float, float | None]]
) -> list[dict[str, Any]]:
    out = []
    for rank_index, rank in enumerate(RANKS):
        for name, start_line, end_line, start_s, end_s in spans:
            skew = rank_index * 0.2
            out.append(
                {
                    "rank": rank,
                    "model": model,
                    "name": name,
                    "start_line": start_line + rank_index,
                    "end_line": None if end_line is None else end_line + rank_index,
                    "start": _t(start_s + skew),
                    "end": None if end_s is None else _t(end_s + skew),
                    "seconds": None if end_s is None else round(end_s - start_s, 3),
                    "detail": "",
                }
            )
    return out


CRASH_MESSAGE = (
    "Error in function 'trtllm_fp4_block_scale_routed_moe': no kernel found for "
    "bmm_MxE4m3_MxE2m1E2m1_Fp32_t128x8x512u2_s4_et128x8_m128x8x64_cga1x1x1_16dp256b_TN_transOut_"
    "schedS_bN_dsFp8_biasFp32 (built for SM100: sm_100a, sm_103a)"
)

CRASH_DOC: dict[str, Any] = {
    "server": "sglang",
    "server_version": "0.5.6.dev2+gdsv4",
    "model": "/models/DeepSeek-V4-Flash-NVFP4",
    "gpu": {
        "name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        "arch": "sm_120",
        "count": 8,
        "compute_capability": "12.0",
    },
    "versions": {
        "sglang": "0.5.6.dev2+gdsv4",
        "vllm": None,
        "torch": "2.9.1+cu130",
        "cuda": "13.0",
        "driver": "580.95.05",
        "flashinfer": "0.5.3",
        "sgl_kernel": "0.3.18",
        "triton": "3.5.1",
    },
    "launch_command": (
        "python -m sglang.launch_server --model-path /models/DeepSeek-V4-Flash-NVFP4 --tp 4 "
        "--context-length 8192 --moe-runner-backend triton --speculative-algorithm EAGLE "
        "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
    ),
    "server_args": {
        "model_path": "/models/DeepSeek-V4-Flash-NVFP4",
        "tp_size": 4,
        "context_length": 8192,
        "quantization": None,
        "kv_cache_dtype": "auto",
        "attention_backend": "flashinfer",
        "moe_runner_backend": "triton",
        "speculative_algorithm": "EAGLE",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
        "speculative_moe_runner_backend": "triton",
        "mem_fraction_static": 0.85,
        "cuda_graph_max_bs": 64,
        "enable_torch_compile": False,
    },
    "backends": {
        "attention_backend": "flashinfer",
        "moe_runner_backend": "triton",
        "fp4_gemm_backend": "flashinfer_cutlass",
        "sampling_backend": "flashinfer",
        "quantization": "modelopt_fp4",
        "kv_cache_dtype": "auto",
    },
    "draft_backends": {
        "attention_backend": "flashinfer",
        "moe_runner_backend": "flashinfer_trtllm_routed",
        "quantization": "mxfp4",
        "kv_cache_dtype": "auto",
    },
    "backend_origins": {
        "attention_backend": {
            "value": "flashinfer",
            "source": "args",
            "line": 12,
            "text": "ServerArgs(... attention_backend='flashinfer' ...)",
        },
        "moe_runner_backend": {
            "value": "triton",
            "source": "flag",
            "line": 1,
            "text": "--moe-runner-backend triton",
        },
        "fp4_gemm_backend": {
            "value": "flashinfer_cutlass",
            "source": "default",
            "line": None,
            "text": None,
        },
        "sampling_backend": {"value": "flashinfer", "source": "default", "line": None, "text": None},
        "quantization": {
            "value": "modelopt_fp4",
            "source": "message",
            "line": 241,
            "text": "Detected nvfp4 checkpoint. Please note that the format is experimental",
        },
        "kv_cache_dtype": {"value": "auto", "source": "args", "line": 12, "text": "kv_cache_dtype='auto'"},
    },
    "draft_backend_origins": {
        "attention_backend": {"value": "flashinfer", "source": "default", "line": None, "text": None},
        "moe_runner_backend": {
            "value": "flashinfer_trtllm_routed",
            "source": "message",
            "line": 1388,
            "text": "[TP0] Mxfp4MoEMethod: using flashinfer_trtllm_routed for MXFP4 experts",
        },
        "quantization": {
            "value": "mxfp4",
            "source": "message",
            "line": 1376,
            "text": "[TP0] NextN draft layer: experts quantized as mxfp4",
        },
        "kv_cache_dtype": {"value": "auto", "source": "default", "line": None, "text": None},
    },
    "ranks": RANKS,
    "sources": [{"name": "dsv4-eagle-tp4.log", "first_line": 1, "line_count": 1520}],
    "line_count": 1520,
    "timeline": [
        {
            "line": 12,
            "time": _t(1.0),
            "rank": None,
            "model": None,
            "kind": "backend",
            "name": "attention_backend",
            "detail": "server_args=ServerArgs(model_path='/models/DeepSeek-V4-Flash-NVFP4', attention_backend='flashinfer', ...)",
        },
        {
            "line": 241,
            "time": _t(9.5),
            "rank": "TP0",
            "model": "main",
            "kind": "backend",
            "name": "quantization",
            "detail": "[TP0] Detected nvfp4 checkpoint. Please note that the format is experimental and subject to change.",
        },
        {
            "line": 1296,
            "time": _t(120.2),
            "rank": "TP0",
            "model": "main",
            "kind": "warning",
            "name": "deepgemm_scale_fmt",
            "detail": "[TP0] DeepGemm is enabled but the scale_fmt of checkpoint is not ue8m0. "
            "This might cause accuracy degradation on Blackwell.",
        },
        {
            "line": 1376,
            "time": _t(131.0),
            "rank": "TP0",
            "model": "draft",
            "kind": "backend",
            "name": "quantization",
            "detail": "[TP0] NextN draft layer: experts quantized as mxfp4",
        },
        {
            "line": 1388,
            "time": _t(131.4),
            "rank": "TP0",
            "model": "draft",
            "kind": "backend",
            "name": "moe_runner_backend",
            "detail": "[TP0] Mxfp4MoEMethod: using flashinfer_trtllm_routed for MXFP4 experts",
        },
        {
            "line": 1450,
            "time": _t(146.9),
            "rank": "TP0",
            "model": "draft",
            "kind": "error",
            "name": "scheduler_exception",
            "detail": "[TP0] Scheduler hit an exception: Traceback (most recent call last):",
        },
    ],
    "phases": _phases(
        "main",
        [
            ("init", 2, 200, 0.0, 8.1),
            ("weight_loading", 201, 1180, 8.1, 104.6),
            ("kv_cache", 1181, 1240, 104.6, 110.0),
            ("cuda_graph_capture", 1241, 1370, 110.0, 130.2),
        ],
    )
    + _phases(
        "draft",
        [
            ("weight_loading", 1371, 1400, 130.2, 138.8),
            ("cuda_graph_capture", 1401, None, 138.8, None),
        ],
    ),
    "metrics": {"points": [], "total": 0, "sampled_every": 1},
    "tracebacks": [
        {
            "line": 1451,
            "rank": "TP0",
            "ranks": RANKS,
            "count": 4,
            "exception": "RuntimeError",
            "message": CRASH_MESSAGE,
            "frames": [
                {
                    "file": "sglang/srt/managers/scheduler.py",
                    "line": 2890,
                    "function": "run_scheduler_process",
                },
                {
                    "file": "sglang/srt/speculative/eagle_worker.py",
                    "line": 140,
                    "function": "init_cuda_graphs",
                },
                {
                    "file": "sglang/srt/models/deepseek_v4_nextn.py",
                    "line": 211,
                    "function": "forward",
                },
                {"file": "sglang/srt/models/deepseek_v4.py", "line": 702, "function": "forward_mlp"},
                {
                    "file": "flashinfer/fused_moe/core.py",
                    "line": 1904,
                    "function": "trtllm_fp4_block_scale_routed_moe",
                },
            ],
        }
    ],
    "kernels": ["bmm_MxE4m3_MxE2m1E2m1_Fp32_t128x8x512u2_s4_et128x8_m128x8x64_cga1x1x1_16dp256b_TN_transOut"],
    "crash": {
        "line": 1450,
        "phase": "cuda_graph_capture",
        "exception": "RuntimeError",
        "message": CRASH_MESSAGE,
        "rank": "TP0",
        "ranks": RANKS,
        "model": "draft",
    },
    "outcome": "crashed",
    "matches": [
        {
            "id": "flashinfer-trtllm-moe-sm100-only",
            "title": "FlashInfer TRT-LLM-gen MoE kernel is built for SM100 only",
            "failure_class": "arch_unsupported_kernel",
            "confidence": 0.93,
            "severity": "high",
            "level": "failure",
            "explanation": (
                "The draft (NextN) layer's MXFP4 experts resolved to flashinfer_trtllm_routed, whose "
                "bmm_MxE4m3_MxE2m1 cubins exist for sm_100a/sm_103a only. On sm_120 the kernel lookup "
                "fails during CUDA graph capture of the draft model."
            ),
            "lines": [1388, 1450, 1466],
            "evidence": [
                {
                    "line": 1388,
                    "text": "[TP0] Mxfp4MoEMethod: using flashinfer_trtllm_routed for MXFP4 experts",
                },
                {
                    "line": 1450,
                    "text": "[TP0] Scheduler hit an exception: Traceback (most recent call last):",
                },
                {"line": 1466, "text": "RuntimeError: " + CRASH_MESSAGE},
            ],
            "facts": {"kernel": "bmm_MxE4m3_MxE2m1", "built_for": "sm_100a, sm_103a", "gpu_arch": "sm_120"},
            "fix": {
                "summary": "Run without MTP on sm_120 for this checkpoint (the draft's MXFP4 dispatch has no sm_120 path), or use a BF16 draft.",
                "args": {"speculative_algorithm": None, "speculative_num_steps": None},
                "env": {},
                "tried_and_failed": [
                    "--speculative-moe-runner-backend triton: same crash; the MXFP4 quant method picks its kernel below the runner setting"
                ],
            },
            "references": ["https://github.com/flashinfer-ai/flashinfer/issues/1234"],
            "decisions": ["mtp-blocked-sm120"],
        },
        {
            "id": "deepgemm-scale-fmt-not-ue8m0",
            "title": "DeepGemm on Blackwell with a non-ue8m0 checkpoint",
            "failure_class": "config_error",
            "confidence": 0.41,
            "severity": "low",
            "level": "warning",
            "explanation": "DeepGemm expects ue8m0 scales on Blackwell; other formats can degrade accuracy.",
            "lines": [1296],
            "evidence": [
                {
                    "line": 1296,
                    "text": "[TP0] DeepGemm is enabled but the scale_fmt of checkpoint is not ue8m0.",
                }
            ],
            "facts": {},
            "fix": {
                "summary": "Disable DeepGemm for this checkpoint.",
                "args": {},
                "env": {"SGLANG_ENABLE_JIT_DEEPGEMM": "0"},
                "tried_and_failed": [],
            },
            "references": [],
            "decisions": [],
        },
    ],
    "failure_class": "arch_unsupported_kernel",
    "fingerprint": "7f3a9c2e41d05b86",
    "kb_digest": "kb-3c1e0a9",
}


def _fixed_doc() -> dict[str, Any]:
    doc = copy.deepcopy(CRASH_DOC)
    doc["server_args"] = {k: v for k, v in doc["server_args"].items() if not k.startswith("speculative")}
    doc["launch_command"] = (
        "python -m sglang.launch_server --model-path /models/DeepSeek-V4-Flash-NVFP4 --tp 4 "
        "--context-length 8192 --moe-runner-backend triton"
    )
    doc["draft_backends"] = {}
    doc["draft_backend_origins"] = {}
    doc["versions"]["flashinfer"] = "0.5.3"
    doc["timeline"] = [e for e in doc["timeline"] if e["model"] != "draft"]
    doc["phases"] = [p for p in doc["phases"] if p["model"] == "main"] + _phases(
        "main", [("warmup", 1371, 1390, 130.2, 133.0), ("serving", 1391, None, 133.0, None)]
    )
    # the fixed run captured graphs a little faster
    for phase in doc["phases"]:
        if phase["name"] == "cuda_graph_capture":
            phase["seconds"] = 18.4
    points = []
    for i in range(60):
        points.append(
            {
                "line": 1400 + 10 * i,
                "time": _t(140 + 5 * i),
                "rank": "TP0",
                "kind": "decode",
                "gen_throughput": 180.0 + 25 * (i % 7),
                "input_throughput": None,
                "running": 8 + i % 24,
                "queued": max(0, (i % 24) - 16),
                "token_usage": round(0.05 + i / 200, 3),
            }
        )
        if i % 6 == 0:
            points.append(
                {
                    "line": 1405 + 10 * i,
                    "time": _t(142 + 5 * i),
                    "rank": "TP0",
                    "kind": "prefill",
                    "gen_throughput": None,
                    "input_throughput": 5200.0 + 90 * i,
                    "running": 8 + i % 24,
                    "queued": 0,
                    "token_usage": round(0.05 + i / 200, 3),
                }
            )
    doc["metrics"] = {"points": points, "total": len(points), "sampled_every": 1}
    doc["tracebacks"] = []
    doc["kernels"] = []
    doc["crash"] = None
    doc["outcome"] = "serving"
    doc["matches"] = []
    doc["failure_class"] = "none"
    doc["fingerprint"] = "0000000000000000"
    doc["sources"] = [{"name": "dsv4-tp4-no-mtp.log", "first_line": 1, "line_count": 2100}]
    doc["line_count"] = 2100
    return doc


FIXED_DOC: dict[str, Any] = _fixed_doc()

VLLM_OOM_DOC: dict[str, Any] = {
    "server": "vllm",
    "server_version": "0.11.2",
    "model": "Qwen/Qwen3-235B-A22B-FP8",
    "gpu": {"name": "NVIDIA H100 80GB HBM3", "arch": "sm_90", "count": 4, "compute_capability": "9.0"},
    "versions": {
        "sglang": None,
        "vllm": "0.11.2",
        "torch": "2.9.0+cu128",
        "cuda": "12.8",
        "driver": None,
        "flashinfer": None,
        "sgl_kernel": None,
        "triton": "3.5.0",
    },
    "launch_command": None,
    "server_args": {"tensor_parallel_size": 4, "gpu_memory_utilization": 0.95, "max_model_len": 131072},
    "backends": {"attention_backend": "FLASH_ATTN", "quantization": "fp8", "kv_cache_dtype": "auto"},
    "draft_backends": {},
    "backend_origins": {
        "attention_backend": {
            "value": "FLASH_ATTN",
            "source": "message",
            "line": 88,
            "text": "(VllmWorker rank=0) INFO Using Flash Attention backend on V1 engine.",
        }
    },
    "draft_backend_origins": {},
    "ranks": ["rank0", "rank1", "rank2", "rank3"],
    "sources": [
        {"name": "api_server.log", "first_line": 1, "line_count": 300},
        {"name": "worker.log.gz", "first_line": 301, "line_count": 250},
    ],
    "line_count": 550,
    "timeline": [
        {
            "line": 88,
            "time": None,
            "rank": "rank0",
            "model": "main",
            "kind": "backend",
            "name": "attention_backend",
            "detail": "Using Flash Attention backend on V1 engine.",
        },
        {
            "line": 512,
            "time": None,
            "rank": "rank2",
            "model": "main",
            "kind": "error",
            "name": "oom",
            "detail": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB.",
        },
    ],
    "phases": [
        {
            "rank": None,
            "model": "main",
            "name": "init",
            "start_line": 1,
            "end_line": 90,
            "start": None,
            "end": None,
            "seconds": None,
            "detail": "",
        },
        {
            "rank": None,
            "model": "main",
            "name": "weight_loading",
            "start_line": 91,
            "end_line": 480,
            "start": None,
            "end": None,
            "seconds": 212.5,
            "detail": "",
        },
        {
            "rank": None,
            "model": "main",
            "name": "kv_cache",
            "start_line": 481,
            "end_line": None,
            "start": None,
            "end": None,
            "seconds": None,
            "detail": "",
        },
    ],
    "metrics": {"points": [], "total": 0, "sampled_every": 1},
    "tracebacks": [
        {
            "line": 498,
            "rank": "rank2",
            "ranks": ["rank2"],
            "count": 1,
            "exception": "torch.OutOfMemoryError",
            "message": "CUDA out of memory. Tried to allocate 1.75 GiB. GPU 2 has a total capacity of 79.19 GiB",
            "frames": [
                {"file": "vllm/worker/gpu_worker.py", "line": 233, "function": "determine_available_memory"}
            ],
        }
    ],
    "kernels": [],
    "crash": {
        "line": 512,
        "phase": "kv_cache",
        "exception": "torch.OutOfMemoryError",
        "message": "CUDA out of memory. Tried to allocate 1.75 GiB.",
        "rank": "rank2",
        "ranks": ["rank2"],
        "model": "main",
    },
    "outcome": "crashed",
    "matches": [
        {
            "id": "oom-kv-cache-profile",
            "title": "Out of GPU memory while profiling the KV cache",
            "failure_class": "oom",
            "confidence": 0.88,
            "severity": "high",
            "level": "failure",
            "explanation": "gpu_memory_utilization 0.95 leaves no room for activations at max_model_len 131072.",
            "lines": [512],
            "evidence": [{"line": 512, "text": "torch.OutOfMemoryError: CUDA out of memory."}],
            "facts": {},
            "fix": {
                "summary": "Lower gpu_memory_utilization or max_model_len.",
                "args": {"gpu_memory_utilization": 0.9, "max_model_len": 32768},
                "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                "tried_and_failed": [],
            },
            "references": [],
            "decisions": [],
        }
    ],
    "failure_class": "oom",
    "fingerprint": "c0ffee00d15ea5e5",
    "kb_digest": "kb-3c1e0a9",
}

XSS = "<script>alert(1)</script><img src=x onerror=alert(2)>"


def hostile_doc() -> dict[str, Any]:
    """A document whose every user-controlled string tries to inject markup."""
    doc = copy.deepcopy(CRASH_DOC)
    doc["model"] = XSS
    doc["server_version"] = XSS
    doc["gpu"]["name"] = XSS
    doc["launch_command"] = XSS
    doc["crash"]["message"] = XSS
    doc["crash"]["exception"] = XSS
    doc["backends"]["attention_backend"] = XSS
    doc["backend_origins"]["attention_backend"]["text"] = XSS
    doc["timeline"][0]["detail"] = XSS
    doc["sources"][0]["name"] = XSS
    doc["tracebacks"][0]["message"] = XSS
    doc["tracebacks"][0]["frames"][0]["function"] = XSS
    match = doc["matches"][0]
    match["title"] = XSS
    match["explanation"] = XSS
    match["fix"]["summary"] = XSS
    match["fix"]["tried_and_failed"] = [XSS]
    match["fix"]["args"] = {"attention_backend": XSS}
    match["evidence"][0]["text"] = XSS
    match["references"] = ["javascript:alert(3)"]
    return doc
