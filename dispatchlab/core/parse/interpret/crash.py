"""Where the server died: the one place the crash is decided (from tracebacks and fatal lines, or from a
known fatal line the knowledge base recognised when the log holds nothing else)."""

from __future__ import annotations

import re

from dispatchlab.core.lazyre import lazy_compile
from dispatchlab.core.parse.model import Crash, Event, Frame, PhaseSpan
from dispatchlab.core.parse.observations import Observations
from dispatchlab.core.parse.vocabulary import (
    MAX_MESSAGE,
    MILESTONE_PHASE,
    PROGRESS_MILESTONES,
    Phase,
    rank_sort_key,
)
from dispatchlab.core.records import record

WRAPPER_EXCEPTIONS = lazy_compile(
    r"Engine core initialization failed|EngineDeadError|EngineCore encountered an issue|"
    r"Initialization failed\.|scheduler died during initialization|Worker failed with error|"
    r"^SystemExit$|^KeyboardInterrupt$|ChildProcessError|^(?:Base)?ExceptionGroup\b"
)
DRAFT_FRAME = lazy_compile(
    r"speculative/|eagle_worker|eagle_draft|draft_|_nextn|nextn\.py|mtp|EagleDraft|multi_layer_eagle", re.I
)
CAPTURE_FRAME = lazy_compile(r"cuda_graph|capture|CudaGraphRunner|graph_runner", re.I)
LOAD_FRAME = lazy_compile(
    r"load_model|load_weights|model_loader|get_quant_method|create_weights|process_weights_after_loading|weight_loader"
)
KV_FRAME = lazy_compile(
    r"init_memory_pool|alloc_memory_pool|KVCacheConfigurator|profile_max_num_token|kv_cache|determine_available_memory|initialize_kv_cache"
)
RUNTIME_FRAME = lazy_compile(
    r"forward_extend|forward_decode|run_batch|event_loop|execute_model|step_with_batch_queue|_process_input_queue"
)
_CAPTURE_FAILED = lazy_compile(r"Capture (?:[\w-]+ )*(?:cuda|CUDA|cpu) graph failed: (.*)")
_GROUP = lazy_compile(r"(?:Base)?ExceptionGroup$")


@record(frozen=True, slots=True)
class Candidate:
    line: int
    rank: str | None
    exception: str
    message: str
    frames: list[Frame]
    ranks: list[str]

    def is_wrapper(self) -> bool:
        return bool(WRAPPER_EXCEPTIONS.search(f"{self.exception} {self.message}"))


def _candidates(obs: Observations) -> list[Candidate]:
    found = [
        Candidate(
            tb.line,
            tb.rank,
            "" if tb.exception == "(traceback cut off)" else tb.exception,
            tb.message,
            tb.frames,
            tb.ranks,
        )
        for tb in obs.tracebacks
    ]
    found += [
        Candidate(f.line, f.rank, "", f.text, [], [f.rank] if f.rank else [])
        for f in obs.fatal_lines
        if f.kind != "garbage_output"
    ]
    return sorted(found, key=lambda c: c.line)


def _survived(obs: Observations, candidate: Candidate) -> bool:
    """A traceback or error the server lived through, or that only reports a requested stop."""
    if candidate.line in obs.ignored_traceback_lines or candidate.exception in (
        "KeyboardInterrupt",
        "SystemExit",
    ):
        return True
    if candidate.line in obs.request_error_lines:
        return True  # one request failed; the server answered it and went on
    if obs.stop_line is not None and candidate.line > obs.stop_line:
        return True
    if obs.metric_points and obs.metric_points[-1]["line"] > candidate.line:
        return True  # batch statistics after it: the server kept serving
    return any(
        m.line > candidate.line
        and m.name in PROGRESS_MILESTONES
        and (m.rank == candidate.rank or candidate.rank is None)
        for m in obs.milestones
    )


def _phase_from_milestones(obs: Observations, line: int, rank: str | None) -> tuple[str | None, str]:
    relevant = [
        m for m in obs.milestones if m.line < line and (rank is None or m.rank in (rank, None) or not m.rank)
    ]
    if not relevant:
        relevant = [m for m in obs.milestones if m.line < line]
    phase: str | None = None
    model = "main"
    for milestone in relevant:
        if milestone.name in MILESTONE_PHASE:
            phase = MILESTONE_PHASE[milestone.name]
            if milestone.name == "cuda_graph_begin":
                model = milestone.model
            elif milestone.name != "cuda_graph_end":
                model = "main"
    if obs.ready_line and line > obs.ready_line:
        phase = Phase.SERVING
    if obs.first_decode_line and line > obs.first_decode_line and phase in (None, Phase.WARMUP):
        phase = Phase.SERVING
    return phase, model


def phase_at(
    obs: Observations, line: int, rank: str | None, frames: list[Frame]
) -> tuple[str | None, str | None]:
    """The phase and model (main / draft) a failure at this line happened in: milestones, then frames."""
    phase, model = _phase_from_milestones(obs, line, rank)
    if frames:
        funcs = " ".join(f"{f.file} {f.function}" for f in frames)
        if CAPTURE_FRAME.search(funcs):
            phase = Phase.CUDA_GRAPH_CAPTURE
        elif LOAD_FRAME.search(funcs) and phase in (None, Phase.INIT, Phase.WEIGHT_LOADING, Phase.KV_CACHE):
            phase = Phase.WEIGHT_LOADING
        elif KV_FRAME.search(funcs) and phase in (None, Phase.INIT, Phase.KV_CACHE, Phase.WEIGHT_LOADING):
            phase = Phase.KV_CACHE
        elif RUNTIME_FRAME.search(funcs) and phase in (None, Phase.WARMUP, Phase.SERVING):
            phase = phase or Phase.SERVING
        if DRAFT_FRAME.search(funcs):
            model = "draft"
    if phase is None and obs.milestones:
        phase = Phase.INIT
    return (str(phase) if phase else None), (model if phase is not None or frames else None)


def _choose(candidates: list[Candidate]) -> Candidate:
    real = [c for c in candidates if not c.is_wrapper()]
    with_exception = [c for c in real if c.exception]
    # first rank to fail: the earliest exception; error lines only when no traceback explains the failure
    if with_exception:
        return with_exception[0]
    if real:
        return real[0]
    # an exception group only contains the failure: a sub-exception, even a wrapper, says more
    return next((c for c in candidates if not _GROUP.match(c.exception)), candidates[0])


def decide_crash(obs: Observations) -> Crash | None:
    """The failure the server died of, or None when it lived through everything it printed."""
    candidates = [c for c in _candidates(obs) if not _survived(obs, c)]
    if obs.ready_line is not None:
        candidates = [c for c in candidates if c.line > obs.ready_line]
    if not candidates:
        return None
    chosen = _choose(candidates)
    exception, message = chosen.exception, chosen.message
    crash_tb = next((t for t in obs.tracebacks if t.line == chosen.line), None)
    if crash_tb is not None and crash_tb.chain:
        root = crash_tb.chain[0]
        exception, message = root["exception"], root["message"] or message
    phase, model = phase_at(obs, chosen.line, chosen.rank, chosen.frames)
    if _CAPTURE_FAILED.search(chosen.message):
        phase = str(Phase.CUDA_GRAPH_CAPTURE)
    ranks = {r for c in candidates if not c.is_wrapper() for r in c.ranks if r} | set(chosen.ranks)
    return Crash(
        line=chosen.line,
        phase=phase,
        exception=exception or None,
        message=(message or "")[:MAX_MESSAGE],
        rank=chosen.rank,
        ranks=sorted(ranks, key=rank_sort_key),
        model=model,
        exception_line=(crash_tb.end_line or chosen.line) if crash_tb is not None else chosen.line,
    )


def crash_event(crash: Crash, timeline: list[Event]) -> Event:
    time = next((e.time for e in timeline if e.line >= crash.line and e.time), None)
    detail = f"{crash.exception or 'fatal'}: {crash.message[:250]}"
    return Event(crash.line, time, crash.rank, "error", "crash", detail, crash.model)


def crash_from_fatal_line(line: int, rank: str | None, text: str, phases: list[PhaseSpan]) -> Crash:
    """A known fatal error in a log that never became ready: the server died there, even when the excerpt
    lacks the traceback's exception line (a pasted message, a `# Error:` note)."""
    started = [p for p in phases if p.start_line <= line]
    return Crash(
        line=line,
        phase=started[-1].name if started else None,
        exception=None,
        message=text,
        rank=rank,
        ranks=[rank] if rank else [],
        model=None,
        source="signature",
        exception_line=line,
    )
