"""What the API takes and answers, declared once: the views build their answers as these TypedDicts and
dispatchlab.api.schema turns the same types into the OpenAPI document (a docstring under a field is its
description there). Decision records' shapes live in dispatchlab.api.decision_shapes, GPU hosts', confirm runs' and
sweeps' in dispatchlab.api.gpu_shapes, signatures' in dispatchlab.api.signature_shapes.

Every answer may gain fields (CONTRACT.md: extend, never break); a client ignores those it does not know.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import AfterValidator, ConfigDict, Field, WithJsonSchema, with_config
from typing_extensions import TypedDict  # pydantic reads typing.TypedDict only from Python 3.12

from dispatchlab.api.decision_shapes import DecisionRef
from dispatchlab.api.pagination import NO_NUL, PageQuery
from dispatchlab.core.signatures import DATA_DIR, FAILURE_CLASSES, LEVELS, SEVERITIES
from dispatchlab.reports.selectors import backend_filter_problem

# One vocabulary (STYLE 16): the Literals take their values from where they are defined.
FailureClass = Literal[FAILURE_CLASSES]  # type: ignore[valid-type]
ReportStatus = Literal["queued", "parsing", "done", "failed"]
ConfirmStatus = Literal[
    "waiting_for_host",
    "queued",
    "running",
    "parsing",
    "fixed",
    "still_fails",
    "garbage",
    "refused",
    "cancelled",
]
Evidence = Literal["server", "kernel"]
Severity = Literal[SEVERITIES]  # type: ignore[valid-type]
Level = Literal[LEVELS]  # type: ignore[valid-type]
# The knowledge base's areas are its folders (data/<area>/<id>.toml).
AREAS = tuple(sorted(path.name for path in DATA_DIR.iterdir() if path.is_dir()))
Area = Literal[AREAS]  # type: ignore[valid-type]

DateTime = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]
Url = Annotated[str, WithJsonSchema({"type": "string", "format": "uri"})]
Binary = Annotated[bytes, WithJsonSchema({"type": "string", "format": "binary"})]
Text200 = Annotated[str, Field(max_length=200, pattern=NO_NUL)]
Text100 = Annotated[str, Field(max_length=100, pattern=NO_NUL)]
Text20 = Annotated[str, Field(max_length=20, pattern=NO_NUL)]


def _readable_backend(value: str) -> str:
    problem = backend_filter_problem(value)
    if problem:
        raise ValueError(problem)
    return value


described = with_config(ConfigDict(use_attribute_docstrings=True))
# A shape whose producer (the core's document, a host's inventory) adds fields of its own.
open_ended = with_config(ConfigDict(use_attribute_docstrings=True, extra="allow"))


# ---------------------------------------------------------------- errors


@described
class Error(TypedDict):
    """An error, for people."""

    error: str
    """one line that says what went wrong and what to do"""


@described
class Invalid(TypedDict):
    """A refused request: the error for people and, where a query parameter or a field of the body is to
    blame, what is wrong with it by name."""

    error: str
    fields: NotRequired[dict[str, list[str]]]
    """what is wrong, by parameter or field: `status`, `alternatives[1].what`, `revisit_when.flashinfer` ..."""


ERROR: Any = Error
INVALID: Any = Invalid


# ---------------------------------------------------------------- the document (CONTRACT.md)


@open_ended
class Gpu(TypedDict):
    name: str | None
    arch: str | None
    """sm_90, sm_120 ..."""
    count: int | None
    compute_capability: NotRequired[str | None]


@open_ended
class Event(TypedDict):
    line: int
    time: str | None
    """ISO-8601, or null when the log line has no time"""
    rank: str | None
    kind: Literal["phase", "backend", "warning", "error", "metric"]
    name: str
    detail: str
    model: NotRequired[Literal["main", "draft"] | None]


@open_ended
class Frame(TypedDict):
    file: str
    line: int
    function: str


@open_ended
class Traceback(TypedDict):
    line: int
    rank: str | None
    exception: str
    message: str
    frames: list[Frame]
    ranks: NotRequired[list[str]]
    count: NotRequired[int]


@open_ended
class Crash(TypedDict):
    line: int
    phase: str | None
    exception: str | None
    message: str
    rank: NotRequired[str | None]
    ranks: NotRequired[list[str]]
    model: NotRequired[Literal["main", "draft"] | None]


@open_ended
class Fix(TypedDict):
    summary: str
    args: dict[str, Any]
    """server flags to change: `{"--attention-backend": "triton"}`; true sets a flag bare, false removes it"""
    env: dict[str, Any]
    tried_and_failed: NotRequired[list[str]]


@open_ended
class Match(TypedDict):
    """A signature of the knowledge base that matched the log."""

    id: str
    title: str
    failure_class: FailureClass
    confidence: Annotated[float, Field(ge=0, le=1)]
    lines: list[int]
    facts: dict[str, Any]
    fix: Fix
    decisions: list[DecisionRef]
    """decision records linked to this signature"""
    level: NotRequired[Level]
    severity: NotRequired[Severity]
    explanation: NotRequired[str]
    references: NotRequired[list[str]]


@open_ended
class SimilarCase(TypedDict):
    """A known case: a labelled excerpt of a public thread whose failure evidence reads like this log's."""

    id: str
    """the case's file in the labelled data (`cases/sglang-12345`)"""
    url: str
    """the public thread"""
    title: str
    failure_class: FailureClass
    fix: str | None
    """what fixed it, per the thread (or what the thread says of it)"""
    score: Annotated[float, Field(ge=0, le=1)]
    """cosine similarity of the failure evidence"""


@open_ended
class SimilarGroup(TypedDict):
    """A failure group of the report's own project whose newest report's evidence reads like this one's."""

    id: int
    title: str
    failure_class: str | None
    count: int
    last_seen: DateTime
    score: Annotated[float, Field(ge=0, le=1)]
    url: Url
    """the group's page"""


@open_ended
class Similar(TypedDict):
    """Similar incidents, best first, at most three of each; none for a log that shows no failure."""

    cases: list[SimilarCase]
    groups: list[SimilarGroup]
    """empty from the CLI; on the server, ranked when the report is read"""


@open_ended
class Document(TypedDict):
    """The `match` document of CONTRACT.md (docs/contract.md lists every field); more fields may appear."""

    server: Literal["sglang", "vllm", "unknown"]
    server_version: str | None
    model: str | None
    gpu: Gpu
    server_args: dict[str, Any]
    backends: dict[str, str]
    draft_backends: dict[str, str]
    timeline: list[Event]
    tracebacks: list[Traceback]
    kernels: list[str]
    crash: Crash | None
    outcome: Literal["crashed", "ready", "serving", "incomplete"]
    matches: list[Match]
    failure_class: FailureClass
    fingerprint: str
    decisions: NotRequired[list[DecisionRef]]
    """the decision records linked to the fingerprint, the top signature or the report"""
    versions: NotRequired[dict[str, str | None]]
    launch_command: NotRequired[str | None]
    kb_digest: NotRequired[str]
    similar: NotRequired[Similar]
    """the known cases and the project's failure groups most like this failure"""


# ---------------------------------------------------------------- reports


@described
class Created(TypedDict):
    """Stored (or found again, when `duplicate` is true); parsing happens in a worker."""

    id: int
    url: Url
    """the report's page"""
    status: ReportStatus
    duplicate: bool
    """the same bytes (or the same CI delivery) were stored before: this is that report"""


@described
class RedactBody(TypedDict, total=False):
    """A regular expression, or a range of lines (as the log view numbers them)."""

    pattern: str
    """every match, on every line, becomes [REDACTED]"""
    first_line: int
    """the first line to replace by [REDACTED] (1-based)"""
    last_line: int
    """the last one (default: first_line)"""


RedactionStatus = Literal["queued", "running", "done", "refused"]


@described
class RedactionShape(TypedDict):
    """One redaction of a report: run by a worker, one at a time per report, oldest first."""

    id: int
    status: RedactionStatus
    what: str
    """"a pattern" or "lines N-M" (the pattern itself is not kept once it ran)"""
    reason: str
    """why it was refused: not a usable pattern, ran past DISPATCHLAB_REDACT_TIME_LIMIT, log unreadable"""
    redacted_lines: int | None
    """how many lines of the log changed once done; 0: nothing stored changed"""
    created_at: DateTime
    finished_at: DateTime | None


@described
class Redacted(TypedDict):
    """The redaction is queued; a worker replaces the stored log and every copy, then parses it again."""

    id: int
    url: Url
    status: ReportStatus
    """the report's status now (the re-parse starts once the redaction ran)"""
    redacted_lines: int | None
    """null until the redaction ran (see redaction.status and GET .../redact)"""
    redaction: RedactionShape


@described
class Redactions(TypedDict):
    """The report's redactions, oldest first."""

    redactions: list[RedactionShape]


@described
class ReportSummary(TypedDict):
    id: int
    url: Url
    """the report's page"""
    project: str
    title: str
    status: ReportStatus
    failure_class: str | None
    top_match_title: str | None
    server: str | None
    arch: str | None
    created_at: DateTime
    group: int | None
    """the failure group (GET /api/v1/groups/{id}), once parsed"""


@described
class ReportPage(TypedDict):
    """A page of reports, newest first."""

    results: list[ReportSummary]
    count: int
    next: Url | None
    previous: Url | None
    reports: list[ReportSummary]
    """the same as results (the list's first shape, kept for the clients that read it)"""


@described
class Report(TypedDict):
    id: int
    url: Url
    project: str
    title: str
    status: ReportStatus
    progress: Annotated[float, Field(ge=0, le=100)]
    """percent, while parsing"""
    error: str | None
    """why parsing failed, for people"""
    created_at: DateTime
    started_at: DateTime | None
    """the latest claim by a worker"""
    finished_at: DateTime | None
    parse_seconds: float | None
    """time the core took, in the worker"""
    failure_class: str | None
    document: Document | None
    """the match document, once done"""


@described
class ReportWaited(Report):
    """A report as GET answers it, after the webhook's ?wait."""

    duplicate: bool


@described
class ReportListQuery(PageQuery, total=False):
    """The dashboard's report filters (dispatchlab.front.filters)."""

    q: Text200
    """text in the title, top match, model, GPU, server version, launch command, CI job, file names; a
    fingerprint prefix; a report id"""
    project: Text100
    """a project's slug"""
    server: Text20
    arch: Text20
    failure_class: FailureClass
    signature: Text200
    """the id of the top match"""
    backend: Annotated[str, Field(max_length=120, pattern=NO_NUL), AfterValidator(_readable_backend)]
    """a backend value (`triton`), or key=value (`moe_runner_backend=triton`; draft keys match too)"""
    status: ReportStatus


@described
class Upload(TypedDict):
    file: list[Binary]
    """one log (.log, .txt, .gz, .zip); several files in this field make one report"""
    title: NotRequired[str]
    launch_command: NotRequired[str]
    project: NotRequired[str]
    """the project's slug; needed only by a caller who can upload to several projects"""


# ---------------------------------------------------------------- the CI webhook


@with_config(ConfigDict(use_attribute_docstrings=True, extra="allow"))
class HookJson(TypedDict):
    """A delivery as JSON; fields it does not know (branch, pipeline ...) are ignored."""

    log: str
    """the log text"""
    job: NotRequired[str]
    url: NotRequired[str]
    commit: NotRequired[str]
    title: NotRequired[str]
    launch_command: NotRequired[str]


@described
class HookMultipart(TypedDict):
    file: list[Binary]
    job: NotRequired[str]
    url: NotRequired[str]
    commit: NotRequired[str]
    title: NotRequired[str]
    launch_command: NotRequired[str]


@described
class HookQuery(TypedDict, total=False):
    wait: int
    """wait up to this many seconds (at most 60) for the parse, then answer like GET /api/v1/reports/{id}"""
    project: Text100
    """the slug of the project whose secret signed the delivery (spares trying every project's)"""


HookHeaders = TypedDict(
    "HookHeaders",
    {
        "X-Dispatchlab-Signature": Annotated[
            str,
            Field(
                pattern=r"^sha256=[0-9a-fA-F]{64}$",
                description="sha256=<hex HMAC-SHA256 of the raw body (or of '<timestamp>.<raw body>') "
                "under the project's webhook secret>",
            ),
        ],
        "X-Dispatchlab-Timestamp": NotRequired[
            Annotated[int, Field(description="unix seconds; deliveries more than 5 minutes off are refused")]
        ],
        "X-Dispatchlab-Delivery": NotRequired[
            Annotated[str, Field(description="a repeat of this delivery id returns the first one's report")]
        ],
        "X-Dispatchlab-Project": NotRequired[Annotated[str, Field(description="as ?project=")]],
    },
)


# ---------------------------------------------------------------- failure groups


@described
class GroupListQuery(PageQuery, total=False):
    """The dashboard's failure-group filters (dispatchlab.front.filters)."""

    q: Text200
    """text in the title, or a fingerprint prefix"""
    project: Text100
    """a project's slug"""
    failure_class: FailureClass
    arch: Text20
    """groups with a report of this arch"""


@described
class GroupSummary(TypedDict):
    """Reports of one project with the same crash fingerprint."""

    id: int
    fingerprint: str
    title: str
    failure_class: str | None
    project: str
    count: int
    """reports in the group"""
    first_seen: DateTime
    last_seen: DateTime
    url: Url
    """the group's page"""


@described
class GroupPage(TypedDict):
    """A page of failure groups, the most recently seen first."""

    results: list[GroupSummary]
    count: int
    next: Url | None
    previous: Url | None


@described
class Group(GroupSummary):
    arches: list[str]
    server_versions: list[str]
    signatures: list[str]
    """the top matches of its reports"""
    reports: list[ReportSummary]
    """its newest reports (at most 20)"""
    decisions: list[DecisionRef]
    """decision records linked to its fingerprint or to the top signature of its reports"""
