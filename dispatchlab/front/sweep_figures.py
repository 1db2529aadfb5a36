"""The backend sweep's chart as a plain dict (see gpu_figures.py): a bar per candidate of its median time
per call, ranked order first; the proposed fix stands out, a candidate that ran but answered wrongly is
a red bar, one that did not run is a grey bar of height 0 labelled with why.

Every string from a worker goes through `plot_text`.
"""

from __future__ import annotations

from typing import Any

from dispatchlab.front.figures import figure, hover_nearest, legend_on_top, plot_text
from dispatchlab.front.gpu_figures import (
    FAILS_COLOR,
    OTHER_COLOR,
    PEAK_COLOR,
    WORKS_COLOR,
    _number,
    probe_status_word,
    shape_text,
)

# verdict -> (legend name, colour)
VERDICTS = {
    "proposed": ("proposed fix", PEAK_COLOR),
    "correct": ("correct", WORKS_COLOR),
    "wrong": ("ran, not correct or not checked", FAILS_COLOR),
    "absent": ("did not run here", OTHER_COLOR),
}


def candidate_verdict(candidate: dict[str, Any], proposed: str | None) -> str:
    """proposed | correct | wrong (ran and timed, but not correct) | absent (did not run)."""
    if candidate.get("correct") is True:
        return "proposed" if proposed and candidate.get("name") == proposed else "correct"
    if _number(candidate.get("ms")) is not None:
        return "wrong"
    return "absent"


def rate_text(candidate: dict[str, Any]) -> str:
    tflops, gbps = _number(candidate.get("tflops")), _number(candidate.get("gbps"))
    if tflops is not None:
        return f"{tflops:.3g} TFLOP/s" if tflops < 10 else f"{tflops:.1f} TFLOP/s"
    if gbps is not None:
        return f"{gbps:.3g} GB/s" if gbps < 10 else f"{gbps:.0f} GB/s"
    return ""


def percent_text(value: Any) -> str:
    fraction = _number(value)
    return f"{fraction * 100:.1f}%" if fraction is not None else ""


def sweep_figure(
    candidates: list[dict[str, Any]], *, proposed: str | None = None, gpu_name: str | None = None
) -> dict[str, Any] | None:
    """Median ms per call of each candidate in the order given (the worker's: ranked first), or None
    without candidates. Lower is faster; hover says correctness, rate and % of peak and of the anchor."""
    candidates = [c for c in candidates if isinstance(c, dict) and c.get("name")]
    if not candidates:
        return None
    labels: list[str] = []
    for candidate in candidates:
        label = plot_text(candidate["name"], limit=60)
        labels.append(label if label not in labels else f"{label} ({len(labels) + 1})")
    buckets: dict[str, dict[str, list[Any]]] = {}
    for label, candidate in zip(labels, candidates, strict=True):
        verdict = candidate_verdict(candidate, proposed)
        ms = _number(candidate.get("ms"))
        word = probe_status_word(candidate)
        peak, anchor = (
            percent_text(candidate.get("peak_fraction")),
            percent_text(candidate.get("anchor_fraction")),
        )
        rank = candidate.get("rank")
        hover = "<br>".join(
            part
            for part in (
                f"<b>{label}</b>" + (f" · rank {rank}" if isinstance(rank, int) else ""),
                plot_text(candidate.get("backend") or "", limit=80),
                f"{plot_text(word)} · " + ("correct" if candidate.get("correct") else "not correct"),
                f"{ms:.4g} ms median" if ms is not None else "",
                " · ".join(
                    p for p in (rate_text(candidate), f"{peak} of datasheet peak" if peak else "") if p
                ),
                f"{anchor} of the achievable anchor" if anchor else "",
                f"max error {candidate['max_error']:.3g}"
                if _number(candidate.get("max_error")) is not None
                else "",
                f"shape {plot_text(shape_text(candidate.get('shape')), limit=120)}"
                if candidate.get("shape")
                else "",
                plot_text(candidate.get("error")) if candidate.get("error") else "",
            )
            if part
        )
        bucket = buckets.setdefault(verdict, {"x": [], "y": [], "text": [], "customdata": []})
        bucket["x"].append(label)
        bucket["y"].append(ms if ms is not None else 0)
        bucket["text"].append(f"{ms:.3g} ms" if ms is not None else plot_text(word, limit=40))
        bucket["customdata"].append(hover)
    traces = [
        {
            "type": "bar",
            "name": VERDICTS[verdict][0],
            "x": bucket["x"],
            "y": bucket["y"],
            "text": bucket["text"],
            "textposition": "outside",
            "cliponaxis": False,
            "customdata": bucket["customdata"],
            "hovertemplate": "%{customdata}<extra></extra>",
            "marker": {"color": VERDICTS[verdict][1]},
        }
        for verdict, bucket in sorted(buckets.items(), key=lambda item: list(VERDICTS).index(item[0]))
    ]
    top = max([0.0, *(y for t in traces for y in t["y"])]) or 1.0
    title = "median ms per call (lower is faster)"
    if gpu_name:
        title += f" on {plot_text(gpu_name, limit=60)}"
    return figure(
        traces,
        {
            "height": 340,
            "margin": {"l": 60, "r": 20, "t": 40, "b": 90},
            "barmode": "overlay",
            **hover_nearest(),
            "xaxis": {
                "type": "category",
                "categoryorder": "array",
                "categoryarray": labels,
                "automargin": True,
            },
            "yaxis": {"title": {"text": title}, "range": [0, top * 1.2], "rangemode": "tozero"},
            "legend": legend_on_top(),
        },
        meta={
            "labels": labels,
            "ms": [_number(c.get("ms")) for c in candidates],
            "verdicts": [candidate_verdict(c, proposed) for c in candidates],
        },
    )
