"""When no signature explains a crash, diagnose the terminal exception itself.

The exception's type and message, its chained causes, the frames it went through, the phase it happened
in and the fatal lines printed around it say what kind of failure it was: a JIT toolchain step, a kernel
runner's assertion, a GPU fault, an import inside the server, a checkpoint that does not fit the model,
arguments refused at startup. The result reads like a signature's card (what, why, what to try) with the
evidence lines, so an unknown crash gets a useful top diagnosis instead of a wrapper's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from dispatchlab.core.diagnosis import Evidence, Fix, Match
from dispatchlab.core.parse.model import ParsedLog

_COMPILE = re.compile(
    r"ptxas\b|\bnvcc\b|CompilationError|PTXASError|Ninja build failed|ninja: build stopped|Error building extension|"
    r"errors? detected in the compilation of|CalledProcessError: Command '\[?'?\S*(?:ninja|nvcc|ptxas|c\+\+|g\+\+|cc)\b|"
    r"triton\.compiler|torch\._inductor|InductorError|BackendCompilerFailed|JIT compil|cpp_extension|"
    r"flashinfer[/.]jit|deep_gemm[/.]jit|failed to compile|compilation failed|"
    # a C/C++/HIP compiler or LLVM that stopped on its own: no Python exception names it
    r"\bfatal error: |compilation terminated|\d+ errors? generated|LLVM ERROR|internal compiler error|"
    r"MLIR pass pipeline|failed build jit",
    re.I,
)
_ARCH_REFUSED = re.compile(
    r"is not defined for option 'gpu-name'|[Uu]nsupported (?:gpu |GPU |CUDA )?arch(?:itecture)?\b|(?:sm|compute)_\d+a?\b[^.\n]{0,40}not supported|"
    r"(?:arch(?:itecture)?|SM|GPU|device|dtype)[^.\n]{0,40}(?:is |are )?not supported|not supported (?:on|in|for) (?:this|the current|your) "
    r"(?:GPU|device|arch)|requires (?:SM|sm_?|compute capability )\d+|except on [^.\n]*Arch|only supports? (?:SM|sm_?)\d+|"
    r"no kernel image is available|hipErrorNoBinaryForGpu|invalid device function|"
    r"[Nn]o (?:\w+ )?kernels? (?:found |available )?for (?:compute |CUDA )?capability|"
    r"[Rr]equired (?:compute |CUDA )?capability[ :=]+\d|only supports? \w+ GPUs? or newer",
)
# The toolchain itself cannot generate code for the GPU (or read the PTX it was given): ptxas/nvcc older than the
# arch or than the compiler that wrote the PTX. The build fails whatever kernel it builds: compile_error. A kernel
# or library that refuses the GPU it runs on (no kernel image, "requires SM90") is arch_unsupported_kernel.
_TOOLCHAIN_REFUSED = re.compile(
    r"is not defined for option 'gpu-name'|Unsupported gpu architecture '|fatal\s*: Unsupported \.version \d"
)
# A missing header decides between two classes: the top-level header of a package the build depends on (a
# development package or toolkit that is not installed) is a dependency; any other header (one of the
# source tree, or a toolkit's internal file its own release should ship) is a build that does not fit.
_PACKAGE_HEADER_MISSING = re.compile(
    r"fatal error: ['\"<]?(?:Python|cuda|cuda_runtime|cuda_runtime_api|cuda_fp8|cuda_bf16|cublas\w*|cusparse\w*|"
    r"curand\w*|cudnn\w*|nccl|rccl|numa|mpi|nvml|hip/hip_runtime|infiniband/verbs)\.h['\">]?: "
    r"(?:No such file or directory|file not found)"
)
_RUNNER_ASSERT = re.compile(
    r"\[TensorRT-LLM\]\[ERROR\] Assertion failed|Error in function '\w+'|Assertion failed: "
)
_GPU_FAULT = re.compile(
    r"CUDA error|illegal memory access|device-side assert|misaligned address|unspecified launch failure|cudaError\w*|"
    r"CUBLAS_STATUS|CUDNN_STATUS|HIP error|hipError\w+|GPU page fault|VM_L2_PROTECTION_FAULT|\bXid\b|"
    r"Memory access fault by GPU|HW Exception by GPU|HSA_STATUS_ERROR\w*|hardware exception|"
    r"Segmentation fault|SIGSEGV|exit code -11|\.cuh?:? ?\d+ ?[-:] ?(?:invalid argument|invalid device function)",
    re.I,
)
_IMPORT = re.compile(
    r"ModuleNotFoundError|ImportError|No module named|cannot import name|partially initialized module|undefined symbol|"
    r"is installed with version|\.so[.:\d]* cannot open|version mismatch|libcuda",
    re.I,
)
_WEIGHT_FRAME = re.compile(
    r"load_weights|weight_loader|load_model|model_loader|safetensors|load_state_dict|_load_\w*weight"
)
_WEIGHT_TEXT = re.compile(
    r"size mismatch|shape mismatch|must match the size|Missing key|Unexpected key|checkpoint|safetensors|state_dict|"
    r"\bKeyError\b|weight",
    re.I,
)
_CONFIG_FRAME = re.compile(
    r"server_args\.py|arg_utils\.py|/config\.py|argparse|__post_init__|check_server_args|_verify_|_handle_|"
    r"parse_args|cli_args|cli/main\.py"
)
_CONFIG_TEXT = re.compile(
    r"invalid choice|unrecognized arguments|is not a valid|must be|should be|not supported|unsupported|is required|"
    r"ValidationError|validation errors? for \w+|\[type=[a-z_]+, input_value=|expected one argument|Unknown",
    re.I,
)
_OOM = re.compile(
    r"out of memory|OutOfMemoryError|\bOOM\b|Not enough memory|No available memory for the cache|exit code: -9|oom-kill|\bKilled\b|"
    # the memory left for the KV cache came out negative: the weights and activations took it all
    r"insufficient GPU memory|KV cache\b[^\n]{0,60}?-\d+(?:\.\d+)? ?[GM]i?B",
    re.I,
)
_NCCL = re.compile(r"NCCL|ProcessGroupNCCL|DistBackendError|ncclInternalError|\bGloo\b|NVSHMEM", re.I)
_HANG = re.compile(
    r"[Ww]atchdog|timed? ?out|Timeout|\bhang\b|deadlock|heartbeat|"
    # liveness checks and wait reports (failures.py `stall`, `waiting`): a process stopped answering its peers
    r"[Hh]ealth ?check (?:failed|is pending)|No available (?:shared memory broadcast )?block found",
    re.I,
)


@dataclass(frozen=True)
class Failure:
    """What the classifier reads: the terminal exception and the fatal lines around it, as text."""

    exception: str
    message: str
    causes: str  # chained exceptions
    frames: str  # "file function" of the crash's traceback
    lines: str  # fatal error lines of the log
    phase: str | None

    @property
    def text(self) -> str:
        return "\n".join((f"{self.exception}: {self.message}", self.causes, self.lines))

    @property
    def everything(self) -> str:
        return f"{self.text}\n{self.frames}"


@dataclass(frozen=True)
class TerminalDiagnosis:
    failure_class: str
    title: str
    explanation: str
    fix: str
    lines: list[int]


def _failure(parsed: ParsedLog, *, all_errors: bool) -> Failure | None:
    crash = parsed.crash
    fatal = parsed.errors if all_errors else parsed.failure_evidence()
    if crash is None and not fatal:
        return None
    tb = parsed.traceback_at(crash.line) if crash else None
    return Failure(
        exception=(crash.exception or "") if crash else "",
        message=(crash.message or "") if crash else "",
        causes="\n".join(f"{c['exception']}: {c['message']}" for c in tb.chain) if tb else "",
        frames=" ".join(f"{f.file} {f.function}" for f in tb.frames[-12:]) if tb else "",
        lines="\n".join(e.text for e in fatal[:20]),
        phase=crash.phase if crash else None,
    )


def _short(exception: str) -> str:
    return exception.rsplit(".", 1)[-1]


# (class, title, explanation, what to try, test): the first that holds decides
_Rule = tuple[str, str, str, str, Callable[[Failure], bool]]
RULES: list[_Rule] = [
    (
        "oom",
        "Out of GPU (or host) memory",
        "An allocation failed, or the kernel's OOM killer stopped the process.",
        "Give the KV cache less memory ({kv_memory}) or the model more GPUs; find which phase allocated last.",
        lambda f: bool(_OOM.search(f.text)),
    ),
    (
        "nccl_error",
        "A collective between ranks failed (NCCL)",
        "NCCL or the process group reported an error: a peer died, a link or transport failed, or a rank timed out.",
        "Re-run with NCCL_DEBUG=INFO to see the transport each pair chose; check the first rank that failed.",
        lambda f: bool(_NCCL.search(f.text)),
    ),
    (
        "compile_error",
        "The compiler toolchain cannot build for this GPU (ptxas/nvcc too old)",
        "ptxas or nvcc does not know this GPU's architecture, or the PTX version a newer compiler wrote: the toolkit "
        "is older than the GPU or than the compiler (Triton) in front of it, so no kernel can be built.",
        "Use a CUDA toolkit (and the Triton/PyTorch built for it) that supports this GPU, or point TRITON_PTXAS_PATH "
        "and CUDA_HOME at the newer toolkit.",
        lambda f: bool(_TOOLCHAIN_REFUSED.search(f.text)),
    ),
    (
        "arch_unsupported_kernel",
        "A JIT compile refused this GPU's architecture",
        "The toolchain (ptxas/nvcc) or the kernel library does not support the arch or dtype it was asked to compile for.",
        "Use a CUDA toolkit and kernel library release that support this arch, or a backend that does.",
        lambda f: bool(_COMPILE.search(f.everything) and _ARCH_REFUSED.search(f.text)),
    ),
    (
        "dependency_error",
        "A build needs a package's headers that are not installed",
        "The compiler stopped at an `#include` of a package's own header (Python, the CUDA toolkit, NCCL, cuDNN, "
        "NUMA, MPI): the package or its development files are missing from the build environment, so nothing is "
        "wrong with the code being built.",
        "Install the development package that provides the header (python3-dev, the CUDA toolkit, libnuma-dev ...) "
        "or point CUDA_HOME / CPATH at it, then rebuild.",
        lambda f: bool(_PACKAGE_HEADER_MISSING.search(f.text)),
    ),
    (
        "compile_error",
        "A JIT/toolchain step failed (ptxas, nvcc, ninja, Triton or Inductor)",
        "A kernel is compiled on first use; the compiler or the build returned non-zero, so the kernel does not exist.",
        "Read the first compiler error above the traceback; check the CUDA toolkit version, clear the JIT cache and "
        "retry, or pick a backend that ships prebuilt kernels.",
        lambda f: bool(_COMPILE.search(f.everything)),
    ),
    (
        "arch_unsupported_kernel",
        "A kernel runner refused this GPU's architecture",
        "A C++ kernel runner asserted that the kernel cannot run on this GPU architecture.",
        "Choose a backend built for this arch (see the compatibility matrix), or run on a supported GPU.",
        lambda f: bool(_RUNNER_ASSERT.search(f.text) and _ARCH_REFUSED.search(f.text)),
    ),
    (
        "arch_unsupported_kernel",
        "No kernel for this GPU's architecture",
        "The library has no kernel image for this arch, or says the arch is not supported.",
        "Choose a backend built for this arch (see the compatibility matrix), or a build of the library that targets it.",
        lambda f: bool(_ARCH_REFUSED.search(f.text)),
    ),
    (
        "cuda_error",
        "A kernel failed on the GPU (runner assertion, CUDA/HIP error or GPU fault)",
        "A kernel runner's assertion, a CUDA/HIP error or a GPU page fault: the kernel ran and failed.",
        "Re-run with CUDA_LAUNCH_BLOCKING=1 to find the kernel; try another backend for the op named in the traceback.",
        lambda f: bool(_RUNNER_ASSERT.search(f.text) or _GPU_FAULT.search(f.text)),
    ),
    (
        "dependency_error",
        "An import failed inside the server",
        "A module the server needs is missing, was built for another version (undefined symbol), or imports in a cycle.",
        "Check the versions of the server, torch and the kernel packages against each other; reinstall the one the "
        "message names.",
        lambda f: (
            _short(f.exception) in ("ImportError", "ModuleNotFoundError") or bool(_IMPORT.search(f.text))
        ),
    ),
    (
        "weight_loading_error",
        "The checkpoint does not fit the model while loading weights",
        "A tensor is missing, unexpected or of another shape than the model code expects: checkpoint, model code and "
        "quantization disagree.",
        "Check the checkpoint matches the model class and quantization the server picked; update the server if the "
        "model is newer than it.",
        lambda f: (
            bool(
                (_WEIGHT_FRAME.search(f.frames) or f.phase == "weight_loading")
                and _WEIGHT_TEXT.search(f.everything)
            )
            or bool(re.search(r"size mismatch|must match the size of tensor", f.text))
        ),
    ),
    (
        "timeout_hang",
        "A watchdog or timeout fired",
        "Something stopped making progress: a collective, a scheduler step or a worker.",
        "Find the rank that stopped first; raise the watchdog timeout only after knowing why it hung.",
        lambda f: bool(_HANG.search(f.text)),
    ),
    (
        "garbage_output",
        "The model answered nonsense",
        "NaN logits or a collapse to token 0 (`!!!!`): a kernel computes wrong numbers without failing.",
        "Switch the backend of the op that changed last (MoE, attention, GEMM) and compare answers.",
        lambda f: bool(re.search(r"!!!!!!!!|NaN logits|nan logits", f.text)),
    ),
    (
        "config_error",
        "The server refused its arguments or configuration at startup",
        "Argument validation rejected a flag, a value or a combination of them before the model was loaded.",
        "Read the message: it names the flag or value; check it against this release's --help.",
        lambda f: bool(
            _CONFIG_TEXT.search(f.text)
            or (
                _short(f.exception) in ("ValueError", "NotImplementedError", "AssertionError")
                and _CONFIG_FRAME.search(f.frames)
            )
        ),
    ),
]


def diagnose_terminal(parsed: ParsedLog, *, all_errors: bool = False) -> TerminalDiagnosis | None:
    """The kind of failure the terminal exception (or the fatal lines; with `all_errors`, every error line)
    show, or None when nothing failed or nothing here recognises it."""
    failure = _failure(parsed, all_errors=all_errors)
    if failure is None:
        return None
    for failure_class, title, explanation, fix, test in RULES:
        if test(failure):
            if failure_class == "config_error" and failure.phase == "cuda_graph_capture":
                failure_class = "cuda_graph_capture_failure"
            return TerminalDiagnosis(failure_class, title, explanation, fix, evidence_lines(parsed))
    return None


def evidence_lines(parsed: ParsedLog) -> list[int]:
    """The crash's line first (the line every view names for it), then the fatal error lines in order."""
    crash = parsed.crash
    lines = [crash.pointer] if crash is not None else []
    lines += sorted({e.line for e in parsed.failure_evidence()[:5]} - set(lines))
    return lines


# what the fix says differs by server: each names its own flags
_SERVER_WORDS = {
    "sglang": {"{kv_memory}": "--mem-fraction-static", "{eager}": "--disable-cuda-graph"},
    "vllm": {"{kv_memory}": "--gpu-memory-utilization", "{eager}": "--enforce-eager"},
}


def _for_server(text: str, server: str) -> str:
    for word, flag in _SERVER_WORDS.get(server, {}).items():
        text = text.replace(word, f"`{flag}`")
    return text.replace("{kv_memory}", "the KV cache memory fraction").replace("{eager}", "eager mode")


def terminal_match(parsed: ParsedLog, diagnosis: TerminalDiagnosis) -> Match:
    """The terminal diagnosis as a card like a signature's: what, why, what to try, and the evidence."""
    crash = parsed.crash
    evidence: list[Evidence] = []
    if crash is not None:
        text = f"{crash.exception or 'fatal'}: {crash.message}".strip()
        evidence.append(Evidence(crash.pointer, crash.rank, text[:500]))
    shown = {e.line for e in evidence}
    evidence += [
        Evidence(e.line, e.rank, e.text[:500]) for e in parsed.failure_evidence() if e.line not in shown
    ][:5]
    facts = {"exception": crash.exception, "phase": crash.phase, "model": crash.model} if crash else {}
    exception = f" ({_short(crash.exception)})" if crash and crash.exception else ""
    explanation = diagnosis.explanation
    if crash is not None:
        explanation += f"\n\nThe terminal exception, line {evidence[0].line}: `{evidence[0].text[:300]}`"
    return Match(
        id=f"terminal-{diagnosis.failure_class.replace('_', '-')}",
        title=diagnosis.title + exception,
        failure_class=diagnosis.failure_class,
        confidence=0.6 if crash is not None and crash.exception else 0.45,
        lines=[e.line for e in evidence],
        facts={k: v for k, v in facts.items() if v},
        fix=Fix(summary=_for_server(diagnosis.fix, parsed.server), args={}, env={}, tried_and_failed=[]),
        severity="error",
        level="failure",
        explanation=explanation,
        references=[],
        evidence=evidence,
        source="exception",
    )
