"""The failure class when no signature explains a log, and the fingerprint that groups unknown crashes."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from dispatchlab.core.digest import sha256_hex
from dispatchlab.core.lazyre import lazy_compile
from dispatchlab.core.parse.model import Crash, ParsedLog, Traceback

if TYPE_CHECKING:
    from dispatchlab.core.terminal import TerminalDiagnosis

_ERRORISH = lazy_compile(r"[Ee]rror|[Ff]ail|[Ee]xception")


def classify(parsed: ParsedLog) -> tuple[str, TerminalDiagnosis | None]:
    """The failure class when no signature decides it, with the terminal diagnosis that found it."""
    crash = parsed.crash
    errors = parsed.errors
    # the parser marks what it did not take as fatal (warnings, children exiting after a requested stop)
    fatal = parsed.failure_evidence()
    all_errors = False
    if not crash and not fatal:
        if any(e.kind == "garbage_output" for e in errors):
            return "garbage_output", None
        if parsed.outcome in ("serving", "ready") or not errors:
            return "none", None
        if not any(e.kind == "error" and _ERRORISH.search(e.text) for e in errors):
            return "none", None
        all_errors = True  # no crash, but error lines that say something failed: read them all
    from dispatchlab.core.terminal import diagnose_terminal  # only when something failed

    diagnosis = diagnose_terminal(parsed, all_errors=all_errors)
    if diagnosis is not None:
        return diagnosis.failure_class, diagnosis
    capture = crash is not None and crash.phase == "cuda_graph_capture"
    return ("cuda_graph_capture_failure" if capture else "other"), None


# ---------------------------------------------------------------- fingerprints
_APP_PACKAGES = lazy_compile(
    r"(?:^|/)((?:sglang|vllm|flashinfer|sgl_kernel|tensorrt_llm|deep_gemm|triton|aiter|lmdeploy)/[\w/]+\.py)$"
)
_NOISE = [
    (lazy_compile(r"0x[0-9a-fA-F]+"), "0x"),
    (lazy_compile(r"(?:/[\w.+-]+)+/?"), "/path"),
    (lazy_compile(r"\[[\d, ]+\]|\(\d+(?:, ?\d+)+\)|torch\.Size\([^)]*\)"), "<shape>"),
    (lazy_compile(r"\b(?:TP|DP|EP|PP|rank|Rank|pid|GPU|cuda:)\s*=?\s*\d+\b"), "<rank>"),
    (lazy_compile(r"\d+(?:\.\d+)?"), "#"),
    (lazy_compile(r"'[^']{40,}'|\"[^\"]{40,}\""), "'…'"),
    (lazy_compile(r"\s+"), " "),
]


def _normalise_text(text: str) -> str:
    for pattern, replacement in _NOISE:
        text = pattern.sub(replacement, text)
    return text.strip()[:240]


def _kernel_stem(name: str) -> str:
    return re.split(r"_t\d+x\d+", name)[0] if name.lower().startswith("bmm_") else re.sub(r"\d+", "#", name)


def _crash_parts(crash: Crash, tb: Traceback | None) -> list[str]:
    parts = [crash.exception or "", _normalise_text(crash.message or "")]
    for frame in tb.frames if tb else []:
        m = _APP_PACKAGES.search(frame.file.replace("\\", "/"))
        if m:
            parts.append(f"{m.group(1)}:{frame.function}")
    return parts


def _digest(parts: list[str], kernels: Iterable[str]) -> str:
    parts = [*parts, *sorted({_kernel_stem(k) for k in kernels})]
    return sha256_hex("\n".join(parts).encode())[:16]


def fingerprint(parsed: ParsedLog, failure_class: str, best_id: str | None) -> str:
    """Stable across ranks, paths, addresses and shapes: the same crash on another run gets the same one.
    A file of several runs (a crash loop) is the last run's: earlier runs' lines are not in `parsed`'s
    crash, tracebacks or kernels, so N copies of one crash have the fingerprint of one copy."""
    crash = parsed.crash
    parts: list[str] = [failure_class]
    if crash:
        parts += _crash_parts(crash, parsed.traceback_at(crash.line))
    elif best_id:
        parts.append(best_id)
    else:
        first = next((e for e in parsed.errors if e.kind not in ("sigquit", "error")), None)
        if first:
            parts.append(_normalise_text(first.text))
    return _digest(parts, parsed.kernels)


def run_fingerprint(outcome: str, crash: Crash | None, tb: Traceback | None) -> str:
    """One run's ending, from the parse alone (no knowledge base): runs that ended the same way share it.
    Without kernels: the lines a restart prints before its banner still fall in the run before."""
    return _digest([outcome, *(_crash_parts(crash, tb) if crash else [])], ())
