"""Failures: Python tracebacks (chained, per process), error lines, requested stops, kernels, warnings."""

from __future__ import annotations

import re
from typing import ClassVar

from dispatchlab.core.lazyre import lazy_compile
from dispatchlab.core.parse.extract import Hits
from dispatchlab.core.parse.lineformat import Line
from dispatchlab.core.parse.model import ErrorLine, Event, Frame, Traceback
from dispatchlab.core.parse.observations import FatalLine, Observations
from dispatchlab.core.parse.vocabulary import (
    MAX_ERRORS,
    MAX_FRAMES,
    MAX_KERNELS,
    MAX_MESSAGE,
    MAX_TRACEBACKS,
    MAX_WARNING_EVENTS,
    without_numbers,
)
from dispatchlab.core.records import field, record

STOP_EXIT_CODES = {"-15", "-2", "143", "130"}
_TB_TERM = (
    r"^(?P<exc>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure|Fault)|Exception|"
    r"(?:Base)?ExceptionGroup|KeyboardInterrupt|AssertionError|StopIteration)(?::\s?(?P<msg>.*))?$"
)
_SIGNAL = (
    r"[Cc]aught signal (?P<sig>\d+)|[Rr]eceived signal (?P<sig2>\d+)|[Ss]ignal (?P<sig3>\d+) \((?P<name>SIG\w+)\) received|"
    r"(?P<name2>SIGSEGV|SIGABRT|SIGBUS|SIGFPE|SIGKILL)\b"
)
# an operator's stop; a plain "Shutting down" also follows crashes, so it is not one
_STOP = (
    r"SIGTERM received|Received SIGTERM|SIGINT received|Received SIGINT|[Rr]eceived signal (?:2|15)\b|"
    r"Gracefully stopping|Application shutdown complete|Finished server process"
)
_KERNEL_NAME = (
    r"\b[Bb]mm_[A-Za-z0-9]+_\w+|\btrtllm_\w+|\bfmhaSm\d+\w*Kernel\w*|\w+\.cubin\b|\b\w+_kernel\b|"
    r"\bcutlass_\w+|\b\w*(?:Fmha|Gemm|Moe|MoE)Runner\b|\bErrorin function '\w+'|Error in function '(?P<func>\w+)'"
)
_WARNING = (
    r"^(?:WARNING|WARN)\b|\S+\.py:\d+: \w*Warning: |DeepGemm is enabled but the scale_fmt|"
    r"is deprecated|may cause|might cause|is not supported|not recommended|[Ff]alling back|fallback to"
)
# error kinds outside tracebacks, most specific first
_ERROR_KINDS = (
    "cg_failed",
    "compile_failed",
    "arch_refused",
    "cuda_error",
    "device_assert",
    "nccl_error",
    "oom",
    "fatal_py",
    "cpp_abort",
    "died_init",
    "subproc_crash",
    "watchdog",
    "stall",
    "waiting",
    "killed",
    "signal",
    "exit_code",
    "init_failed",
    "vllm_engine_failed",
    "sigquit",
    "garbage_output",
    "exception_quoted",
)
# what a line says without being the failure itself
_NOT_FATAL_KINDS = {
    "error",
    "sigquit",
    "garbage_output",
    "init_failed",
    "vllm_engine_failed",
    "exception",
    "request_error",
    "waiting",  # fatal only when the log ends on it (see _waiting_at_end)
}
# A request that failed while the server went on serving: the OpenAI handlers log it, the client gets a 4xx.
_REQUEST_LOGGER = lazy_compile(
    r"\b(?:serving_chat|serving_completion|serving_engine|serving_responses|serving_embedding|serving_tokenization|"
    r"serving_transcription|chat_utils)\.py:\d+\]"
)


def request_logged(raw: str) -> bool:
    """The line is the request layer's own log line (its `file.py:N]` prefix): a request failed."""
    return ".py:" in raw and _REQUEST_LOGGER.search(raw) is not None


_REQUEST_FRAME = lazy_compile(
    r"^(?:create_chat_completion|create_completion|_preprocess_chat|_preprocess_completion|generate_request|"
    r"handle_generate_request|v1_chat_completions|v1_completions|openai_v1_\w+|_handle_batch_request|"
    r"chat_completion_stream_generator|_tokenize_prompt_inputs?|render_chat_request|create_responses|"
    # SGLang's OpenAI serving base (entrypoints/openai/serving_base.py): one request's handler
    r"_handle_non_streaming_request|_handle_streaming_request|_build_chat_response)$"
)


def _over_names(pattern: str | bytes) -> re.Pattern[str]:
    """A `^...$` pattern of one function name, searched over names each after a newline: the newline it
    starts with lets the search skip from one name to the next (a `^` under re.M was tried at every offset)."""
    assert isinstance(pattern, str) and pattern.startswith("^") and pattern.endswith("$")
    return lazy_compile(r"\n(" + pattern[1:-1] + r")(?=\n|\Z)")


_REQUEST_FRAMES = _over_names(_REQUEST_FRAME.pattern)
# what every name _REQUEST_FRAME and KERNEL_FUNC take holds one of (tests/core/test_failures_names.py): the
# regexes, tried at each name, are searched only over a traceback whose names hold one
REQUEST_PIECES = (
    "create_",
    "_preprocess_",
    "generate_request",
    "v1_",
    "_handle_",
    "chat_completion",
    "_tokenize_prompt_input",
    "render_chat_request",
    "_build_chat_response",
)
KERNEL_PIECES = ("trtllm_", "mm_", "_kernel", "cutlass_", "fmha", "_moe", "flashinfer_", "_gemm")
_REQUEST_TEXT_RULE = (
    r"Error in request|Error in preprocessing prompt inputs|BadRequestError|[Ii]nvalid request|"
    r"maximum context length is \d+ tokens|Error in (?:chat|completion) request"
)
_REQUEST_TEXT = lazy_compile(_REQUEST_TEXT_RULE)
_AFTER_STOP_KINDS = {"killed", "signal", "exit_code", "subproc_crash", "died_init"}
_ERROR_RULES = frozenset({"tb_term", "error_level", "cuda_error", "nccl_error", "oom"})
# a GPU that faulted, and the stall reports that a fault makes other ranks print while they wait for it
_HARD_FAULT_KINDS = frozenset({"cuda_error", "device_assert"})
_STALL_KINDS = frozenset({"watchdog", "stall", "waiting"})
# a process reporting that it is still waiting for its peers: a hang when nothing else follows (vLLM's and
# SGLang's shared-memory broadcast ring, a router polling workers that do not answer)
_WAITING_RULE = r"No available (?:shared memory broadcast )?block found in \d+ seconds?|health check is pending with error"
_WAITING = lazy_compile(_WAITING_RULE)
# What a log may go on printing while its engine hangs: access-log answers (status polls, health probes)
# and the wait reports themselves. Anything else after the last wait report is progress.
_IDLE_LINE = lazy_compile(
    r"\"(?:GET|POST|PUT|DELETE|PATCH|HEAD|OPTIONS) \S+ HTTP/\d(?:\.\d)?\" \d{3}\b|^\s*$|\[\.\.\. not retrieved \.\.\.\]"
)
_FATAL_SIGNAL = lazy_compile(r"SIG(?:SEGV|ABRT|BUS|FPE|KILL|ILL)|signal (?:4|6|7|8|9|11)\b")
_NCCL_CHATTER = lazy_compile(r"NCCL (?:WARN|INFO)")

KERNEL_FUNC = lazy_compile(
    r"^(?:trtllm_\w+|[Bb]mm_\w+|\w+_kernel|cutlass_\w+|fmha\w*|\w*_moe|flashinfer_\w+|\w+_gemm\w*)$"
)
_KERNEL_FUNCS = _over_names(KERNEL_FUNC.pattern)
KERNEL_TEXT = lazy_compile(
    r"\b[Bb]mm_[A-Za-z0-9]+_[A-Za-z0-9_]+|\btrtllm_[a-z0-9_]+|\bfmhaSm\d+\w*Kernel\w*|\b[\w-]+\.cubin\b|"
    r"\b[a-z0-9_]+_kernel\b|\bcutlass_[a-z0-9_]+|\b[A-Z]\w*(?:Fmha|Gemm|Moe|MoE)\w*Runner\b"
)
NOT_KERNELS = {
    "sgl_kernel",
    "jit_kernel",
    "triton_kernel",
    "triton_kernels",
    "common_ops",
    "flashinfer_kernel",
}
ERRORISH = lazy_compile(
    r"[Ee]rror|[Ee]xception|[Ff]ail|[Uu]nsupported|not supported|[Aa]ssert|[Ff]atal|No kernel|no kernel|requires"
)


# a piece of each of ERRORISH's alternatives: a text without any of them is not errorish
ERRORISH_PIECES = (
    "rror",
    "xception",
    "ail",
    "nsupported",
    "not supported",
    "ssert",
    "atal",
    "o kernel",
    "requires",
)


def is_errorish(msg: str) -> bool:
    # substring tests of a piece of each alternative (ERRORISH_PIECES, unrolled) first: the alternation, tried
    # at every offset of a line, cost a traceback flood's 100,000 frames seconds
    return (
        "rror" in msg
        or "xception" in msg
        or "ail" in msg
        or "nsupported" in msg
        or "not supported" in msg
        or "ssert" in msg
        or "atal" in msg
        or "o kernel" in msg
        or "requires" in msg
    ) and ERRORISH.search(msg) is not None


def _printed_again(entry: Traceback | ErrorLine, rank: str | None) -> None:
    """The same failure from another rank (or the same one again): count it, note the rank."""
    entry.count += 1
    if rank and rank not in entry.ranks:
        entry.ranks.append(rank)


@record
class _OpenTraceback:
    tb: Traceback
    chained: list[dict[str, str]] = field(default_factory=list)
    ignored: bool = False  # printed under "Exception ignored in": not fatal
    finished: bool = False  # the exception line was seen
    chained_pending: bool = False  # a "During handling..." line followed it
    request: bool = False  # printed by a request handler: one request failed, not the server


class Failures:
    RULES: ClassVar[dict[str, str]] = {
        "exc_head": r"^(?P<comp>Scheduler|DetokenizerManager|TokenizerManager|DataParallelController|TpModelWorker|\w+) hit an exception: (?P<first>.*)$",
        "tb_start": r"Traceback \(most recent call last\):",
        "tb_frame": r"^\s*File \"(?P<file>[^\"]+)\", line (?P<line>\d+), in (?P<func>[^\s]+)",
        "exc_ignored": r"^Exception ignored in",
        "tb_chain": (
            r"^\s*(?:The above exception was the direct cause of the following exception:|"
            r"During handling of the above exception, another exception occurred:)"
        ),
        "tb_term": _TB_TERM,
        "cpp_abort": r"^terminate called after throwing an instance of '(?P<type>[^']+)'|^\s*what\(\):\s+(?P<what>.*)$",
        "fatal_py": r"^Fatal Python error: (?P<what>.+)$",
        "signal": _SIGNAL,
        "exit_code": r"exit(?:ed)? (?:with )?(?:code|status)[: ]+(?P<code>-?\d+)|exitcode\s*:\s*(?P<code2>-?\d+)",
        "killed": r"^Killed$|Killed process \d+|oom-kill|Out of memory: Killed",
        "stop_request": _STOP,
        "sigquit": r"^Received sigquit from a child process|^SIGQUIT received\.",
        "died_init": r"Rank (?P<rank>\d+) scheduler died during initialization \(exit code: (?P<code>-?\d+)\)",
        "subproc_crash": r"^Subprocess (?P<name>\S+) \(pid=(?P<pid>\d+)\) crashed with exit code (?P<code>-?\d+)",
        "init_failed": r"Initialization failed\. (?:Please see the error messages above\.|warmup error: )",
        "watchdog": r"(?:\w+ )?[Ww]atchdog timeout \(self\.watchdog_timeout=|Watchdog caught collective operation timeout",
        # a liveness check that gave up on a process: a server's health check or heartbeat, a router or a
        # proxy waiting for its workers (SGLang http_server, sglang_router, llama-swap-like proxies, torch c10d)
        "stall": (
            r"Health check failed\. Server couldn't get a response from \w+|"
            r"[Hh]ealth ?check (?:failed|timed out) after \d+(?:\.\d+)? ?(?:s|ms|seconds?)\b|"
            r"Timeout \d+s waiting for workers? .{0,200}to become healthy|"
            r"Heartbeat monitor timed out!|watchdog got stuck for \d+ seconds without making progress"
        ),
        "waiting": _WAITING_RULE,
        "cg_failed": r"Capture (?:[\w-]+ )*(?:cuda|CUDA|cpu) graph failed: (?P<inner>.*)$",
        "cuda_error": (
            r"CUDA error: (?P<what>[^\n]*)|CUDA_ERROR_\w+|cudaError\w+|CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+|HIP error: (?P<hip>.*)|"
            r"hipError\w+|GPU page fault|VM_L2_PROTECTION_FAULT|NVRM: Xid|\[HIP error\]|"
            # the ROCm runtime's own report of a GPU fault (no Python exception follows: the process aborts)
            r"Memory access fault by GPU node|HW Exception by GPU node|HSA_STATUS_ERROR_(?:EXCEPTION|MEMORY_APERTURE_VIOLATION)|"
            # a CUDA runtime error string printed by a kernel's own check: `gemm.cu 64 - invalid argument`
            r"\.cuh?:? ?\d+ ?[-:] ?(?:invalid argument|an illegal memory access|misaligned address|"
            r"unspecified launch failure|invalid device function|out of memory)"
        ),
        "device_assert": r"device-side assert|Assertion `.*` failed|^Assertion failed: |Assertion failed\.",
        "nccl_error": r"NCCL (?:error|WARN)|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ncclRemoteError|ProcessGroupNCCL.*(?:[Tt]imeout|error)|DistBackendError|"
        # NVSHMEM (DeepEP's transport between GPUs and nodes) failing to set up or used before it did
        r"nvshmem setup connections failed|NVSHMEM API called before NVSHMEM initialization|"
        r"nvshmem/src/\S+:\d+: non-zero status",
        "oom": (
            r"out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|Not enough memory\. Please try to increase|"
            r"insufficient GPU memory|No available memory for the cache blocks"
        ),
        "vllm_engine_failed": (
            r"EngineCore failed to start|Engine core initialization failed|EngineCore encountered (?:a fatal error|an issue)|"
            r"WorkerProc (?:failed|hit an exception)|died unexpectedly"
        ),
        "error_level": r"^(?:ERROR|CRITICAL|FATAL)\b|\[E\] |\bFATAL\b",
        "warning_line": _WARNING,
        "kernel_name": _KERNEL_NAME,
        "garbage_output": r"!!!!!!!!|\b(?:nan|NaN) (?:logits|values?|in logits)|logits contain (?:nan|NaN|inf)",
        "request_error": _REQUEST_TEXT_RULE,
        # a library refusing this GPU, in its own words, with or without an exception around it
        "arch_refused": (
            r"not supported (?:in|on|for) (?:this|the current|your) (?:architecture|GPU|device|arch)|"
            r"[Uu]nsupported (?:GPU |gpu |CUDA )?architecture|No supported CUDA architectures? found|"
            r"no kernel image is available for execution on the device|"
            # "no kernel for capability 120, required capability 100", "only supports Ampere GPUs or newer"
            r"[Nn]o (?:\w+ )?kernels? (?:found |available )?for (?:compute |CUDA )?capability|"
            r"[Rr]equired (?:compute |CUDA )?capability[ :=]+\d|only supports? \w+ GPUs? or newer"
        ),
        # an exception quoted in the middle of a line (a pasted note, `# Error 1: RuntimeError: ...`)
        "exception_quoted": r"[\s#:>\]]\(?(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): \S",
        # a JIT build that failed: the compiler's own words, before any Python traceback
        "compile_failed": (
            r"\d+ errors? detected in the compilation of|ptxas (?:fatal|error)\b|nvcc (?:fatal|error)\b|"
            r"ninja: build stopped|^FAILED: \S+\.(?:o|so)\b|Error building extension|error: command '\S+' failed|"
            # a C/C++/HIP compiler or LLVM stopping on its own, with no Python traceback around it
            r"\bfatal error: \S.*(?:No such file or directory|file not found)|^compilation terminated\.|"
            r"\d+ errors? generated(?: when compiling for \w+)?\.|^LLVM ERROR: |internal compiler error|"
            r"Failures have been detected while processing an MLIR pass pipeline|ptxas\b.*\berror\s*: |"
            r"failed build jit \["
        ),
        # an access-log answer other than 200 OK (those are routine): the server is up and answering
        "http_answer": r"\"(?:GET|POST|PUT|DELETE|PATCH|HEAD|OPTIONS) \S+ HTTP/\d(?:\.\d)?\" (?P<status>[13-5]\d\d|2[1-9]\d|20[1-9])\b",
    }
    # what Hyperscan scans for these (every line they match, found by a literal): their own forms begin with
    # classes that match anywhere (`\w*` before "Error", `\S+` before "HTTP"), which cost a quarter of a scan
    GATES: ClassVar[dict[str, str]] = {
        "exception_quoted": r"(?:Error|Exception): \S",
        "http_answer": r"HTTP/\d(?:\.\d)?\" (?:[13-5]\d\d|2[1-9]\d|20[1-9])",
    }
    READS: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, obs: Observations) -> None:
        self.obs = obs
        self.open: dict[str | None, _OpenTraceback] = {}
        self.seen: dict[tuple[str, str, tuple[str, ...]], Traceback] = {}
        self.ignore_next: dict[str | None, bool] = {}
        self.warnings_seen: set[str] = set()

    def handle(self, line: Line, hits: Hits, following: bytes) -> bool:
        if not self._traceback_line(line, hits):
            self._error_line(line, hits)
        if "kernel_name" in hits or "tb_frame" in hits:
            self._kernels(line, hits)
        if "warning_line" in hits and not (hits.keys() & _ERROR_RULES):
            self._warning(line)
        return False

    def frame_line(self, line: Line, frame: re.Match[str]) -> None:
        """`handle` of a line whose only hit of this extractor's rules is tb_frame."""
        self._frame(line, line.rank, frame)
        if is_errorish(line.msg):  # what _kernels first asks of a frame
            self._kernels(line, {"tb_frame": frame})

    def finish(self) -> None:
        for key in list(self.open):
            self._close(key)
        self._waiting_at_end()
        self._fault_after_stall()

    def _waiting_at_end(self) -> None:
        """Wait reports ("no shared-memory block for 60 s", "worker health check pending") also come from a
        slow compile or warmup that then goes on; a log that ends on them, with nothing but the reports and
        access-log answers after the last one, shows a process that stopped making progress."""
        obs = self.obs
        waiting = [e for e in obs.errors.values() if e.kind == "waiting"]
        if not waiting or obs.tracebacks or obs.stop_line is not None:
            return
        tail = obs.tail.decode("utf-8", errors="replace").splitlines()
        last = max((i for i, raw in enumerate(tail) if _WAITING.search(raw)), default=-1)
        if not all(_IDLE_LINE.search(raw) for raw in tail[last + 1 :]):
            return
        for entry in waiting:
            entry.fatal = True
            obs.fatal_lines.append(FatalLine(entry.line, entry.rank, entry.kind, entry.text))
        obs.fatal_lines.sort(key=lambda f: f.line)

    def _fault_after_stall(self) -> None:
        """A watchdog that fired before a hard GPU fault reported the stall the fault caused: the fault is
        the failure, so the watchdog line stops being fatal evidence (it stays on the timeline)."""
        obs = self.obs
        faults = [f.line for f in obs.fatal_lines if f.kind in _HARD_FAULT_KINDS]
        if not faults:
            return
        last_fault = max(faults)
        stalls = {f.line for f in obs.fatal_lines if f.kind in _STALL_KINDS and f.line < last_fault}
        if not stalls:
            return
        obs.fatal_lines = [f for f in obs.fatal_lines if f.line not in stalls]
        for entry in obs.errors.values():
            if entry.line in stalls:
                entry.fatal = False

    # ---------------------------------------------------------------- tracebacks
    def _traceback_line(self, line: Line, hits: Hits) -> bool:
        """Feed a traceback's start, frames, chain marks and exception line; True when the line was one."""
        key = line.rank
        if "tb_start" in hits:
            self._start(line, key)
            if "exc_head" in hits:
                self.obs.event(line, "error", "exception", line.msg[:300])
            return True
        if "exc_ignored" in hits:
            # "Exception ignored in: <function X.__del__>": CPython printed and swallowed it
            self.ignore_next[key] = True
            return True
        if "tb_chain" in hits:
            if key in self.open:
                self.open[key].chained_pending = True
            return True
        if "tb_frame" in hits:
            self._frame(line, key, hits["tb_frame"])
            return True
        if "tb_term" in hits and not line.msg.startswith((" ", "\t")):
            self._exception(line, key, hits["tb_term"])
            return True
        return False

    def _start(self, line: Line, key: str | None) -> None:
        current = self.open.get(key)
        chain: list[dict[str, str]] = []
        tb = Traceback(line=line.number, rank=line.rank or key, exception="", message="")
        if current is not None and current.chained_pending and current.tb.exception:
            # "During handling ... / The above exception ...": the new traceback continues this one
            chain = [*current.chained, {"exception": current.tb.exception, "message": current.tb.message}]
            tb.line = current.tb.line
            tb.frames = list(current.tb.frames)  # the cause's frames say where it really broke
            self.ignore_next[key] = current.ignored
            self.open.pop(key)
        elif current is not None:
            self._close(key)
        request = request_logged(line.raw)
        self.open[key] = _OpenTraceback(tb, chain, ignored=self.ignore_next.pop(key, False), request=request)

    def _frame(self, line: Line, key: str | None, g: re.Match[str]) -> None:
        current = self.open.get(key)
        if current is None or current.finished:
            if current is not None:
                self._close(key)
            current = self.open[key] = _OpenTraceback(
                Traceback(line=line.number, rank=line.rank or key, exception="", message="")
            )
        current.request = current.request or request_logged(line.raw)
        if len(current.tb.frames) < MAX_FRAMES:
            file, number, function = g.group("file", "line", "func")
            current.tb.frames.append(Frame(file, int(number), function))

    def _exception(self, line: Line, key: str | None, g: re.Match[str]) -> None:
        exc, text = g.group("exc"), (g.group("msg") or "").strip()
        current = self.open.get(key)
        if current is None:
            tb = Traceback(line=line.number, rank=line.rank or key, exception=exc, message=text[:MAX_MESSAGE])
            tb.end_line = line.number
            request = request_logged(line.raw) or bool(_REQUEST_TEXT.search(text))
            self.open[key] = _OpenTraceback(tb, finished=True, request=request)
        elif not current.finished:
            current.request = current.request or request_logged(line.raw)
            current.tb.exception = exc
            current.tb.message = text[:MAX_MESSAGE]
            current.tb.end_line = line.number
            current.finished = True
        # else: the same exception printed again (Python 3.11 notes, logger.exception): keep the first

    def _close(self, key: str | None) -> None:
        current = self.open.pop(key, None)
        if current is None:
            return
        tb = current.tb
        if current.ignored:
            self.obs.ignored_traceback_lines.add(tb.line)
        if not tb.exception:
            if not tb.frames:
                return
            tb.exception = "(traceback cut off)"
        tb.chain = current.chained
        # the frames' functions, each after a newline: each test below is one search, not one match per frame
        functions = "".join(["\n" + f.function for f in tb.frames])
        request = current.request or (
            any(piece in functions for piece in REQUEST_PIECES)
            and _REQUEST_FRAMES.search(functions) is not None
        )
        if request:
            self._request_failed(tb.line)
        signature = (
            tb.exception,
            without_numbers(tb.message, 200),
            tuple(f"{f.file.rsplit('/', 1)[-1]}:{f.function}" for f in tb.frames[-12:]),
        )
        seen = self.seen.get(signature)
        if seen is not None:
            _printed_again(seen, tb.rank)
            return
        if tb.rank:
            tb.ranks = [tb.rank]
        obs = self.obs
        if len(obs.tracebacks) < MAX_TRACEBACKS:
            obs.tracebacks.append(tb)
            self.seen[signature] = tb
            detail = f"{tb.exception}: {tb.message[:250]}"
            kind = "warning" if request else "error"
            obs.timeline.append(Event(tb.line, None, tb.rank, kind, "traceback", detail, None))
        else:
            obs.tracebacks_omitted += 1
        if any(piece in functions for piece in KERNEL_PIECES):
            for kernel in _KERNEL_FUNCS.finditer(functions):
                self._kernel(kernel.group(1))

    def _request_failed(self, line: int) -> None:
        """One request failed and the server answered it: proof of serving, not a crash."""
        self.obs.request_error_lines.add(line)
        if self.obs.served_line is None or line < self.obs.served_line:
            self.obs.served_line = line

    # ---------------------------------------------------------------- error lines
    def _error_kind(self, line: Line, hits: Hits) -> str | None:
        kind = next((name for name in _ERROR_KINDS if name in hits), None)
        if kind is None:
            kind = "error" if "error_level" in hits else "exception" if "exc_head" in hits else None
        if kind in ("exit_code", "subproc_crash"):
            g = hits[kind]
            code = g.group("code") or (g.group("code2") if kind == "exit_code" else None)
            if code in ("0", None):
                return None
            if code in STOP_EXIT_CODES and self.obs.stop_line is not None:
                # the operator stopped the server (SIGTERM / Ctrl-C): children exit with the signal
                return None
        if kind == "signal" and not _FATAL_SIGNAL.search(line.msg):
            return None
        if "request_error" in hits or (kind in ("error", "exception") and request_logged(line.raw)):
            return "request_error"
        return kind

    def _error_line(self, line: Line, hits: Hits) -> None:
        if "http_answer" in hits:
            if self.obs.served_line is None:
                self.obs.served_line = line.number
            if hits["http_answer"].group("status").startswith("5"):
                self.obs.event(line, "warning", "http_error", line.msg[:300])
            return
        if "stop_request" in hits:
            self.obs.stop_line = self.obs.stop_line or line.number
            self.obs.milestone(line, "stop_requested", line.msg[:300])
            return
        kind = self._error_kind(line, hits)
        if kind == "request_error":
            self._request_failed(line.number)
        if kind is not None:
            self._error(line, kind)

    def _error(self, line: Line, kind: str) -> None:
        obs = self.obs
        text = line.msg.strip()
        norm = without_numbers(text, 300)
        entry = obs.errors.get(norm)
        if entry is not None:
            _printed_again(entry, line.rank)
            return
        fatal = kind not in _NOT_FATAL_KINDS
        if line.level in ("WARNING", "INFO", "DEBUG") or _NCCL_CHATTER.search(text):
            fatal = False  # a warning that mentions OOM or a failed NCCL transport is not the failure itself
        if obs.stop_line is not None and kind in _AFTER_STOP_KINDS:
            fatal = False  # children dying after the operator stopped the server
        if len(obs.errors) < MAX_ERRORS:
            ranks = [line.rank] if line.rank else []
            obs.errors[norm] = ErrorLine(
                line.number, line.rank, ranks, kind, text[:MAX_MESSAGE], 1, line.time, fatal
            )
        else:  # a flood of different error lines: the first ones are listed, the rest counted
            obs.errors_omitted += 1
        if fatal or kind == "garbage_output":
            obs.fatal_lines.append(FatalLine(line.number, line.rank, kind, text))
        obs.event(line, "error", kind, text[:300])

    # ---------------------------------------------------------------- kernels and warnings
    def _kernels(self, line: Line, hits: Hits) -> None:
        msg = line.msg
        errorish = is_errorish(msg)
        if "tb_frame" in hits and not errorish:
            return
        if not (line.rank in self.open or errorish or line.level in ("ERROR", "CRITICAL")):
            return
        for km in KERNEL_TEXT.finditer(msg):
            before, after = msg[max(0, km.start() - 1) : km.start()], msg[km.end() : km.end() + 1]
            if before in ('"', "/") or (before == "." and after != "("):
                continue  # a path, a quoted file name or a module (`flashinfer.jit.x_kernel`), not a kernel
            self._kernel(km.group(0))

    def _kernel(self, name: str) -> None:
        if name not in NOT_KERNELS and len(self.obs.kernels) < MAX_KERNELS:
            self.obs.kernels.setdefault(name, None)

    def _warning(self, line: Line) -> None:
        if line.level in ("INFO", "DEBUG") and not re.search(r"Warning|DeepGemm|deprecated", line.msg):
            return
        obs = self.obs
        obs.warnings_count += 1
        norm = without_numbers(line.msg, 200)
        if norm in self.warnings_seen:
            return
        self.warnings_seen.add(norm)
        if len(self.warnings_seen) <= MAX_WARNING_EVENTS:
            obs.event(line, "warning", "warning", line.msg[:300])
