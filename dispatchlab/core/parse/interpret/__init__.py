"""The interpret stage: pure functions from Observations to a typed ParsedLog."""

from __future__ import annotations

from typing import Any

from dispatchlab.core.parse.interpret.backends import resolve_backends
from dispatchlab.core.parse.interpret.crash import crash_event, decide_crash
from dispatchlab.core.parse.interpret.phases import fill_year, outcome, phase_spans
from dispatchlab.core.parse.interpret.runs import summarise_run
from dispatchlab.core.parse.interpret.server import decide_gpu, model_name, server_args
from dispatchlab.core.parse.interpret.server_evidence import decide_server
from dispatchlab.core.parse.model import Event, Metrics, ParsedLog
from dispatchlab.core.parse.observations import Observations
from dispatchlab.core.parse.vocabulary import MAX_ERRORS, MAX_TIMELINE_EVENTS, rank_sort_key


def _metrics(obs: Observations) -> Metrics:
    points = obs.metric_points
    every = max(1, round(obs.metric_total / len(points))) if points else 1
    return Metrics(points=points, total=obs.metric_total, sampled_every=every)


def _ranks(timeline: list[Event], metrics: Metrics) -> list[str]:
    ranks = {e.rank for e in timeline if e.rank} | {p["rank"] for p in metrics.points if p.get("rank")}
    return sorted(ranks, key=rank_sort_key)


def _tail_lines(tail: bytes, keep: int = 40) -> list[str]:
    lines = tail.decode("utf-8", errors="replace").splitlines()
    return [line[:400] for line in lines[-keep:] if line.strip()]


def _checks_sampled(obs: Observations) -> dict[str, Any] | None:
    if not obs.unsampled_bytes:
        return None
    from dispatchlab.core.parse.rules import SAMPLED

    where = "its first and last 8 MB and one 8 MB stretch in eight between"
    if obs.sampled_stream:
        where = "its first 8 MB and one 8 MB stretch in eight after it (a compressed or piped log's end is not known as it is read)"
    return {
        "checks": dict(SAMPLED),
        "checked_bytes": obs.scanned_bytes - obs.unsampled_bytes,
        "total_bytes": obs.scanned_bytes,
        "where": where,
    }


def interpret(obs: Observations) -> ParsedLog:
    engine, server_origin = decide_server(obs)
    server = engine if engine in ("sglang", "vllm") else "unknown"
    version = obs.versions.get(server) if server != "unknown" else None
    args = server_args(obs, server)
    main, draft = resolve_backends(obs, server, version, args)
    timeline = sorted(obs.timeline, key=lambda e: e.line)
    truncated = obs.truncated_events
    crash = decide_crash(obs)
    if crash is not None:
        if len(timeline) < MAX_TIMELINE_EVENTS:
            timeline.append(crash_event(crash, timeline))
            timeline.sort(key=lambda e: e.line)
        else:
            truncated += 1
    doc = ParsedLog(
        server=server,
        server_version=version,
        server_origin=server_origin if server != "unknown" else None,
        engine=engine,
        model=model_name(obs, args),
        gpu=decide_gpu(obs, args),
        server_args=args,
        server_args_complete=obs.server_args_complete,
        launch_command=obs.launch_command,
        backends={k: v.value for k, v in main.items()},
        draft_backends={k: v.value for k, v in draft.items()},
        backend_origins=main,
        draft_backend_origins=draft,
        timeline=timeline,
        tracebacks=obs.tracebacks,
        kernels=list(obs.kernels),
        crash=crash,
        outcome=outcome(obs, crash),
        versions=obs.versions,
        phases=phase_spans(obs, crash, timeline),
        metrics=_metrics(obs),
        sources=obs.sources,
        line_count=obs.line_count,
        errors=sorted(obs.errors.values(), key=lambda e: e.line)[:MAX_ERRORS],
        warnings_count=obs.warnings_count,
        truncated_events=truncated,
        nccl_transports=obs.nccl_transports,
        runs=[*obs.runs, summarise_run(obs, obs.line_count, crash)] if obs.runs else [],
        runs_omitted=obs.runs_omitted,
        tracebacks_omitted=obs.tracebacks_omitted,
        errors_omitted=obs.errors_omitted,
        checks_sampled=_checks_sampled(obs),
        pattern_hits=obs.pattern_hits,
        tail=_tail_lines(obs.tail),
    )
    doc.ranks = _ranks(timeline, doc.metrics)
    # vLLM and glog timestamps carry no year: take it from any dated line, else mark it as a placeholder
    doc.time_year_known = obs.year is not None or not any(
        e.time and e.time.startswith("0000") for e in timeline
    )
    fill_year(doc, obs.year or "1900")
    return doc
