"""Which server this was, with which arguments and model, on which GPUs."""

from __future__ import annotations

import re
from typing import Any

from dispatchlab.core import arch as archmod
from dispatchlab.core.lazyre import lazy_compile
from dispatchlab.core.parse.model import Gpu, Traceback
from dispatchlab.core.parse.observations import Observations
from dispatchlab.core.serverargs import canonical_sglang_flag

_MODULE_MENTION = {
    "sglang": lazy_compile(r"\bsglang[./](?:srt|launch_server)|\bsglang\.launch_server\b"),
    "vllm": lazy_compile(r"\bvllm[./](?:entrypoints|engine|v1|model_executor|worker|config)"),
    "tensorrt_llm": lazy_compile(r"\btensorrt_llm\b|\[TensorRT-LLM\]"),
}


def _engine_from_frames(tracebacks: list[Traceback]) -> str:
    for engine in ("sglang", "vllm", "tensorrt_llm"):
        if any(engine in f.file for tb in tracebacks for f in tb.frames):
            return engine
    return ""


def _engine_from_mentions(obs: Observations) -> str:
    """An excerpt without prefixes or frames may still name the server's modules in its messages."""
    texts = [tb.message for tb in obs.tracebacks] + [e.text for e in obs.errors.values()]
    texts += [e.detail for e in obs.timeline]
    joined = "\n".join(texts)
    for engine, pattern in _MODULE_MENTION.items():
        if pattern.search(joined):
            return engine
    return ""


def decide_engine(obs: Observations) -> str | None:
    """The framework that wrote the log: prefixes and dumps vote, frames and versions break a tie."""
    votes = obs.server_votes
    best = max(votes, key=lambda k: votes[k])
    if votes[best] == 0:
        best = _engine_from_frames(obs.tracebacks) or _engine_from_mentions(obs)
    if not best:
        best = "sglang" if obs.versions.get("sglang") else "vllm" if obs.versions.get("vllm") else ""
    return best or None


def server_args(obs: Observations, server: str) -> dict[str, Any]:
    """The args dump, with vLLM's non-default args and the launch command's flags filling gaps."""
    args = dict(obs.server_args)
    if server == "vllm":
        args.update(obs.vllm_args)
    for key, value in obs.launch_args.items():
        args.setdefault(canonical_sglang_flag(key) if server == "sglang" else key, value)
    return args


def model_name(obs: Observations, args: dict[str, Any]) -> str | None:
    model = args.get("model_path") or args.get("model") or obs.model
    if isinstance(model, str) and model:
        return model
    if obs.model:
        return obs.model
    loaded = next((e.detail for e in obs.timeline if e.name == "weights_end"), None)
    cls = re.search(r"type=(\w+)", loaded or "")
    return cls.group(1) if cls else None


def _gpu_count_from_args(args: dict[str, Any]) -> int | None:
    tp = args.get("tp_size") or args.get("tensor_parallel_size") or args.get("tp")
    dp = args.get("dp_size") or args.get("data_parallel_size") or 1
    pp = args.get("pp_size") or args.get("pipeline_parallel_size") or 1
    if isinstance(tp, int) and isinstance(dp, int) and isinstance(pp, int):
        # DP attention splits the TP group's GPUs; plain DP replicates them
        return tp * pp * (1 if args.get("enable_dp_attention") else dp)
    return None


def decide_gpu(obs: Observations, args: dict[str, Any]) -> Gpu:
    gpu = Gpu(name=obs.arch_gpu_name, arch=obs.arch)
    strength = obs.arch_strength
    names = obs.gpu_names
    if names:
        first = names[min(names)]
        gpu.name = first
        gpu.count = len(names)
        arch = archmod.arch_from_gpu_name(first) if strength < 4 else None
        if arch and (strength < 3 or arch.startswith("gfx")):
            gpu.arch = arch
    if obs.gpu_ccs:
        cc = obs.gpu_ccs[min(obs.gpu_ccs)]
        gpu.compute_capability = cc
        rocm = obs.rocm or bool(names and archmod.ROCM_NAME.search(names[min(names)]))
        gpu.arch = archmod.arch_from_capability(cc, rocm=rocm) or gpu.arch
        if gpu.count is None:
            gpu.count = len(obs.gpu_ccs)
    if gpu.arch and not gpu.compute_capability:
        gpu.compute_capability = archmod.capability_of(gpu.arch)
    if gpu.count is None:
        gpu.count = _gpu_count_from_args(args)
    return gpu
