"""Turn a match document into what the report page shows. Plain data in, plain data out (no DB),
so the views stay thin and this is tested with hand-written documents."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from dispatchlab.front.compare import BackendRow, backend_rows, ordered_keys, show

# Notes of the knowledge base's authors (`research:seed-case.md`): not a page a reader can open, so never shown.
INTERNAL_REFERENCE_PREFIXES = ("research:",)

ORIGIN_HELP = {
    "flag": "set by a launch flag",
    "args": "read from the server-args dump",
    "message": "reported by a log message",
    "default": "no line names it: the server's default",
    "inherited": "not set for the draft: it takes the main model's value",
}


def flag_name(key: str) -> str:
    """`moe_runner_backend` or `--moe-runner-backend` -> `--moe-runner-backend`."""
    return key if key.startswith("-") else "--" + key.replace("_", "-")


def fix_patch(fix: dict[str, Any] | None) -> str:
    """The fix as a copyable launch-arg patch: env assignments, then flags to add or remove.

    A null or false value means "drop this flag"; true means a bare switch."""
    if not fix:
        return ""
    lines: list[str] = []
    for key, value in (fix.get("env") or {}).items():
        lines.append(f"unset {key}" if value is None else f"export {key}={shlex.quote(show(value))}")
    for key, value in (fix.get("args") or {}).items():
        flag = flag_name(str(key))
        if value is None or value is False:
            lines.append(f"# remove {flag}")
        elif value is True:
            lines.append(flag)
        elif isinstance(value, list):
            lines.append(f"{flag} " + " ".join(shlex.quote(show(v)) for v in value))
        else:
            lines.append(f"{flag} {shlex.quote(show(value))}")
    return "\n".join(lines)


@dataclass
class MatchView:
    id: str
    title: str
    failure_class: str
    confidence: float
    level: str
    severity: str
    explanation: str
    fix_summary: str
    patch: str
    tried_and_failed: list[str]
    evidence: list[dict[str, Any]]
    references: list[str]
    facts: list[tuple[str, str]]
    decisions: list[str]
    source: str = "signature"  # "exception": diagnosed from the terminal exception, no signature
    withheld: list[str] = field(default_factory=list)  # fix flags the log's server does not take

    @property
    def confidence_pct(self) -> int:
        return round(self.confidence * 100)


def _evidence(match: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    seen = set()
    for item in match.get("evidence") or []:
        if isinstance(item, dict) and isinstance(item.get("line"), int) and item["line"] not in seen:
            seen.add(item["line"])
            out.append({"line": item["line"], "text": str(item.get("text") or "")})
    for line in match.get("lines") or []:
        if isinstance(line, int) and line not in seen:
            seen.add(line)
            out.append({"line": line, "text": ""})
    return sorted(out, key=lambda item: item["line"])


def match_views(doc: dict[str, Any]) -> list[MatchView]:
    views = []
    for match in doc.get("matches") or []:
        if not isinstance(match, dict):
            continue
        fix = match.get("fix") or {}
        try:
            confidence = float(match.get("confidence") or 0.0)
        except (TypeError, ValueError):
            confidence = 0.0
        views.append(
            MatchView(
                id=str(match.get("id") or ""),
                title=str(match.get("title") or match.get("id") or "untitled match"),
                failure_class=str(match.get("failure_class") or "other"),
                confidence=confidence,
                level=str(match.get("level") or "failure"),
                severity=str(match.get("severity") or ""),
                explanation=str(match.get("explanation") or ""),
                fix_summary=str(fix.get("summary") or ""),
                patch=fix_patch(fix),
                tried_and_failed=[str(item) for item in fix.get("tried_and_failed") or []],
                evidence=_evidence(match),
                references=[
                    str(ref)
                    for ref in match.get("references") or []
                    if not str(ref).startswith(INTERNAL_REFERENCE_PREFIXES)
                ],
                facts=[(str(k), show(v)) for k, v in (match.get("facts") or {}).items()],
                decisions=[str(d) for d in match.get("decisions") or []],
                source=str(match.get("source") or "signature"),
                withheld=[str(flag) for flag in fix.get("withheld_args") or {}],
            )
        )
    return views


@dataclass
class BackendPair:
    key: str
    main: BackendRow | None
    draft: BackendRow | None

    @property
    def draft_differs(self) -> bool:
        return bool(self.main and self.draft and self.draft.a.value != self.main.a.value)


def backend_pairs(doc: dict[str, Any]) -> list[BackendPair]:
    """Main and draft side by side, one row per backend key, with where each value came from."""
    rows = backend_rows(doc, {})
    main = {row.key: row for row in rows if row.model == "main"}
    draft = {row.key: row for row in rows if row.model == "draft"}
    return [BackendPair(key, main.get(key), draft.get(key)) for key in ordered_keys(main, draft)]


@dataclass
class Header:
    server: str
    server_version: str
    gpu_name: str
    arch: str
    compute_capability: str
    gpu_count: str
    model: str
    outcome: str
    failure_class: str
    ranks: list[str]
    launch_command: str
    crash: dict[str, Any] | None
    sources: list[dict[str, Any]] = field(default_factory=list)
    line_count: int = 0
    # how the server was known: "" (its own line format, or unknown), else the line that named it
    server_inferred_line: int | None = None
    server_inferred_text: str = ""


def header(doc: dict[str, Any]) -> Header:
    gpu = doc.get("gpu") or {}
    crash = doc.get("crash") if isinstance(doc.get("crash"), dict) else None
    return Header(
        server=str(doc.get("server") or "unknown"),
        server_version=str(doc.get("server_version") or ""),
        gpu_name=str(gpu.get("name") or ""),
        arch=str(gpu.get("arch") or ""),
        compute_capability=str(gpu.get("compute_capability") or ""),
        gpu_count=str(gpu.get("count") or ""),
        model=str(doc.get("model") or ""),
        outcome=str(doc.get("outcome") or "incomplete"),
        failure_class=str(doc.get("failure_class") or "none"),
        ranks=[str(r) for r in doc.get("ranks") or []],
        launch_command=str(doc.get("launch_command") or ""),
        crash=crash,
        sources=[s for s in doc.get("sources") or [] if isinstance(s, dict)],
        line_count=int(doc.get("line_count") or 0),
        **_server_inference(doc),
    )


def _server_inference(doc: dict[str, Any]) -> dict[str, Any]:
    origin = doc.get("server_origin")
    if not isinstance(origin, dict) or origin.get("source") != "inferred":
        return {}
    line = origin.get("line")
    return {
        "server_inferred_line": line if isinstance(line, int) else None,
        "server_inferred_text": str(origin.get("text") or ""),
    }


def evidence_lines(doc: dict[str, Any]) -> list[int]:
    lines: set[int] = set()
    for match in doc.get("matches") or []:
        for item in _evidence(match if isinstance(match, dict) else {}):
            lines.add(item["line"])
    return sorted(lines)
