"""The parsed document: what the server was, resolved, went through, and where it died."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Event:
    line: int
    time: str | None
    rank: str | None
    kind: str  # phase | backend | warning | error | metric
    name: str
    detail: str
    model: str | None = None


@dataclass
class Frame:
    file: str
    line: int
    function: str


@dataclass
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


@dataclass
class Origin:
    value: str
    source: str  # flag | args | message | default | inferred
    line: int | None = None
    text: str | None = None


@dataclass
class PatternHit:
    line: int
    rank: str | None
    text: str
    groups: dict[str, str]


@dataclass
class ParsedLog:
    server: str = "unknown"
    server_version: str | None = None
    engine: str | None = None  # "sglang" | "vllm" | "tensorrt_llm" | None, wider than the contract's server
    model: str | None = None
    gpu: dict[str, Any] = field(
        default_factory=lambda: {"name": None, "arch": None, "count": None, "compute_capability": None}
    )
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
    crash: dict[str, Any] | None = None
    outcome: str = "incomplete"
    versions: dict[str, str | None] = field(default_factory=dict)
    phases: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=lambda: {"points": [], "total": 0, "sampled_every": 1})
    sources: list[dict[str, Any]] = field(default_factory=list)
    line_count: int = 0
    ranks: list[str] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(
        default_factory=list
    )  # error lines outside tracebacks (deduplicated)
    warnings_count: int = 0
    time_year_known: bool = True  # False: timestamps had no year and use 1900 as a placeholder
    truncated_events: int = 0
    # NCCL_DEBUG=INFO: the transport chosen per rank pair ({"a", "b", "transport", "via", "line"}), deduplicated
    nccl_transports: list[dict[str, Any]] = field(default_factory=list)
    # matches of extra patterns (the knowledge base's) by pattern index: not part of the JSON document
    pattern_hits: dict[int, list[PatternHit]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        # dataclasses.asdict deep-copies every metric point and event: build the JSON shape directly
        doc = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "pattern_hits"}
        doc["timeline"] = [vars(e).copy() for e in self.timeline]
        doc["tracebacks"] = [
            {
                **{k: v for k, v in vars(t).items() if k != "frames"},
                "frames": [vars(f).copy() for f in t.frames],
            }
            for t in self.tracebacks
        ]
        doc["backend_origins"] = {k: vars(v).copy() for k, v in self.backend_origins.items()}
        doc["draft_backend_origins"] = {k: vars(v).copy() for k, v in self.draft_backend_origins.items()}
        return doc
