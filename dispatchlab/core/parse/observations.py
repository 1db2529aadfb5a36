"""What the scan saw: the one record the extractors append to and the interpret stage reads.

Extractors only add to it (events, versions, milestones, announcements, failures); nothing here decides
what the log means. `interpret` turns it into a ParsedLog.
"""

from __future__ import annotations

from typing import Any

from dispatchlab.core.parse.lineformat import Line
from dispatchlab.core.parse.model import ErrorLine, Event, Origin, PatternHit, RunSummary, Traceback
from dispatchlab.core.parse.vocabulary import MAX_MESSAGE, MAX_RUNS_LISTED, MAX_TIMELINE_EVENTS
from dispatchlab.core.records import field, record


# records, not NamedTuples: typing.NamedTuple compiles each string annotation (13 here, 2 ms at start-up)
@record(frozen=True, slots=True)
class Milestone:
    line: int
    time: str | None
    rank: str | None
    name: str
    model: str


@record(frozen=True, slots=True)
class Announcement:
    """A backend the server said it uses; weak ones only fill a gap (a dtype in a load line)."""

    key: str
    origin: Origin
    model: str
    weak: bool


@record(frozen=True, slots=True)
class FatalLine:
    line: int
    rank: str | None
    kind: str
    text: str


@record
class Observations:
    # the lines themselves
    line_count: int = 0
    year: str | None = None  # the first SGLang timestamp's year: vLLM and glog times have none
    last_time: str | None = None
    server_votes: dict[str, int] = field(default_factory=lambda: {"sglang": 0, "vllm": 0, "tensorrt_llm": 0})
    # lines that name a server, by server: (weight, line, text) (extract/servers.py); the file's, like versions
    server_mentions: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)
    sources: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[Event] = field(default_factory=list)
    truncated_events: int = 0
    scanned_bytes: int = 0
    unsampled_bytes: int = 0  # of those, read without the sampled rules (chunkscan.SAMPLED_STRETCH_BYTES)
    sampled_stream: bool = False  # a compressed or piped log read so: its last stretch too
    pattern_hits: dict[int, list[PatternHit]] = field(default_factory=dict)
    tail: bytes = b""  # the log's last bytes: what the learned fallback reads when no line says what failed
    # arguments and versions
    server_args: dict[str, Any] = field(default_factory=dict)
    server_args_complete: bool = True
    dump_line: int | None = None
    vllm_args: dict[str, Any] = field(default_factory=dict)
    launch_args: dict[str, Any] = field(default_factory=dict)
    launch_command: str | None = None
    model: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    # environment
    gpu_names: dict[int, str] = field(default_factory=dict)
    gpu_ccs: dict[int, str] = field(default_factory=dict)
    rocm: bool = False
    arch: str | None = None
    arch_strength: int = 0  # how direct the arch evidence is: 4 torch's own warning ... 1 a kernel name
    arch_gpu_name: str | None = None
    nccl_transports: list[dict[str, Any]] = field(default_factory=list)
    # startup
    milestones: list[Milestone] = field(default_factory=list)
    ready_line: int | None = None
    announcements: list[Announcement] = field(default_factory=list)
    # failures
    tracebacks: list[Traceback] = field(default_factory=list)
    ignored_traceback_lines: set[int] = field(default_factory=set)
    kernels: dict[str, None] = field(default_factory=dict)
    errors: dict[str, ErrorLine] = field(default_factory=dict)  # by text without numbers
    errors_omitted: int = 0  # error lines past the first MAX_ERRORS different ones (not kept)
    tracebacks_omitted: int = 0  # tracebacks past the first MAX_TRACEBACKS different ones (not kept)
    fatal_lines: list[FatalLine] = field(default_factory=list)
    warnings_count: int = 0
    stop_line: int | None = None  # the operator asked the server to stop here
    request_error_lines: set[int] = field(default_factory=set)  # one request failed, the server went on
    served_line: int | None = None  # the first line that shows the server answered a request
    # throughput
    metric_points: list[dict[str, Any]] = field(default_factory=list)
    metric_total: int = 0
    first_decode_line: int | None = None
    last_metric_line: int | None = None
    # runs: a file can hold several server starts; the failure and startup fields above, the args dumps and
    # the backends announced are the current run's (`new_run` clears them); versions, GPU and the launch
    # command (a supervisor may echo it once) are the file's
    run_first_line: int = 1
    runs: list[RunSummary] = field(
        default_factory=list
    )  # the runs before the current one (the first and last)
    run_total: int = 0  # the runs before the current one, listed or not
    runs_omitted: dict[str, int] = field(default_factory=dict)  # runs left out of `runs`, by fingerprint

    def finished_run(self, summary: RunSummary) -> None:
        """Keep a finished run's record; past MAX_RUNS_LISTED the middle ones become counts (a crash loop of
        a million runs holds a few hundred records)."""
        self.run_total += 1
        self.runs.append(summary)
        if len(self.runs) > MAX_RUNS_LISTED:
            dropped = self.runs.pop(MAX_RUNS_LISTED // 2)
            self.runs_omitted[dropped.fingerprint] = self.runs_omitted.get(dropped.fingerprint, 0) + 1

    def new_run(self, first_line: int) -> None:
        """The server starts again at `first_line`: what decides a crash starts afresh."""
        self.run_first_line = first_line
        self.server_args = {}
        self.server_args_complete = True
        self.dump_line = None
        self.vllm_args = {}
        self.model = None
        self.announcements = []
        self.pattern_hits = {}
        self.milestones = []
        self.ready_line = None
        self.tracebacks = []
        self.ignored_traceback_lines = set()
        self.kernels = {}
        self.errors = {}
        self.errors_omitted = 0
        self.tracebacks_omitted = 0
        self.fatal_lines = []
        self.stop_line = None
        self.request_error_lines = set()
        self.served_line = None
        self.first_decode_line = None

    def event(self, line: Line, kind: str, name: str, detail: str, model: str | None = None) -> None:
        if len(self.timeline) >= MAX_TIMELINE_EVENTS:
            self.truncated_events += 1
            return
        self.timeline.append(
            Event(line.number, line.time, line.rank, kind, name, detail[:MAX_MESSAGE], model)
        )

    def version(self, key: str, value: str | None) -> None:
        if value and value.lower() not in ("module not found", "n/a", "could not collect", "none"):
            value = value.strip().rstrip(".,")
            if not self.versions.get(key):
                self.versions[key] = value

    def milestone(self, line: Line, name: str, detail: str, model: str = "main") -> None:
        self.event(line, "phase", name, detail, model)
        self.milestones.append(Milestone(line.number, line.time, line.rank, name, model))

    def suggest_arch(self, arch: str | None, strength: int, name: str | None = None) -> None:
        if arch and strength > self.arch_strength:
            self.arch = arch
            self.arch_strength = strength
            if name and not self.arch_gpu_name:
                self.arch_gpu_name = name
