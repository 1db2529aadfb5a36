"""Plotly figures as plain dicts, built from a match document (docs/web-spec.md).

No plotly import: the browser draws them with the vendored partial Plotly bundle (static/vendor/plotly-basic.min.js: scatter and bar, all the figures use) from a json_script data
island. Every string that comes from a log goes through `plot_text`, because Plotly renders a subset
of HTML tags in hover labels and names; escaped entities are shown as the characters they stand for.
"""

from __future__ import annotations

import bisect
import html
import textwrap
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from dispatchlab.core import crashline
from dispatchlab.core.parse.vocabulary import rank_sort_key

PHASE_LABELS = {
    "init": "init",
    "weight_loading": "weight loading",
    "kv_cache": "KV cache",
    "cuda_graph_capture": "CUDA graph capture",
    "warmup": "warmup",
    "serving": "serving",
}
PHASE_COLORS = {
    "init": "#b8c4d6",
    "weight_loading": "#7fa7d9",
    "kv_cache": "#9ccfa8",
    "cuda_graph_capture": "#e6b86a",
    "warmup": "#c3a6de",
    "serving": "#6cc3b5",
}
MARKERS = {
    # kind: (legend name, symbol, colour, size)
    "backend": ("backend decision", "diamond", "#1f5fbf", 11),
    "warning": ("warning", "triangle-up", "#d98a00", 10),
    "error": ("error", "circle-open", "#c0392b", 9),
}
CRASH_COLOR = "#d62728"
# A gigabyte log may hold many thousands of warnings: the chart shows the first ones per kind.
MAX_MARKERS_PER_KIND = 400
# The throughput chart draws at most this many points per series, whatever the log's size.
MAX_CHART_POINTS = 500
HOVER_WIDTH = 90
HOVER_CHARS = 600
# The year the core gives a time read from a log line that prints none (vLLM's `MM-DD HH:MM:SS`).
UNKNOWN_YEAR = 1900


def plot_text(value: Any, *, width: int = HOVER_WIDTH, limit: int = HOVER_CHARS) -> str:
    """User text for a Plotly label: escaped (Plotly turns `&lt;` back into `<` as text, never
    a tag), cut to `limit` characters and wrapped with `<br>`, the one tag we emit."""
    text = "" if value is None else str(value)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    lines = textwrap.wrap(text, width=width, break_long_words=True, replace_whitespace=True) or [""]
    return "<br>".join(html.escape(line, quote=False) for line in lines)


def figure(traces: list[dict[str, Any]], layout: dict[str, Any], *, meta: dict[str, Any]) -> dict[str, Any]:
    """A Plotly figure as the pages draw them: on the pages' background, without Plotly's logo, resized
    with the page; `meta` says what was drawn, for tests and scripts."""
    return {
        "data": traces,
        "layout": {**layout, "plot_bgcolor": "#fbfcfe"},
        "config": {"displaylogo": False, "responsive": True},
        "meta": meta,
    }


def hover_nearest() -> dict[str, Any]:
    """Hovering shows the nearest point's label, left-aligned (the labels hold several lines)."""
    return {"hovermode": "closest", "hoverlabel": {"align": "left"}}


def legend_on_top() -> dict[str, Any]:
    return {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom", "font": {"size": 11}}


def lane_label(rank: str | None, model: str | None) -> str:
    """The lane's name as drawn ("TP0 main", "TP0 draft", or "main" for a log without ranks),
    already escaped for Plotly."""
    model = model or "main"
    return plot_text(f"{rank} {model}" if rank else model, limit=40)


def _lanes(doc: dict[str, Any]) -> list[str]:
    """Lanes top to bottom: ranks in natural order, main before draft."""
    seen: set[tuple[str | None, str]] = set()
    for phase in doc.get("phases") or []:
        seen.add((phase.get("rank"), phase.get("model") or "main"))
    for event in doc.get("timeline") or []:
        if event.get("kind") in MARKERS:
            seen.add((event.get("rank"), event.get("model") or "main"))
    crash = doc.get("crash") or None
    if crash:
        for rank in _crash_ranks(crash):
            seen.add((rank, crash.get("model") or "main"))
    ordered = sorted(seen, key=lambda item: (rank_sort_key(item[0]), item[1] != "main", item[1]))
    return [lane_label(rank, model) for rank, model in ordered]


def _crash_ranks(crash: dict[str, Any]) -> list[str | None]:
    ranks = crash.get("ranks") or []
    return list(ranks) if ranks else [crash.get("rank")]


def _parse_time(value: Any) -> datetime | None:
    if not value or not isinstance(value, str):
        return None
    return _parse_time_string(value)


@lru_cache(maxsize=4096)
def _parse_time_string(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(UTC).replace(tzinfo=None)
    return parsed


@lru_cache(maxsize=4096)
def _plotly_time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")


class _Axis:
    """Maps a log position (line, optional time) to the x axis: time when the log has timestamps,
    line numbers otherwise. Lines without a time take the time of the nearest earlier timed line."""

    def __init__(self, doc: dict[str, Any], *, metrics: bool = False) -> None:
        anchors: dict[int, datetime] = {}
        positions = 0
        for event in doc.get("timeline") or []:
            positions += 1
            moment = _parse_time(event.get("time"))
            if moment is not None and isinstance(event.get("line"), int):
                anchors.setdefault(event["line"], moment)
        for phase in doc.get("phases") or []:
            for line_key, time_key in (("start_line", "start"), ("end_line", "end")):
                if phase.get(line_key) is None:
                    continue
                positions += 1
                moment = _parse_time(phase.get(time_key))
                if moment is not None:
                    anchors.setdefault(phase[line_key], moment)
        metric_points = ((doc.get("metrics") or {}).get("points") or []) if metrics else []
        for point in metric_points:
            positions += 1
            moment = _parse_time(point.get("time"))
            if moment is not None and isinstance(point.get("line"), int):
                anchors.setdefault(point["line"], moment)
        # time mode needs timestamps on at least half of the positions we draw
        self.mode = "time" if anchors and len(anchors) * 2 >= max(1, positions) else "line"
        self._lines = sorted(anchors)
        self._times = [anchors[line] for line in self._lines]
        self.times = self._times

    def moment(self, line: int | None, time: Any = None) -> datetime | None:
        parsed = _parse_time(time)
        if parsed is not None or line is None or not self._lines:
            return parsed
        at = bisect.bisect_right(self._lines, line) - 1
        return self._times[max(at, 0)]

    def x(self, line: int | None, time: Any = None) -> Any:
        if self.mode == "line":
            return line
        moment = self.moment(line, time)
        return None if moment is None else _plotly_time(moment)

    def span(self, start_line: int, end_line: int, start: Any, end: Any) -> tuple[Any, float]:
        """(base, width) of a bar: width in lines, or in milliseconds on a date axis."""
        if self.mode == "line":
            return start_line, float(max(end_line - start_line, 1))
        begin = self.moment(start_line, start)
        finish = self.moment(end_line, end)
        if begin is None:
            return None, 0.0
        if finish is None or finish < begin:
            finish = begin
        return _plotly_time(begin), max((finish - begin).total_seconds() * 1000.0, 1.0)


def timeline_positions(doc: dict[str, Any]) -> int:
    """How many distinct places on the timeline's x axis the document's events and phases take: a
    chart of fewer than three is a few marks on an axis of fractional lines or of a millisecond."""
    axis = _Axis(doc)
    crash = doc.get("crash")
    # the traceback's head and the crash it ends in are one mark, at the crash's own line
    folded = crash.get("line") if isinstance(crash, dict) else None
    places = {
        axis.x(e.get("line"), e.get("time"))
        for e in doc.get("timeline") or []
        if isinstance(e, dict)
        and not (folded is not None and e.get("line") == folded and e.get("kind") == "error")
    }
    for phase in doc.get("phases") or []:
        if isinstance(phase, dict):
            places.add(axis.x(phase.get("start_line"), phase.get("start")))
            places.add(axis.x(phase.get("end_line"), phase.get("end")))
    if isinstance(crash, dict):
        places.add(axis.x(crashline.crash_line(doc), None))
    places.discard(None)
    return len(places)


def _x_axis(axis: _Axis, doc: dict[str, Any]) -> dict[str, Any]:
    """The timeline's x axis: whole log lines (never 1.5), or clock times; vLLM's `MM-DD HH:MM:SS`
    has no year (the core writes 1900), so such an axis shows the day and time only."""
    if axis.mode == "line":
        span = _last_position(doc) - min((e.get("line") or 1 for e in doc.get("timeline") or []), default=1)
        return {"type": "linear", "title": {"text": "log line"}, "tickformat": "d"} | (
            {"dtick": 1} if span <= 12 else {}
        )
    if axis.times and all(moment.year == UNKNOWN_YEAR for moment in axis.times):
        return {
            "type": "date",
            "title": {"text": "time (the log prints no year)", "standoff": 10},
            "automargin": True,
            "tickformat": "%H:%M:%S<br>%b %d",
            "hoverformat": "%b %d %H:%M:%S",
        }
    return {"type": "date", "title": {"text": ""}}


def _last_position(doc: dict[str, Any]) -> int:
    lines = [doc.get("line_count") or 0]
    crash = doc.get("crash") or None
    if crash and isinstance(crash.get("line"), int):
        lines.append(crash["line"])
    for event in doc.get("timeline") or []:
        if isinstance(event.get("line"), int):
            lines.append(event["line"])
    return max(lines) or 1


def _phase_end(phase: dict[str, Any], doc: dict[str, Any]) -> tuple[int, Any]:
    if phase.get("end_line") is not None:
        return int(phase["end_line"]), phase.get("end")
    crash = doc.get("crash") or None
    if crash and isinstance(crash.get("line"), int) and crash["line"] >= (phase.get("start_line") or 0):
        return crash["line"], None
    return _last_position(doc), None


def _hover(*parts: str) -> str:
    return "<br>".join(part for part in parts if part) + "<extra></extra>"


def timeline_figure(doc: dict[str, Any], *, crash_line: int | None = None) -> dict[str, Any] | None:
    """The resolved-backend timeline: a lane per rank and model, phases as bars, backend decisions,
    warnings and errors as markers (hover: the log message), the crash as a red X.

    Every point carries customdata [hover, line] so a click can open the log at that line. The crash sits
    on the crash's line (`crash_line`, else dispatchlab.core.crashline's), the line the page names.
    Returns None when the document has nothing to draw."""
    lanes = _lanes(doc)
    if not lanes:
        return None
    axis = _Axis(doc)
    traces: list[dict[str, Any]] = []

    by_phase: dict[str, dict[str, list[Any]]] = {}
    for phase in doc.get("phases") or []:
        start_line = phase.get("start_line")
        if not isinstance(start_line, int):
            continue
        end_line, end_time = _phase_end(phase, doc)
        base, width = axis.span(start_line, end_line, phase.get("start"), end_time)
        if base is None:
            continue
        name = str(phase.get("name") or "phase")
        label = PHASE_LABELS.get(name, name)
        seconds = phase.get("seconds")
        duration = f"{seconds:.1f} s" if isinstance(seconds, int | float) else "duration unknown"
        if phase.get("end_line") is None:
            duration += " (did not finish)"
        lane = lane_label(phase.get("rank"), phase.get("model"))
        hover = _hover(
            f"<b>{plot_text(label)}</b> · {lane}",
            f"{duration}; lines {start_line}–{end_line}",
            plot_text(phase.get("detail")),
        )
        bucket = by_phase.setdefault(name, {"y": [], "base": [], "x": [], "customdata": []})
        bucket["y"].append(lane)
        bucket["base"].append(base)
        bucket["x"].append(width)
        bucket["customdata"].append([hover, start_line])
    for name, bucket in by_phase.items():
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": plot_text(PHASE_LABELS.get(name, name)),
                "y": bucket["y"],
                "base": bucket["base"],
                "x": bucket["x"],
                "customdata": bucket["customdata"],
                "hovertemplate": "%{customdata[0]}",
                "marker": {"color": PHASE_COLORS.get(name, "#cccccc"), "line": {"width": 0}},
                "opacity": 0.85,
                "width": 0.55,
            }
        )

    for kind, (legend, symbol, color, size) in MARKERS.items():
        xs: list[Any] = []
        ys: list[str] = []
        custom: list[list[Any]] = []
        for event in doc.get("timeline") or []:
            if event.get("kind") != kind or (kind == "error" and event.get("name") == "crash"):
                continue  # the crash is the red X below
            x = axis.x(event.get("line"), event.get("time"))
            if x is None:
                continue
            lane = lane_label(event.get("rank"), event.get("model"))
            hover = _hover(
                f"<b>{plot_text(event.get('name'))}</b> · {lane} · line {event.get('line')}",
                plot_text(event.get("detail")),
            )
            xs.append(x)
            ys.append(lane)
            custom.append([hover, event.get("line")])
            if len(xs) >= MAX_MARKERS_PER_KIND:
                break
        if xs:
            traces.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": legend,
                    "x": xs,
                    "y": ys,
                    "customdata": custom,
                    "hovertemplate": "%{customdata[0]}",
                    "marker": {
                        "symbol": symbol,
                        "color": color,
                        "size": size,
                        "line": {"width": 1, "color": "#ffffff"},
                    },
                }
            )

    crash = doc.get("crash") or None
    at = crash_line or crashline.crash_line(doc)
    if crash and at is not None:
        x = axis.x(at, None)
        headline = ": ".join(str(part) for part in (crash.get("exception"), crash.get("message")) if part)
        ranks = _crash_ranks(crash)
        lanes_hit = [lane_label(rank, crash.get("model")) for rank in ranks]
        hover = _hover(
            f"<b>crash</b> · line {at}"
            + (f" · in {plot_text(crash.get('phase'))}" if crash.get("phase") else ""),
            plot_text(headline),
        )
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "crash",
                "x": [x] * len(lanes_hit),
                "y": lanes_hit,
                "customdata": [[hover, at]] * len(lanes_hit),
                "hovertemplate": "%{customdata[0]}",
                "marker": {
                    "symbol": "x",
                    "color": CRASH_COLOR,
                    "size": 16,
                    "line": {"width": 2, "color": "#7a0f10"},
                },
            }
        )

    height = 130 + 32 * len(lanes)
    return figure(
        traces,
        {
            "height": height,
            "margin": {"l": 10, "r": 20, "t": 40, "b": 40},
            "barmode": "overlay",
            **hover_nearest(),
            "xaxis": _x_axis(axis, doc) | {"zeroline": False, "showgrid": True},
            "yaxis": {
                "type": "category",
                "categoryorder": "array",
                # Plotly draws the first category at the bottom: reverse to read top-down
                "categoryarray": list(reversed(lanes)),
                "automargin": True,
            },
            "legend": legend_on_top(),
        },
        meta={"x_mode": axis.mode, "lanes": lanes},
    )


def throughput_figure(doc: dict[str, Any]) -> dict[str, Any] | None:
    """Serving throughput from the batch metrics, or None when the log has none.

    When several ranks report, the chart follows the rank with most points (they report the same
    batches; plotting all of them would zigzag)."""
    metrics = doc.get("metrics") or {}
    points = [p for p in metrics.get("points") or [] if isinstance(p, dict)]
    if not points:
        return None
    ranks = Counter(p.get("rank") for p in points)
    rank = ranks.most_common(1)[0][0]
    points = [p for p in points if p.get("rank") == rank]
    shown_every = max(1, -(-len(points) // MAX_CHART_POINTS))
    # a page of a gigabyte log must cost what a page of a small one does: same number of points
    points = points[::shown_every]
    axis = _Axis({"metrics": {"points": points}}, metrics=True)
    positions = [axis.x(point.get("line"), point.get("time")) for point in points]

    def series(field: str, kinds: tuple[str, ...]) -> tuple[list[Any], list[Any], list[Any]]:
        xs, ys, lines = [], [], []
        for point, x in zip(points, positions, strict=True):
            value = point.get(field)
            if x is None or point.get("kind") not in kinds or not isinstance(value, int | float):
                continue
            xs.append(x)
            ys.append(value)
            lines.append(point.get("line"))
        return xs, ys, lines

    traces: list[dict[str, Any]] = []
    # decode and prefill throughput differ by two orders of magnitude: each gets its own axis, and
    # the request counts their own panel below
    specs = [
        ("gen_throughput", ("decode", "vllm"), "generation tok/s", "y", "#1f5fbf", "solid", "lines"),
        ("input_throughput", ("prefill", "vllm"), "prefill tok/s", "y2", "#2a9d8f", "dot", "markers"),
        ("running", ("decode", "prefill", "vllm"), "running requests", "y3", "#666666", "solid", "lines"),
        ("queued", ("decode", "prefill", "vllm"), "queued requests", "y3", "#d98a00", "solid", "lines"),
    ]
    for field, kinds, name, yaxis, color, dash, mode in specs:
        xs, ys, lines = series(field, kinds)
        if not xs:
            continue
        if mode == "lines" and len(xs) < 80:
            mode = "lines+markers"
        traces.append(
            {
                "type": "scatter",
                "mode": mode,
                "name": name,
                "x": xs,
                "y": ys,
                "yaxis": yaxis,
                "customdata": lines,
                "hovertemplate": f"{name}: %{{y}}<br>line %{{customdata}}<extra></extra>",
                "line": {"color": color, "dash": dash, "width": 2 if yaxis == "y" else 1.5},
                "marker": {"size": 5 if mode == "markers" else 3, "color": color},
            }
        )
    if not traces:
        return None
    sampled = int(metrics.get("sampled_every") or 1) * shown_every
    note = f"{plot_text(rank)}" if rank else "all ranks"
    if sampled > 1:
        note += f", 1 in {sampled} of {metrics.get('total')} points"
    return figure(
        traces,
        {
            "height": 360,
            "margin": {"l": 60, "r": 60, "t": 50, "b": 40},
            "hovermode": "x unified",
            "title": {"text": note, "font": {"size": 11}, "x": 1, "xanchor": "right", "y": 0.99},
            "xaxis": {
                "type": "date" if axis.mode == "time" else "linear",
                "title": {"text": "" if axis.mode == "time" else "log line"},
            },
            "yaxis": {"title": {"text": "decode tok/s"}, "rangemode": "tozero", "domain": [0.38, 1]},
            "yaxis2": {
                "title": {"text": "prefill tok/s"},
                "overlaying": "y",
                "side": "right",
                "rangemode": "tozero",
                "showgrid": False,
            },
            "yaxis3": {"title": {"text": "requests"}, "rangemode": "tozero", "domain": [0, 0.26]},
            "legend": legend_on_top(),
        },
        meta={"x_mode": axis.mode, "rank": rank},
    )


@dataclass(frozen=True)
class _Box:
    """Where a sparkline's bars go inside its SVG, after room for the axis labels."""

    left: float
    right: float
    top: float
    bottom: float

    @property
    def height(self) -> float:
        return self.bottom - self.top


def _day_label(day: date) -> str:
    return f"{day:%b} {day.day}"


def _spark_bars(counts: list[int], box: _Box, first_day: date | None) -> SafeString:
    top = max(counts) or 1
    step = (box.right - box.left) / len(counts)
    bars = []
    for i, count in enumerate(counts):
        tall = max(count / top * box.height, 1.0 if count else 0.0)
        when = f"{_day_label(first_day + timedelta(days=i))}: " if first_day else ""
        x, y, bar = f"{box.left + i * step:.1f}", f"{box.bottom - tall:.1f}", f"{max(step - 1.0, 1.0):.1f}"
        bars.append((x, y, bar, f"{tall:.1f}", f"{when}{count} report{'s' if count != 1 else ''}"))
    drawn = format_html_join("", '<rect x="{}" y="{}" width="{}" height="{}"><title>{}</title></rect>', bars)
    if first_day is None:
        return drawn
    # A day's whole column answers the hover, so a day of no report or one short bar is easy to point at.
    columns = [
        (f"M{box.left + i * step:.1f} {box.top:.1f}h{step:.2f}v{box.height:.1f}h-{step:.2f}z", bar[4])
        for i, bar in enumerate(bars)
    ]
    hits = format_html_join("", '<path class="hit" d="{}"><title>{}</title></path>', columns)
    return format_html("{}{}", drawn, hits)


def _spark_axes(counts: list[int], box: _Box, first_day: date, font: int) -> SafeString:
    """A count axis (0 and the busiest day's count) on the left, dates below: the first, the last
    and, where there is room, some between."""
    top = max(counts)
    lines = [(box.left, box.top, box.left, box.bottom), (box.left, box.bottom, box.right, box.bottom)]
    labels = [(f"{box.left - 3:.1f}", f"{box.bottom:.1f}", "end", "0")]
    if top:
        labels.append((f"{box.left - 3:.1f}", f"{box.top + font * 0.7:.1f}", "end", str(top)))
    step = (box.right - box.left) / len(counts)
    room = max(2, min(len(counts), int((box.right - box.left) // (font * 6))))
    below = f"{box.bottom + font + 2:.1f}"
    for k in range(room):
        i = round(k * (len(counts) - 1) / (room - 1)) if len(counts) > 1 else 0
        anchor = "start" if k == 0 else "end" if k == room - 1 else "middle"
        x = box.left + (i + (0.5 if anchor == "middle" else 0 if k == 0 else 1)) * step
        labels.append((f"{x:.1f}", below, anchor, _day_label(first_day + timedelta(days=i))))
    ends = ((f"{x1:.1f}", f"{y1:.1f}", f"{x2:.1f}", f"{y2:.1f}") for x1, y1, x2, y2 in lines)
    axis = format_html_join("", '<line x1="{}" y1="{}" x2="{}" y2="{}"></line>', ends)
    text = format_html_join("", '<text x="{}" y="{}" text-anchor="{}">{}</text>', labels)
    return format_html('<g class="axis" font-size="{}">{}{}</g>', font, axis, text)


def sparkline_svg(
    counts: list[int], *, width: int = 120, height: int = 24, first_day: date | None = None
) -> SafeString:
    """A small bar chart of per-day counts, as inline SVG; with `first_day` (the date of counts[0]),
    with axes: the count on the left, dates below. Only numbers and dates go into it."""
    counts = [max(0, int(c)) for c in counts] or [0]
    summary = f"{sum(counts)} in the last {len(counts)} days, most {max(counts)} a day"
    if first_day is None:
        box = _Box(0.0, float(width), 0.0, float(height))
        frame = format_html('<line x1="0" y1="{0}" x2="{1}" y2="{0}"></line>', f"{height - 0.5:.1f}", width)
    else:
        font = 10 if height < 60 else 11
        left = len(str(max(counts))) * font * 0.62 + 5
        box = _Box(left, width - 2.0, 2.0, height - font - 4.0)
        frame = _spark_axes(counts, box, first_day, font)
        summary += f", {_day_label(first_day)} to {_day_label(first_day + timedelta(days=len(counts) - 1))}"
    return format_html(
        '<svg class="sparkline" width="{0}" height="{1}" viewBox="0 0 {0} {1}" role="img" aria-label="{2}">'
        "<title>{3}</title>{4}{5}</svg>",
        width,
        height,
        f"{sum(counts)} in {len(counts)} days",
        summary,
        frame,
        _spark_bars(counts, box, first_day),
    )
