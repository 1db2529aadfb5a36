"""Startup phases per rank and model (spans between milestones), the outcome, and the timestamps' year."""

from __future__ import annotations

from dispatchlab.core.parse.model import Crash, Event, ParsedLog, PhaseSpan
from dispatchlab.core.parse.observations import Milestone, Observations
from dispatchlab.core.parse.vocabulary import Phase

# phase -> (milestone that opens it, milestone that closes it)
_SPANS = {
    Phase.WEIGHT_LOADING: ("weights_begin", "weights_end"),
    Phase.CUDA_GRAPH_CAPTURE: ("cuda_graph_begin", "cuda_graph_end"),
    Phase.INIT: ("init_dist_begin", "init_dist_end"),
}


def seconds_between(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    from datetime import datetime

    try:
        a = datetime.fromisoformat(start.replace("0000-", "2000-", 1))
        b = datetime.fromisoformat(end.replace("0000-", "2000-", 1))
    except ValueError:
        return None
    return round((b - a).total_seconds(), 3)


def _time_near(timeline: list[Event], line: int) -> str | None:
    best = None
    for event in timeline:
        if event.time:
            if event.line <= line:
                best = event.time
            else:
                return best or event.time
    return best


def _span(
    rank: str | None,
    model: str,
    phase: Phase,
    events: list[Milestone],
    crash: Crash | None,
    timeline: list[Event],
) -> PhaseSpan | None:
    begin, end = _SPANS[phase]
    opened = next((e for e in events if e.name == begin), None)
    if opened is None:
        return None
    closed = next((e for e in events if e.name == end and e.line > opened.line), None)
    if closed is None and phase == Phase.INIT:
        closed = next((e for e in events if e.line > opened.line), None)
    if closed is not None:
        end_line, end_time, detail = closed.line, closed.time, ""
    elif crash is not None and crash.line > opened.line:
        end_line, end_time, detail = crash.line, _time_near(timeline, crash.line), "crashed"
    else:
        end_line, end_time, detail = None, None, "did not finish in the log"
    seconds = seconds_between(opened.time, end_time)
    return PhaseSpan(rank, model, phase, opened.line, end_line, opened.time, end_time, seconds, detail)


def phase_spans(obs: Observations, crash: Crash | None, timeline: list[Event]) -> list[PhaseSpan]:
    lanes: dict[tuple[str | None, str], list[Milestone]] = {}
    for milestone in obs.milestones:
        lanes.setdefault((milestone.rank, milestone.model), []).append(milestone)
    spans: list[PhaseSpan] = []
    for (rank, model), events in lanes.items():
        for phase in _SPANS:
            span = _span(rank, model, phase, events, crash, timeline)
            if span is not None:
                spans.append(span)
        kv = next((e for e in events if e.name == "kv_cache_allocated"), None)
        if kv:
            spans.append(PhaseSpan(rank, model, Phase.KV_CACHE, kv.line, kv.line, kv.time, kv.time, 0.0, ""))
    ready = next((m for m in obs.milestones if m.name == "ready"), None)
    if ready:
        last_line = obs.last_metric_line or ready.line
        seconds = seconds_between(ready.time, obs.last_time)
        spans.append(
            PhaseSpan(
                None, "main", Phase.SERVING, ready.line, last_line, ready.time, obs.last_time, seconds, ""
            )
        )
    spans.sort(key=lambda p: p.start_line)
    for span in spans:
        span.name = str(span.name)
    return spans


def outcome(obs: Observations, crash: Crash | None) -> str:
    if crash is not None:
        return "crashed"
    # the metric count is the file's; a later run of several answered when its own sampled lines show it
    metrics = (
        obs.metric_total > 0 if obs.run_first_line == 1 else (obs.last_metric_line or 0) >= obs.run_first_line
    )
    answered = obs.first_decode_line is not None or metrics or obs.served_line is not None
    if obs.ready_line is not None:
        return "serving" if answered else "ready"
    return "serving" if answered else "incomplete"


def fill_year(doc: ParsedLog, year: str) -> None:
    """vLLM and glog times carry no year ("0000-"): take the log's, or a placeholder."""

    def fix(value: str | None) -> str | None:
        return year + value[4:] if value and value.startswith("0000") else value

    for event in doc.timeline:
        event.time = fix(event.time)
    for point in doc.metrics.points:
        point["time"] = fix(point["time"])
    for error in doc.errors:
        error.time = fix(error.time)
    for span in doc.phases:
        span.start, span.end = fix(span.start), fix(span.end)
