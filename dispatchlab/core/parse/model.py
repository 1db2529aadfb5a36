"""The parsed log: what the server was, resolved, went through, and where it died.

Typed for the stages and for matching; `to_dict` gives the JSON document of docs/contract.md, only at the
boundaries (CLI, Celery task, API).
"""

from __future__ import annotations

from typing import Any

from dispatchlab.core.parse.vocabulary import NOT_FAILURE_EVIDENCE
from dispatchlab.core.records import field, field_names, record


@record
class Event:
    line: int
    time: str | None
    rank: str | None
    kind: str  # phase | backend | warning | error | metric
    name: str
    detail: str
    model: str | None = None


@record
class Frame:
    file: str
    line: int
    function: str


@record
class Traceback:
    line: int
    rank: str | None
    exception: str
    message: str
    frames: list[Frame] = field(default_factory=list)
    ranks: list[str] = field(default_factory=list)
    count: int = 1
    chain: list[dict[str, str]] = field(default_factory=list)  # earlier exceptions of a chained traceback
    end_line: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "frames"}
        out["frames"] = [vars(f).copy() for f in self.frames]
        return out


@record
class Origin:
    value: str
    source: str  # flag | args | message | default | inferred
    line: int | None = None
    text: str | None = None


@record
class PatternHit:
    line: int
    rank: str | None
    text: str
    groups: dict[str, str]


@record
class Gpu:
    name: str | None = None
    arch: str | None = None
    count: int | None = None
    compute_capability: str | None = None


@record
class Crash:
    line: int
    phase: str | None
    exception: str | None
    message: str
    rank: str | None
    ranks: list[str]
    model: str | None
    source: str | None = None  # "signature": decided from a known fatal line, not a traceback
    exception_line: int | None = None  # the line printing the exception's type and message

    @property
    def pointer(self) -> int:
        """The crash's line, the one every view names (dispatchlab.core.crashline)."""
        return self.exception_line or self.line

    def to_dict(self) -> dict[str, Any]:
        out = vars(self).copy()
        if self.source is None:
            del out["source"]
        return out


@record
class PhaseSpan:
    rank: str | None
    model: str
    name: str
    start_line: int
    end_line: int | None
    start: str | None
    end: str | None
    seconds: float | None
    detail: str


@record
class ErrorLine:
    """An error line outside tracebacks, with the ranks that printed the same text."""

    line: int
    rank: str | None
    ranks: list[str]
    kind: str
    text: str
    count: int
    time: str | None
    fatal: bool


@record
class Metrics:
    points: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0
    sampled_every: int = 1


@record(slots=True)
class RunSummary:
    """One server start of a file that holds several (a supervisor restarting a crashing server, attempts
    concatenated): small on purpose, a crash loop keeps thousands of them."""

    index: int
    first_line: int
    last_line: int
    outcome: str
    exception: str | None
    fingerprint: str  # the same for runs that ended the same way (outcome, exception, message, frames)
    crash_line: int | None = None
    phase: str | None = None
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "first_line": self.first_line,
            "last_line": self.last_line,
            "outcome": self.outcome,
            "exception": self.exception,
            "fingerprint": self.fingerprint,
            "crash_line": self.crash_line,
            "phase": self.phase,
            "message": self.message,
        }


@record
class ParsedLog:
    server: str = "unknown"
    server_version: str | None = None
    # how the server was known: {"source": "log"|"inferred", "line", "text"}; None when it is unknown
    server_origin: dict[str, Any] | None = None
    engine: str | None = None  # "sglang" | "vllm" | "tensorrt_llm" | None, wider than the contract's server
    model: str | None = None
    gpu: Gpu = field(default_factory=Gpu)
    server_args: dict[str, Any] = field(default_factory=dict)
    server_args_complete: bool = True
    launch_command: str | None = None
    backends: dict[str, str] = field(default_factory=dict)
    draft_backends: dict[str, str] = field(default_factory=dict)
    backend_origins: dict[str, Origin] = field(default_factory=dict)
    draft_backend_origins: dict[str, Origin] = field(default_factory=dict)
    timeline: list[Event] = field(default_factory=list)
    tracebacks: list[Traceback] = field(default_factory=list)
    kernels: list[str] = field(default_factory=list)
    crash: Crash | None = None
    outcome: str = "incomplete"
    versions: dict[str, str | None] = field(default_factory=dict)
    phases: list[PhaseSpan] = field(default_factory=list)
    metrics: Metrics = field(default_factory=Metrics)
    sources: list[dict[str, Any]] = field(default_factory=list)
    line_count: int = 0
    ranks: list[str] = field(default_factory=list)
    errors: list[ErrorLine] = field(default_factory=list)
    warnings_count: int = 0
    time_year_known: bool = True  # False: timestamps had no year and use 1900 as a placeholder
    truncated_events: int = 0
    # NCCL_DEBUG=INFO: the transport chosen per rank pair ({"a", "b", "transport", "via", "line"}), deduplicated
    nccl_transports: list[dict[str, Any]] = field(default_factory=list)
    # the server starts of a file that holds several, the last one being what crash and outcome describe;
    # empty for one run (and then left out of the JSON document)
    runs: list[RunSummary] = field(default_factory=list)
    # runs of a long crash loop left out of `runs` (the first and last are listed), counted by fingerprint
    runs_omitted: dict[str, int] = field(default_factory=dict)
    # the last run's tracebacks and error lines past the caps (MAX_TRACEBACKS, MAX_ERRORS): counted, not kept
    tracebacks_omitted: int = 0
    errors_omitted: int = 0
    # a big log's checks that ran on some stretches of it only: {"checks": {rule: what it looks for},
    # "checked_bytes", "total_bytes"}; None when every check read every line
    checks_sampled: dict[str, Any] | None = None
    # hits of the caller's extra patterns (the knowledge base's) by pattern index: not in the JSON document
    pattern_hits: dict[int, list[PatternHit]] = field(default_factory=dict)
    # the log's last lines (decoded, at most a few kilobytes): not in the JSON document
    tail: list[str] = field(default_factory=list)

    def failure_evidence(self) -> list[ErrorLine]:
        """The fatal error lines that say what failed (not a child's sigquit or one failed request)."""
        return [e for e in self.errors if e.fatal and e.kind not in NOT_FAILURE_EVIDENCE]

    def traceback_at(self, line: int) -> Traceback | None:
        return next((t for t in self.tracebacks if t.line == line), None)

    def to_dict(self) -> dict[str, Any]:
        # dataclasses.asdict deep-copies every metric point and event: build the JSON shape directly
        doc = {name: getattr(self, name) for name in field_names(self) if name not in _NOT_IN_DOCUMENT}
        doc["gpu"] = vars(self.gpu).copy()
        doc["timeline"] = [vars(e).copy() for e in self.timeline]
        doc["tracebacks"] = [t.to_dict() for t in self.tracebacks]
        doc["crash"] = self.crash.to_dict() if self.crash else None
        doc["phases"] = [vars(p).copy() for p in self.phases]
        doc["metrics"] = vars(self.metrics).copy()
        doc["errors"] = [vars(e).copy() for e in self.errors]
        doc["backend_origins"] = {k: vars(v).copy() for k, v in self.backend_origins.items()}
        doc["draft_backend_origins"] = {k: vars(v).copy() for k, v in self.draft_backend_origins.items()}
        if len(self.runs) > 1:
            doc["runs"] = [run.to_dict() for run in self.runs]
        if self.runs_omitted:
            doc["runs_omitted"] = sum(self.runs_omitted.values())
            doc["runs_omitted_by_fingerprint"] = dict(self.runs_omitted)
        for name in ("tracebacks_omitted", "errors_omitted", "checks_sampled"):
            if getattr(self, name):
                doc[name] = getattr(self, name)
        return doc


_NOT_IN_DOCUMENT = frozenset(
    {"pattern_hits", "runs", "runs_omitted", "tail", "tracebacks_omitted", "errors_omitted", "checks_sampled"}
)
