"""What the API takes and answers about GPU hosts, confirm runs and backend sweeps (see
dispatchlab.api.shapes: declared once, turned into the OpenAPI document by dispatchlab.api.schema)."""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from typing_extensions import TypedDict  # pydantic reads typing.TypedDict only from Python 3.12

from dispatchlab.api.shapes import (
    ConfirmStatus,
    DateTime,
    Evidence,
    Url,
    described,
    open_ended,
)

# ---------------------------------------------------------------- GPU hosts and confirm runs


@open_ended
class HostGpu(TypedDict):
    name: str | None
    arch: str | None
    memory_mib: NotRequired[int | None]


@described
class Host(TypedDict):
    name: str
    alive: bool
    """heard from within the last few heartbeats"""
    busy: bool
    last_seen: DateTime
    first_seen: DateTime
    arches: list[str]
    queues: list[str]
    gpus: list[HostGpu]
    links: list[dict[str, Any]]
    """each GPU pair's link: {"a", "b", "kind", "gbps"}"""
    driver: str | None
    versions: dict[str, Any]
    launchers: list[str]
    model_roots: list[str]


@described
class HostPage(TypedDict):
    results: list[Host]
    count: int
    next: Url | None
    previous: Url | None


@described
class ConfirmBody(TypedDict, total=False):
    """All optional; without a body the report's launch runs with its diagnosis's fix."""

    command: str
    """replaces the launch read from the log (a command line; no shell syntax)"""
    args: dict[str, Any]
    """replaces the fix's flags: a flag's value true sets it bare, false or null removes it"""
    env: dict[str, Any]
    """replaces the fix's variables: false or null removes one"""
    probes: list[str]
    """kernel probes (or component:<name>) to run afterwards"""


@described
class Launch(TypedDict):
    launcher: str
    args: list[Any]
    env: dict[str, Any]


@described
class ConfirmCreated(TypedDict):
    id: int
    status: ConfirmStatus
    """waiting_for_host while no live host of the report's arch exists"""
    arch: str | None
    queue: str
    url: Url
    launch: Launch
    joined: bool
    """true when the same launch was already waiting or queued: this is that run, nothing new was queued"""


@described
class LauncherIdentity(TypedDict):
    """What ran, as it identified itself."""

    kind: Literal["server", "stand-in"]
    """a stand-in is a dispatchlab repro program (repro:<name>), not the server"""
    name: str
    """sglang, vllm, or repro:<name>"""
    label: str
    """for people: sglang 0.5.23, the moe-serve stand-in"""
    version: str | None
    how: str
    """how we know: reported by the server at /version, or inferred from the installed package"""
    inferred: bool


@open_ended
class Weights(TypedDict):
    kind: Literal["real", "dummy", "reference"]
    """dummy: --load-format dummy; reference: a repro's own seeded weights; real: inferred when no
    flag says otherwise"""
    how: str
    inferred: bool


@described
class Confirm(TypedDict):
    id: int
    status: ConfirmStatus
    error: str | None
    report: int
    arch: str | None
    queue: str
    signature: str | None
    """the signature whose fix is tried"""
    launch: Launch
    argv: list[str]
    """what the worker ran"""
    host: str | None
    new_report: int | None
    """the report of the run's own log"""
    new_report_url: Url | None
    ready: bool | None
    ready_by: str | None
    ready_seconds: float | None
    smoke: dict[str, Any] | None
    throughput: list[dict[str, Any]]
    throughput_unit: str
    """tokens/s for a server; kernel steps/s for a stand-in (one MoE layer per step, no model)"""
    evidence: Evidence
    """server: the server itself ran; kernel: a stand-in ran the kernel path; it never closes a
    failure group and never counts as a server confirmation"""
    evidence_label: str
    """in words: kernel-level confirm with the moe-serve stand-in on NVIDIA H200 sm_90 (reference weights)"""
    launcher: LauncherIdentity
    weights: Weights | None
    """null until the worker answered"""
    host_identity: dict[str, Any] | None
    """{"name", "gpu", "arch", "gpu_count"} as the worker reported it"""
    cancel_url: Url | None
    """POST here to cancel while waiting, queued or running"""
    probes: list[dict[str, Any]]
    created_at: DateTime
    started_at: DateTime | None
    finished_at: DateTime | None
    url: Url


# ---------------------------------------------------------------- backend sweeps

SweepStatus = Literal["queued", "running", "done", "failed"]
SweepComponent = Literal["moe", "attention", "gemm", "sampling"]


@described
class SweepBody(TypedDict, total=False):
    """Optional; without a component the one the crash names is swept (as the report page pre-selects)."""

    component: SweepComponent
    """the component whose backends are swept"""


@described
class SweepCreated(TypedDict):
    id: int
    status: SweepStatus
    """queued until a GPU worker of the report's arch takes it (then running, then done or failed)"""
    arch: str | None
    queue: str
    component: SweepComponent
    url: Url


@described
class Sweep(TypedDict):
    id: int
    status: SweepStatus
    error: str | None
    """why the sweep did not run (status failed)"""
    report: int
    component: SweepComponent
    arch: str | None
    queue: str
    host: str | None
    shapes: dict[str, Any]
    """the shapes read from the report: values, and where each came from (args, config, inferred, default)"""
    result: dict[str, Any] | None
    """the worker's sweep report (CONTRACT.md, "The backend sweep"): candidates ranked, proposed_fix"""
    proposed_fix: dict[str, Any] | None
    """the fastest correct candidate's server flag: {candidate, flag, value, args_patch, ms, why}"""
    created_at: DateTime
    started_at: DateTime | None
    """when a host said it took the sweep (status running); null while queued"""
    finished_at: DateTime | None
    url: Url
