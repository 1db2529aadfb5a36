"""What the API answers about the knowledge base's signatures (see dispatchlab.api.shapes: declared once,
turned into the OpenAPI document by dispatchlab.api.schema)."""

from __future__ import annotations

from typing import Any

from typing_extensions import TypedDict  # pydantic reads typing.TypedDict only from Python 3.12

from dispatchlab.api.decision_shapes import DecisionRef
from dispatchlab.api.pagination import PageQuery
from dispatchlab.api.shapes import (
    Area,
    DateTime,
    Evidence,
    FailureClass,
    Level,
    Severity,
    Text200,
    Url,
    described,
)

# ---------------------------------------------------------------- the knowledge base


@described
class SignatureListQuery(PageQuery, total=False):
    q: Text200
    """text in the id, title, fix or explanation"""
    failure_class: FailureClass
    area: Area
    """the knowledge base's folder: arch, cuda, memory ..."""
    severity: Severity
    level: Level


@described
class SignatureFix(TypedDict):
    summary: str
    args: dict[str, Any]
    env: dict[str, str]


@described
class SignatureSummary(TypedDict):
    """A reviewed signature of the knowledge base (dispatchlab/core/signatures/data/<area>/<id>.toml)."""

    id: str
    title: str
    failure_class: FailureClass
    severity: Severity
    level: Level
    area: str
    fix: SignatureFix
    references: list[str]


@described
class SignaturePage(TypedDict):
    results: list[SignatureSummary]
    count: int
    next: Url | None
    previous: Url | None
    kb_digest: str
    """the knowledge-base version (a report's document.kb_digest names the one that matched it)"""


@described
class TriedAndFailed(TypedDict):
    what: str
    why: str


@described
class Patterns(TypedDict):
    any: list[str]
    all: list[str]
    sequence: list[str]
    within: int
    """lines within which all / sequence must occur"""


@described
class SignatureConfirmation(TypedDict):
    """What a confirm run on a GPU showed about the fix."""

    outcome: str
    """fixed, still_fails, garbage ..."""
    label: str
    """for people, e.g. confirmed on NVIDIA H200 sm_90, sglang 0.5.23, 2026-12-02"""
    gpu_name: str
    arch: str
    server: str
    server_version: str
    """empty for a stand-in: no server ran"""
    evidence: Evidence
    """kernel for a stand-in run: kernel-level evidence, not a server confirmation"""
    launcher: str
    """what ran, for people: sglang 0.5.23, the moe-serve stand-in"""
    weights: str
    """real, dummy, reference or empty"""
    created_at: DateTime
    confirm: int | None
    """the confirm run (GET /api/v1/confirms/{id}) when it is in the caller's projects"""


@described
class Signature(SignatureSummary):
    explanation: str
    tried_and_failed: list[TriedAndFailed]
    fix_by_server: dict[str, SignatureFix]
    """the fix in another server's flags"""
    match: Patterns
    conditions: dict[str, Any]
    supersedes: list[str]
    source: str
    """the file, under dispatchlab/core/signatures/data/"""
    kb_digest: str
    confirmations: list[SignatureConfirmation]
    """newest first"""
    decisions: list[DecisionRef]
    """decision records of the caller's projects linked to this signature"""
