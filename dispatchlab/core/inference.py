"""The failure class when no signature explains a log, and the fingerprint that groups unknown crashes."""

from __future__ import annotations

import hashlib
import re

from dispatchlab.core.parse.model import ParsedLog

_INFER = [
    (
        "oom",
        re.compile(
            r"out of memory|OutOfMemoryError|OOM|Not enough memory|No available memory for the cache|exit code: -9|oom-kill|\bKilled\b",
            re.I,
        ),
    ),
    ("nccl_error", re.compile(r"NCCL|ProcessGroupNCCL|DistBackendError|ncclInternalError|Gloo", re.I)),
    (
        "compile_error",
        re.compile(
            r"CompilationError|ptxas|PTXASError|nvcc.*fail|Ninja build failed|torch\._inductor|triton\.compiler|TritonError|InductorError|JIT compil",
            re.I,
        ),
    ),
    (
        "dependency_error",
        re.compile(
            r"ModuleNotFoundError|ImportError|undefined symbol|No module named|version mismatch|cannot import name|is installed with version|libcuda|\.so[.:\d]* cannot open",
            re.I,
        ),
    ),
    (
        "arch_unsupported_kernel",
        re.compile(
            r"no kernel image is available|not supported (?:on|for) (?:this|the current) (?:GPU|architecture|device)|[Uu]nsupported (?:GPU )?arch|requires (?:SM|sm_?)\d+|compute capability .* not supported|sm_\d+ is not compatible",
            re.I,
        ),
    ),
    (
        "cuda_error",
        re.compile(
            r"CUDA error|illegal memory access|device-side assert|misaligned address|unspecified launch failure|cudaError|CUBLAS_STATUS|CUDNN_STATUS|HIP error|hipError|Segmentation fault|SIGSEGV|exit code -11",
            re.I,
        ),
    ),
    ("timeout_hang", re.compile(r"[Ww]atchdog|timed? ?out|Timeout|hang|deadlock|heartbeat", re.I)),
    (
        "weight_loading_error",
        re.compile(
            r"size mismatch|load_weights|weight_loader|safetensors|checkpoint|state_dict|Missing key|Unexpected key|shape mismatch|must match the size",
            re.I,
        ),
    ),
    (
        "config_error",
        re.compile(
            r"invalid choice|not supported|unsupported|is not a valid|must be|should be|ValueError|NotImplementedError|Unknown|unrecognized arguments|AssertionError",
            re.I,
        ),
    ),
    ("garbage_output", re.compile(r"!!!!!!!!|NaN logits|nan logits")),
]
# error kinds that report a failure without being it
_NOT_EVIDENCE = ("sigquit", "init_failed", "exception", "error")
_ERRORISH = re.compile(r"[Ee]rror|[Ff]ail|[Ee]xception")


def _crash_texts(parsed: ParsedLog) -> list[str]:
    crash = parsed.crash
    if crash is None:
        return []
    texts = [f"{crash.exception or ''}: {crash.message or ''}"]
    tb = parsed.traceback_at(crash.line)
    if tb:
        texts.extend(f"{c['exception']}: {c['message']}" for c in tb.chain)
        texts.append(" ".join(f"{f.file} {f.function}" for f in tb.frames[-6:]))
    return texts


def infer_failure_class(parsed: ParsedLog) -> str:
    crash = parsed.crash
    errors = parsed.errors
    texts = _crash_texts(parsed)
    # the parser marks what it did not take as fatal (warnings, children exiting after a requested stop)
    fatal_errors = [e for e in errors if e.fatal and e.kind not in _NOT_EVIDENCE]
    texts.extend(e.text for e in fatal_errors[:20])
    if not crash and not fatal_errors:
        if any(e.kind == "garbage_output" for e in errors):
            return "garbage_output"
        if parsed.outcome in ("serving", "ready") or not errors:
            return "none"
        texts.extend(e.text for e in errors[:20])
        if not any(e.kind == "error" and _ERRORISH.search(e.text) for e in errors):
            return "none"
    joined = "\n".join(texts)
    capture = crash is not None and crash.phase == "cuda_graph_capture"
    for failure_class, pattern in _INFER:
        if pattern.search(joined):
            return (
                "cuda_graph_capture_failure" if failure_class == "config_error" and capture else failure_class
            )
    return "cuda_graph_capture_failure" if capture else "other"


# ---------------------------------------------------------------- fingerprints
_APP_PACKAGES = re.compile(
    r"(?:^|/)((?:sglang|vllm|flashinfer|sgl_kernel|tensorrt_llm|deep_gemm|triton|aiter|lmdeploy)/[\w/]+\.py)$"
)
_NOISE = [
    (re.compile(r"0x[0-9a-fA-F]+"), "0x"),
    (re.compile(r"(?:/[\w.+-]+)+/?"), "/path"),
    (re.compile(r"\[[\d, ]+\]|\(\d+(?:, ?\d+)+\)|torch\.Size\([^)]*\)"), "<shape>"),
    (re.compile(r"\b(?:TP|DP|EP|PP|rank|Rank|pid|GPU|cuda:)\s*=?\s*\d+\b"), "<rank>"),
    (re.compile(r"\d+(?:\.\d+)?"), "#"),
    (re.compile(r"'[^']{40,}'|\"[^\"]{40,}\""), "'…'"),
    (re.compile(r"\s+"), " "),
]


def _normalise_text(text: str) -> str:
    for pattern, replacement in _NOISE:
        text = pattern.sub(replacement, text)
    return text.strip()[:240]


def _kernel_stem(name: str) -> str:
    return re.split(r"_t\d+x\d+", name)[0] if name.lower().startswith("bmm_") else re.sub(r"\d+", "#", name)


def fingerprint(parsed: ParsedLog, failure_class: str, best_id: str | None) -> str:
    """Stable across ranks, paths, addresses and shapes: the same crash on another run gets the same one."""
    crash = parsed.crash
    parts: list[str] = [failure_class]
    if crash:
        parts += [crash.exception or "", _normalise_text(crash.message or "")]
        tb = parsed.traceback_at(crash.line)
        for frame in tb.frames if tb else []:
            m = _APP_PACKAGES.search(frame.file.replace("\\", "/"))
            if m:
                parts.append(f"{m.group(1)}:{frame.function}")
    elif best_id:
        parts.append(best_id)
    else:
        first = next((e for e in parsed.errors if e.kind not in ("sigquit", "error")), None)
        if first:
            parts.append(_normalise_text(first.text))
    parts.extend(sorted({_kernel_stem(k) for k in parsed.kernels}))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
