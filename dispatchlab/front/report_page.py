"""What the report page shows of a document beyond the presenters: a short log as a list of events instead
of a chart, the line where the exception is printed, evidence folded across ranks, references as links."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from dispatchlab.core import crashline
from dispatchlab.core.lineindex import LineIndex
from dispatchlab.front import figures
from dispatchlab.front.figures import UNKNOWN_YEAR
from dispatchlab.reports.models import Report

# Fewer places on the axis than this make a chart of fractional ticks or a 1 ms axis: a list instead.
MIN_CHART_EVENTS = 3
EXCERPT_CHARS = 240

GITHUB_ISSUE = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)#(?P<number>\d+)$")
SOURCE_PATH = re.compile(r"^(?P<project>[\w-]+):(?P<path>[\w./-]+)")
# Source references name a project's file as `project:path`; these are the projects' repositories.
SOURCE_REPOS = {
    "sglang": "sgl-project/sglang",
    "vllm": "vllm-project/vllm",
    "flashinfer": "flashinfer-ai/flashinfer",
    "pytorch": "pytorch/pytorch",
    "triton": "triton-lang/triton",
    "nccl": "NVIDIA/nccl",
    "transformers": "huggingface/transformers",
}
RANK_MARK = re.compile(r"\b(?:TP|DP|EP|PP|rank\s*|Worker_TP|EngineCore_DP)(\d+)\b")
RANK_PREFIX = re.compile(r"^\s*(?:\[[^\]]{0,80}\]\s*|\([^)]{0,60}pid=\d+\)\s*)+")


def reference_url(reference: str) -> str:
    """A link for a knowledge-base reference: `owner/repo#N` is a GitHub thread (GitHub sends an issue URL
    on to the pull request of that number), `project:path` a file of a known project; else ''."""
    text = reference.strip()
    if text.lower().startswith(("http://", "https://")):
        return text
    issue = GITHUB_ISSUE.match(text)
    if issue:
        return f"https://github.com/{issue['repo']}/issues/{issue['number']}"
    source = SOURCE_PATH.match(text)
    if source and source["project"] in SOURCE_REPOS:
        return f"https://github.com/{SOURCE_REPOS[source['project']]}/blob/main/{source['path'].strip('/')}"
    return ""


def _event_item(event: dict[str, Any]) -> dict[str, Any]:
    return {
        "line": event.get("line"),
        "time": _shown_time(event.get("time")),
        "rank": event.get("rank") or "",
        "kind": str(event.get("kind") or "event"),
        "name": str(event.get("name") or "").replace("_", " "),
        "detail": str(event.get("detail") or ""),
    }


def _shown_time(value: Any) -> str:
    """An ISO time as the log would print it: vLLM's `MM-DD HH:MM:SS` lines have no year (1900 in
    the document), so none is shown for them."""
    text = str(value or "").replace("T", " ")
    return text[5:] if text.startswith(f"{UNKNOWN_YEAR}-") else text


def event_list(doc: dict[str, Any], *, crash_line: int | None = None) -> list[dict[str, Any]] | None:
    """The events of a short log in log order, or None when they take enough places on the
    timeline's axis (MIN_CHART_EVENTS) to draw it. The traceback and the crash it ends in, printed
    on one line, are one event."""
    if figures.timeline_positions(doc) >= MIN_CHART_EVENTS:
        return None
    items = [_event_item(event) for event in doc.get("timeline") or [] if isinstance(event, dict)]
    items += [
        _event_item(
            {
                "line": phase.get("start_line"),
                "time": phase.get("start"),
                "rank": phase.get("rank"),
                "kind": "phase",
                "name": phase.get("name"),
                "detail": phase.get("detail"),
            }
        )
        for phase in doc.get("phases") or []
        if isinstance(phase, dict)
    ]
    crash = doc.get("crash")
    if isinstance(crash, dict):
        headline = ": ".join(str(part) for part in (crash.get("exception"), crash.get("message")) if part)
        at = crash_line or crashline.crash_line(doc)
        # the traceback's and the crash's own events are this one item, on the crash's line
        items = [
            item
            for item in items
            if not (
                item["kind"] == "error"
                and (item["line"] in (crash.get("line"), at) or item["name"] == "crash")
            )
        ]
        crash_item = {"line": at, "time": "", "kind": "crash", "name": "crash"}
        items.append(crash_item | {"rank": crash.get("rank") or "", "detail": headline})
    return sorted(items, key=lambda item: item["line"] if isinstance(item["line"], int) else 0)


def exception_line(doc: dict[str, Any], index: LineIndex | None) -> int | None:
    """The crash's line (dispatchlab.core.crashline): where "Jump to crash", the log viewer, the timeline
    and the evidence all point; an older document's is looked up in the log text when it can be read."""
    return crashline.crash_line(doc, index.read_lines if index is not None else None)


@dataclass
class EvidenceLine:
    line: int
    text: str
    ranks: list[str] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    crash: bool = False  # the crash's own line (named as the header and the log viewer name it)


def _rank_of(text: str) -> str:
    prefix = RANK_PREFIX.match(text)
    found = RANK_MARK.search(prefix.group(0)) if prefix else None
    return found.group(0).replace(" ", "") if found else ""


def excerpt(text: str, focus: list[str], limit: int = EXCERPT_CHARS) -> str:
    """At most `limit` characters of a line, centred on the first fact value it holds (the kernel
    name, say) rather than cut after its first `limit` characters."""
    if len(text) <= limit:
        return text
    spot = next((text.find(value) for value in focus if value and value in text), -1)
    if spot < 0:
        return text[: limit - 1] + "…"
    start = max(0, min(spot - limit // 3, len(text) - limit))
    if start:  # begin at a word, not inside one ("…OfMemoryError")
        space = text.find(" ", start, spot)
        start = space + 1 if space >= 0 else start
    cut = text[start : start + limit]
    return ("…" if start else "") + cut + ("…" if start + limit < len(text) else "")


def folded_evidence(
    evidence: list[dict[str, Any]], facts: list[tuple[str, str]], *, crash_line: int | None = None
) -> list[EvidenceLine]:
    """Identical evidence printed by several ranks, as one line that lists those ranks; the one holding
    the crash's line names that line and says it is the crash."""
    focus = sorted((value for _key, value in facts if len(value) >= 6), key=len, reverse=True)
    folded: dict[str, EvidenceLine] = {}
    for item in evidence:
        raw = str(item.get("text") or "")
        body = RANK_PREFIX.sub("", raw).strip()
        key = body or f"line {item['line']}"
        entry = folded.setdefault(key, EvidenceLine(line=item["line"], text=excerpt(body, focus)))
        entry.lines.append(item["line"])
        rank = _rank_of(raw)
        if rank and rank not in entry.ranks:
            entry.ranks.append(rank)
    for entry in folded.values():
        if crash_line is not None and crash_line in entry.lines:
            entry.line, entry.crash = crash_line, True
    return sorted(folded.values(), key=lambda entry: entry.line)


def duplicate_message(report: Report) -> str:
    """What an upload of bytes the project already holds says: the upload service stores nothing and
    hands back the report those bytes made (same project, same sha256 checksum)."""
    when = timezone.localtime(report.created_at).strftime("%Y-%m-%d %H:%M")
    busy = report.status in (Report.Status.QUEUED, Report.Status.PARSING)
    again = " Its analysis is under way." if busy else ""
    return (
        f"This file was already uploaded as report #{report.pk} on {when}: nothing new was stored, "
        f"this is that report.{again}"
    )
