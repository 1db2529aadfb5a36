"""The ten-second summary of a parsed (or matched) document, for people at a terminal."""

from __future__ import annotations

import textwrap
from typing import Any

from dispatchlab.core import crashline


def _fmt_seconds(value: float | None) -> str:
    if value is None:
        return "?"
    if value < 60:
        return f"{value:.1f}s"
    return f"{int(value // 60)}m{int(value % 60):02d}s"


def _arg_patch(args: dict[str, Any]) -> str:
    """`--flag value`, a bare `--flag` for true, `(remove --flag)` for false."""
    parts = []
    for flag, value in args.items():
        parts.append(flag if value is True else f"(remove {flag})" if value is False else f"{flag} {value}")
    return " ".join(parts)


def _rank_span(ranks: list[str]) -> str:
    if len(ranks) <= 2:
        return ", ".join(ranks)
    return f"{ranks[0]}..{ranks[-1]} ({len(ranks)})"


def _head(doc: dict[str, Any]) -> list[str]:
    gpu = doc.get("gpu") or {}
    server = doc.get("server") or "unknown"
    if server == "unknown" and doc.get("engine"):
        server = f"unknown ({doc['engine']})"
    gpu_text = gpu.get("name") or "?"
    if gpu.get("count"):
        gpu_text = f"{gpu['count']}x {gpu_text}"
    out = [
        f"server   {server} {doc.get('server_version') or ''}".rstrip(),
        f"gpu      {gpu_text}  arch {gpu.get('arch') or '?'}",
        f"model    {doc.get('model') or '?'}",
    ]
    versions = {k: v for k, v in (doc.get("versions") or {}).items() if v}
    if versions:
        out.append("versions " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    out.append(f"outcome  {doc.get('outcome')}   ({doc.get('line_count', 0):,} lines)")
    sampled = doc.get("checks_sampled")
    if sampled:
        checked, total = sampled["checked_bytes"] / 1e6, sampled["total_bytes"] / 1e6
        where = sampled.get("where") or "some stretches of it"
        out.append(
            f"sampled  {'; '.join(sampled['checks'].values())}: looked for in {checked:,.0f} of {total:,.0f} MB "
            f"({where})"
        )
    return out + describe_runs(doc.get("runs") or [], doc.get("runs_omitted_by_fingerprint") or {})


def _backends(doc: dict[str, Any]) -> list[str]:
    main = doc.get("backends") or {}
    draft = doc.get("draft_backends") or {}
    if not main and not draft:
        return []
    origins = doc.get("backend_origins") or {}
    draft_origins = doc.get("draft_backend_origins") or {}
    keys = [k for k in main if k != "speculative_algorithm"] + [
        k for k in draft if k not in main and k != "speculative_algorithm"
    ]
    width = max(len(k) for k in keys) if keys else 10
    header = f"  {'backend':<{width}}  {'main':<24}"
    if draft:
        header += f"  draft ({draft.get('speculative_algorithm', 'speculative')})"
    out = ["", header]
    for key in keys:
        m_val = main.get(key, "-")
        m_src = (origins.get(key) or {}).get("source", "")
        row = f"  {key:<{width}}  {m_val + (' [' + m_src + ']' if m_src else ''):<24}"
        if draft:
            d_val = draft.get(key, "-")
            d_src = (draft_origins.get(key) or {}).get("source", "")
            marker = "  <- differs" if key in main and key in draft and d_val != m_val else ""
            row += f"  {d_val}{' [' + d_src + ']' if d_src else ''}{marker}"
        out.append(row)
    return out


def _phases(doc: dict[str, Any]) -> list[str]:
    phases = doc.get("phases") or []
    if not phases:
        return []
    out = ["", "  phases"]
    # one row per phase and model: ranks that went through it the same way are folded together
    rows: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for phase in phases:
        rows.setdefault((phase["name"], phase.get("model") or "main", phase.get("detail") or ""), []).append(
            phase
        )
    for (name, model, detail), group in list(rows.items())[:16]:
        ranks = [p["rank"] for p in group if p.get("rank")]
        lane = _rank_span(ranks) + (" draft" if model == "draft" else "")
        seconds = [p["seconds"] for p in group if p.get("seconds") is not None]
        took = _fmt_seconds(max(seconds)) if seconds else "?"
        extra = f"  ({detail})" if detail else ""
        out.append(f"  {lane.strip() or '-':<16} {name:<20} {took:>8}  line {group[0]['start_line']}{extra}")
    return out


def _crash(doc: dict[str, Any]) -> list[str]:
    out: list[str] = []
    crash = doc.get("crash")
    if crash:
        where = crash.get("phase") or "unknown phase"
        if crash.get("model") == "draft":
            where += " of the draft model"
        ranks = crash.get("ranks") or []
        out += [
            "",
            f"CRASH    line {crashline.crash_line(doc)} in {where}"
            + (f", ranks {', '.join(ranks[:8])}" if ranks else ""),
            f"         {crash.get('exception') or 'fatal'}: {(crash.get('message') or '')[:300]}",
        ]
    kernels = doc.get("kernels") or []
    if kernels:
        out.append(f"kernels  {', '.join(kernels[:6])}")
    return out


def _indices(indices: list[int]) -> str:
    """`1-3, 5`: run numbers folded into ranges (a crash loop has thousands)."""
    spans: list[list[int]] = []
    for index in indices:
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans[:12])
    return text + (", ..." if len(spans) > 12 else "")


def _ending(run: dict[str, Any]) -> str:
    if run.get("outcome") != "crashed":
        return str(run.get("outcome"))
    where = f" in {run['phase']}" if run.get("phase") else ""
    what = run.get("exception") or "fatal"
    message = (run.get("message") or "")[:120]
    return f"crashed{where}: {what}" + (f": {message}" if message else "")


def describe_runs(runs: list[dict[str, Any]], omitted: dict[str, int] | None = None) -> list[str]:
    """A file of several runs in a few lines: "N runs, all crashed the same way", or how they ended, each
    way with its runs (runs that ended the same way share a fingerprint). `omitted`: the runs a long crash
    loop's document does not list, counted by fingerprint."""
    if len(runs) < 2:
        return []
    omitted = omitted or {}
    ways: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        ways.setdefault(str(run.get("fingerprint")), []).append(run)
    total = len(runs) + sum(omitted.values())
    last = runs[-1]
    which = f"the diagnosis is run {last['index']}'s (lines {last['first_line']}-{last['last_line']})"
    if len(ways) == 1 and set(omitted) <= set(ways):
        verb = "crashed" if last.get("outcome") == "crashed" else f"ended {last.get('outcome')}"
        return [f"runs     {total:,} runs, all {verb} the same way; {which}", f"         {_ending(last)}"]
    out = [f"runs     {total:,} runs ended {len(ways.keys() | omitted.keys())} different ways; {which}"]
    for fingerprint, group in ways.items():
        label = "run" if len(group) == 1 else "runs"
        more = omitted.get(fingerprint, 0)
        listed = _indices([r["index"] for r in group]) + (f" ... and {more:,} more" if more else "")
        out.append(f"         {label} {listed}: {_ending(group[0])}")
    unlisted = sum(count for fingerprint, count in omitted.items() if fingerprint not in ways)
    if unlisted:
        out.append(f"         ... and {unlisted:,} more runs that ended other ways")
    return out


def _wrapped(text: str, label: str) -> str:
    return textwrap.fill(
        " ".join(text.split()), 110, initial_indent=f"         {label}: ", subsequent_indent=" " * 14
    )


def _matches(doc: dict[str, Any]) -> list[str]:
    matches = doc.get("matches")
    if matches is None:
        return []
    out = ["", f"failure class  {doc.get('failure_class')}   fingerprint {doc.get('fingerprint') or '-'}"]
    if doc.get("class_source") == "model":
        out.append(
            f"               from the learned fallback, confidence {doc.get('class_confidence') or 0:.2f}"
        )
    if doc.get("low_confidence"):
        guesses = ", ".join(f"{g['class']} {g['probability']:.2f}" for g in doc.get("best_guesses") or [])
        out.append(f"               low confidence — best guesses: {guesses}")
    for match in matches[:5]:
        out.append(f"  [{match['confidence']:.2f}] {match['id']}: {match['title']}")
        fix = match.get("fix") or {}
        if fix.get("summary"):
            out.append(_wrapped(fix["summary"], "fix"))
        if fix.get("args"):
            out.append("         args: " + _arg_patch(fix["args"]))
        out += [_wrapped(tried, "tried, did not help") for tried in fix.get("tried_and_failed") or []]
        if match.get("lines"):
            out.append("         evidence lines: " + ", ".join(str(n) for n in match["lines"][:8]))
    return out


def _similar(doc: dict[str, Any]) -> list[str]:
    cases = (doc.get("similar") or {}).get("cases") or []
    out = ["", "similar known cases"] if cases else []
    for case in cases:
        out.append(f"  [{case['score']:.2f}] {case['failure_class']}: {case['title']}  {case['url']}")
        if case.get("fix"):
            out.append(_wrapped(case["fix"], "fixed by"))
    return out


def render_summary(doc: dict[str, Any]) -> str:
    """The ten-second summary of `dispatchlab parse` / `match`: server, GPU, backends, phases, crash, matches,
    similar known cases."""
    out = [*_head(doc), *_backends(doc), *_phases(doc), *_crash(doc), *_matches(doc), *_similar(doc)]
    return "\n".join(out) + "\n"
