"""Decision records where failures recur: the pure half, shared by the dashboard and `dispatchlab match
LOG --decisions FILE`.

A decision record (DR-7: "MTP off on sm_120 until flashinfer ships SM120 trtllm-gen kernels") is linked
to failure groups (fingerprints), signatures (ids) and reports (ids). `attach_decisions` puts the records
linked to a match document into it: `document["decisions"]` holds those linked to its fingerprint, its
top signature or (on the dashboard) its report id, and `document["matches"][i]["decisions"]` those linked
to that match's signature, each as a `DecisionRef`.

A record may say when to revisit it: PEP 440 specifiers per package (`{"flashinfer": ">=0.7"}`). A log
that shows such a version makes the record stale; `revisit_hit` finds the first package that does, with
this module's own PEP 440 subset (dispatchlab.core.versions), so the dashboard and the CLI agree.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from dispatchlab.core.reading import LogReadError
from dispatchlab.core.versions import InvalidSpecifier, SpecifierSet


class DecisionStatus(enum.StrEnum):
    PROPOSED = "proposed"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    SUPERSEDED = "superseded"


# Where a record shows first when several concern one failure: what the team does now, then what it
# considers, then what it ruled out, then what was replaced.
STATUS_ORDER = {
    DecisionStatus.ACCEPTED: 0,
    DecisionStatus.PROPOSED: 1,
    DecisionStatus.REJECTED: 2,
    DecisionStatus.SUPERSEDED: 3,
}

# The packages a revisit-when condition may name, as the parser keys the document's `versions`.
REVISIT_PACKAGES = ("sglang", "vllm", "flashinfer", "torch", "cuda", "driver", "triton", "sgl_kernel", "nccl")
# Other spellings people write (pip names, marketing names) -> the key above.
PACKAGE_ALIASES = {
    "flashinfer_python": "flashinfer",
    "pytorch": "torch",
    "sglang_kernel": "sgl_kernel",
    "nvidia_driver": "driver",
    "cuda_runtime": "cuda",
    "cuda_toolkit": "cuda",
}


class DecisionsReadError(LogReadError):
    """An exported decisions file that cannot be read: like an unreadable log, the CLI exits 1 with
    this one-line message (it names the file and the record)."""


class DecisionRef(TypedDict):
    """A record as a match document lists it (docs/contract.md: id, number, title, status, stale; the rest
    extends it so the CLI can say what the page says)."""

    id: int
    number: int
    title: str
    status: str
    stale: bool
    stale_reason: str | None
    status_since: str | None


@dataclass(frozen=True)
class RevisitHit:
    """A version a log shows that meets a record's revisit-when condition."""

    package: str
    version: str
    specifier: str

    def reason(self, source: str) -> str:
        """`report 123 shows flashinfer 0.7.1, which matches flashinfer>=0.7`"""
        return f"{source} shows {self.package} {self.version}, which matches {self.package}{self.specifier}"


@dataclass(frozen=True)
class DecisionRecord:
    """What matching needs of a record: its links, status, staleness and revisit-when condition."""

    id: int
    number: int
    title: str
    status: DecisionStatus
    groups: tuple[str, ...] = ()
    signatures: tuple[str, ...] = ()
    reports: tuple[int, ...] = ()
    revisit_when: Mapping[str, str] = field(default_factory=dict)
    stale: bool = False
    stale_reason: str = ""
    # ISO date (or date-time) of the last status change: "Accepted 2026-11-02"
    status_since: str | None = None

    @property
    def label(self) -> str:
        return f"DR-{self.number}"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "record") -> DecisionRecord:
        """A record as the API gives it (GET /api/v1/decisions). Raises ValueError naming `where` and
        the field."""

        def fail(message: str) -> ValueError:
            return ValueError(f"{where}: {message}")

        if not isinstance(data, Mapping):
            raise fail("is not an object")
        ident, number = data.get("id"), data.get("number")
        if not isinstance(ident, int) or isinstance(ident, bool):
            raise fail("'id' must be an integer")
        if not isinstance(number, int) or isinstance(number, bool) or number < 1:
            raise fail("'number' must be a positive integer")
        title = data.get("title")
        if not isinstance(title, str):
            raise fail("'title' must be a string")
        try:
            status = DecisionStatus(str(data.get("status")))
        except ValueError:
            allowed = ", ".join(s.value for s in DecisionStatus)
            raise fail(f"'status' must be one of {allowed}, not {data.get('status')!r}") from None
        links = data.get("links") or {}
        if not isinstance(links, Mapping):
            raise fail("'links' must be an object")
        groups = _strings(links.get("groups"), fail, "links.groups")
        signatures = _strings(links.get("signatures"), fail, "links.signatures")
        reports = links.get("reports") or []
        if not isinstance(reports, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) for r in reports
        ):
            raise fail("'links.reports' must be a list of report ids")
        revisit = data.get("revisit_when") or {}
        if not isinstance(revisit, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in revisit.items()
        ):
            raise fail("'revisit_when' must be an object of package to PEP 440 specifier")
        for package, spec in revisit.items():
            try:
                SpecifierSet(spec)
            except InvalidSpecifier:
                raise fail(f"revisit_when.{package}: {spec!r} is not a PEP 440 specifier") from None
        since = data.get("status_since")
        return cls(
            id=ident,
            number=number,
            title=title,
            status=status,
            groups=tuple(groups),
            signatures=tuple(signatures),
            reports=tuple(reports),
            revisit_when=dict(revisit),
            stale=bool(data.get("stale")),
            stale_reason=str(data.get("stale_reason") or ""),
            status_since=str(since) if since else None,
        )


def _strings(value: Any, fail: Any, name: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise fail(f"'{name}' must be a list of strings")
    return list(value)


# ---------------------------------------------------------------- versions and revisit-when


def normalise_package(name: str) -> str:
    """`Flashinfer-Python` -> `flashinfer`: the key the parser gives the document's `versions`."""
    key = name.strip().lower().replace("-", "_").replace(".", "_")
    return PACKAGE_ALIASES.get(key, key)


def document_versions(document: Mapping[str, Any]) -> dict[str, str]:
    """The versions a document shows, by package key; the server's own version from `server_version`
    when `versions` lacks it."""
    versions: dict[str, str] = {}
    for key, value in (document.get("versions") or {}).items():
        if isinstance(key, str) and isinstance(value, str | int | float) and str(value).strip():
            versions.setdefault(normalise_package(key), str(value).strip())
    server, server_version = document.get("server"), document.get("server_version")
    if server in ("sglang", "vllm") and isinstance(server_version, str) and server_version.strip():
        versions.setdefault(str(server), server_version.strip())
    return versions


def revisit_hit(revisit_when: Mapping[str, str], versions: Mapping[str, str]) -> RevisitHit | None:
    """The first package (in the condition's order) whose version meets its specifier, or None. A
    version or specifier that cannot be read meets nothing."""
    for package, spec in revisit_when.items():
        version = versions.get(normalise_package(package))
        if not version:
            continue
        try:
            held = SpecifierSet(spec).contains(version)
        except InvalidSpecifier:
            continue
        if held:
            return RevisitHit(normalise_package(package), version, "".join(spec.split()))
    return None


def can_go_stale(record: DecisionRecord) -> bool:
    """A superseded record is replaced by another one: revisiting it is its successor's business."""
    return bool(record.revisit_when) and not record.stale and record.status != DecisionStatus.SUPERSEDED


# ---------------------------------------------------------------- records in a document


def decision_ref(
    record: DecisionRecord, versions: Mapping[str, str] | None = None, *, source: str = "this log"
) -> DecisionRef:
    """The record as a document lists it; stale also when `versions` (the document's) meet its
    revisit-when condition, with the reason naming `source`."""
    stale, reason = record.stale, record.stale_reason
    if versions is not None and can_go_stale(record):
        hit = revisit_hit(record.revisit_when, versions)
        if hit is not None:
            stale, reason = True, hit.reason(source)
    return {
        "id": record.id,
        "number": record.number,
        "title": record.title,
        "status": record.status.value,
        "stale": stale,
        "stale_reason": (reason or "its revisit-when condition is met") if stale else None,
        "status_since": record.status_since,
    }


def order_records(records: Iterable[DecisionRecord]) -> list[DecisionRecord]:
    """Accepted first, then proposed, rejected, superseded; newest first within each."""
    return sorted(records, key=lambda r: (STATUS_ORDER[r.status], -r.number, r.id))


def linked_to_document(
    document: Mapping[str, Any], records: Iterable[DecisionRecord], *, report_id: int | None = None
) -> list[DecisionRecord]:
    """Records linked to the document's fingerprint, its top signature, or (given) its report id."""
    fingerprint = document.get("fingerprint")
    matches = [m for m in document.get("matches") or [] if isinstance(m, dict)]
    top = matches[0].get("id") if matches else None
    found = [
        r
        for r in records
        if (fingerprint and fingerprint in r.groups)
        or (top and top in r.signatures)
        or (report_id is not None and report_id in r.reports)
    ]
    return order_records(found)


def attach_decisions(
    document: dict[str, Any],
    records: Sequence[DecisionRecord],
    *,
    report_id: int | None = None,
    source: str = "this log",
) -> None:
    """Set `document["decisions"]` and every `document["matches"][i]["decisions"]` to the linked records
    (DecisionRef), stale also where the document's own versions meet a revisit-when condition."""
    versions = document_versions(document)
    document["decisions"] = [
        decision_ref(r, versions, source=source)
        for r in linked_to_document(document, records, report_id=report_id)
    ]
    for match in document.get("matches") or []:
        if isinstance(match, dict):
            signature = match.get("id")
            match["decisions"] = [
                decision_ref(r, versions, source=source)
                for r in order_records(r for r in records if signature in r.signatures)
            ]


def decision_sentence(ref: Mapping[str, Any]) -> str:
    """What the report page and the CLI say of a record: `Accepted 2026-11-02: MTP off on sm_120 until
    flashinfer ships SM120 trtllm-gen kernels, DR-7`."""
    status = str(ref.get("status") or "").capitalize()
    since = str(ref.get("status_since") or "")[:10]
    head = f"{status} {since}".strip()
    return f"{head}: {ref.get('title')}, DR-{ref.get('number')}"


def render_decisions(document: Mapping[str, Any], *, total: int | None = None) -> str:
    """The decisions part of the CLI's summary (after `attach_decisions`)."""
    refs = [r for r in document.get("decisions") or [] if isinstance(r, dict)]
    out = [""]
    if not refs:
        among = f" (of {total} in the file)" if total is not None else ""
        out.append(f"decisions  none recorded for this failure{among}")
        return "\n".join(out) + "\n"
    out.append("decisions where this failure recurs")
    for ref in refs:
        out.append(f"  {decision_sentence(ref)}")
        if ref.get("stale"):
            reason = ref.get("stale_reason") or "its revisit-when condition is met"
            out.append(f"    stale: {reason}: time to revisit it")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- exported files and drafts


def load_decisions(path: str | Path) -> list[DecisionRecord]:
    """Read `{"decisions": [<record as the API gives it>, ...]}` (GET /api/v1/decisions?format=export;
    a page of the plain list, `{"results": [...]}`, is read too)."""
    name = str(path)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as error:
        raise DecisionsReadError(
            f"{name}: cannot read the decisions file: {error.strerror or error}"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DecisionsReadError(f"{name}: the decisions file is not JSON: {error}") from None
    items = None
    if isinstance(data, dict):
        items = data.get("decisions", data.get("results"))
    if not isinstance(items, list):
        raise DecisionsReadError(
            f'{name}: expected {{"decisions": [...]}} as GET /api/v1/decisions?format=export gives it'
        )
    records = []
    for index, item in enumerate(items):
        try:
            records.append(DecisionRecord.from_dict(item, where=f"{name}: decisions[{index}]"))
        except ValueError as error:
            raise DecisionsReadError(str(error)) from None
    return records


def alternatives_from_tried(tried_and_failed: Iterable[Any]) -> list[dict[str, str]]:
    """A match's `fix.tried_and_failed` ("what: why") as a record's alternatives ({what, outcome})."""
    out = []
    for item in tried_and_failed:
        text = " ".join(str(item).split())
        if not text:
            continue
        what, sep, outcome = text.partition(": ")
        out.append(
            {"what": what.strip(), "outcome": outcome.strip()} if sep else {"what": text, "outcome": ""}
        )
    return out


def draft_from_document(document: Mapping[str, Any]) -> dict[str, Any]:
    """What "Record a decision" fills in from a diagnosis: the title, the alternatives its top match
    tried, and links to its fingerprint and signature."""
    matches = [m for m in document.get("matches") or [] if isinstance(m, dict)]
    top: dict[str, Any] = matches[0] if matches else {}
    fix: dict[str, Any] = top["fix"] if isinstance(top.get("fix"), dict) else {}
    crash: dict[str, Any] = document["crash"] if isinstance(document.get("crash"), dict) else {}
    title = str(top.get("title") or crash.get("exception") or "")
    fingerprint = document.get("fingerprint")
    return {
        "title": title[:300],
        "alternatives": alternatives_from_tried(fix.get("tried_and_failed") or []),
        "groups": [str(fingerprint)] if fingerprint and document.get("failure_class") != "none" else [],
        "signatures": [str(top["id"])] if top.get("id") else [],
    }
