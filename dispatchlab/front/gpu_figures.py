"""Plotly figures of the GPU pages, as plain dicts (see figures.py): kernel probes as % of the chip's
datasheet peak, and a confirm run's serving throughput at 1 and N concurrent requests.

Every string from a worker (probe names, errors) goes through `plot_text`.
"""

from __future__ import annotations

from typing import Any

from dispatchlab.front.figures import plot_text
from dispatchlab.gpu.selectors import probe_verdict

WORKS_COLOR = "#1f5fbf"
FAILS_COLOR = "#c0392b"
OTHER_COLOR = "#9aa3b2"
PEAK_COLOR = "#1e7e4a"
STATUS_WORDS = {
    "UNSUPPORTED_ARCH": "unsupported arch",
    "RUNTIME_ERROR": "runtime error",
    "COMPILE_ERROR": "compile error",
    "INCORRECT_NUMERICAL": "wrong numbers",
    "INCORRECT_SHAPE": "wrong shape",
    "INCORRECT_DTYPE": "wrong dtype",
    "TIMEOUT": "timed out",
    "NOT_INSTALLED": "not installed",
    "SKIPPED": "skipped",
}


def probe_status_word(probe: dict[str, Any]) -> str:
    status = str(probe.get("status") or "")
    if status.upper() in STATUS_WORDS:
        return STATUS_WORDS[status.upper()]
    if status:
        return status.lower().replace("_", " ")
    return "runs" if probe.get("runs") else "did not run"


def shape_text(shape: Any) -> str:
    """A probe's shape as people read it: {"m": 8192, "n": 8192} -> "m=8192 n=8192"."""
    if isinstance(shape, dict):
        return " ".join(f"{key}={value}" for key, value in shape.items())
    if isinstance(shape, list | tuple):
        return "×".join(str(v) for v in shape)
    return "" if shape is None else str(shape)


def _rate(probe: dict[str, Any]) -> str:
    if isinstance(probe.get("tflops"), int | float):
        return f"{probe['tflops']:.1f} TFLOP/s"
    if isinstance(probe.get("gbps"), int | float):
        return f"{probe['gbps']:.0f} GB/s"
    return ""


def _percent(probe: dict[str, Any]) -> float | None:
    fraction = probe.get("peak_fraction")
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        return None
    return round(float(fraction) * 100.0, 1)


def probe_label(probe: dict[str, Any]) -> str:
    """The bar's name: probe, then backend when the name does not already say it."""
    name = str(probe.get("name") or "probe")
    backend = str(probe.get("backend") or "")
    return f"{name} · {backend}" if backend and backend not in name else name


def probe_figure(probes: list[dict[str, Any]], *, gpu_name: str | None = None) -> dict[str, Any] | None:
    """A bar per probe of its rate as % of the chip's datasheet peak, with a line at 100%.

    A probe that failed (or was refused on this arch) is a bar of height 0 labelled with its status,
    its error on hover, so a missing kernel shows as plainly as a slow one. None without probes."""
    probes = [p for p in probes if isinstance(p, dict)]
    if not probes:
        return None
    labels: list[str] = []
    seen: dict[str, int] = {}
    for probe in probes:
        label = plot_text(probe_label(probe), limit=60)
        seen[label] = seen.get(label, 0) + 1
        # categories must be unique: a second run of the same probe gets a number
        labels.append(label if seen[label] == 1 else f"{label} ({seen[label]})")

    buckets: dict[str, dict[str, list[Any]]] = {}
    for label, probe in zip(labels, probes, strict=True):
        verdict = probe_verdict(probe) or "other"
        percent = _percent(probe) if verdict == "works" else None
        word = probe_status_word(probe)
        shape = shape_text(probe.get("shape"))
        hover = "<br>".join(
            part
            for part in (
                f"<b>{label}</b>",
                f"{plot_text(probe.get('component') or '')} · {plot_text(word)}".strip(" ·"),
                f"{percent:.1f}% of peak · {_rate(probe)}" if percent is not None else _rate(probe),
                f"{probe['ms']:.3f} ms" if isinstance(probe.get("ms"), int | float) else "",
                f"max error {probe['max_error']:.3g}"
                if isinstance(probe.get("max_error"), int | float)
                else "",
                f"shape {plot_text(shape, limit=120)}" if shape else "",
                plot_text(probe.get("error")) if probe.get("error") else "",
            )
            if part
        )
        bucket = buckets.setdefault(verdict, {"x": [], "y": [], "text": [], "customdata": []})
        bucket["x"].append(label)
        bucket["y"].append(percent if percent is not None else 0)
        bucket["text"].append(f"{percent:.0f}%" if percent is not None else plot_text(word, limit=40))
        bucket["customdata"].append(hover)

    names = {"works": "runs, correct", "fails": "fails on this GPU", "other": "no verdict"}
    colors = {"works": WORKS_COLOR, "fails": FAILS_COLOR, "other": OTHER_COLOR}
    traces = [
        {
            "type": "bar",
            "name": names[verdict],
            "x": bucket["x"],
            "y": bucket["y"],
            "text": bucket["text"],
            "textposition": "outside",
            "cliponaxis": False,
            "customdata": bucket["customdata"],
            "hovertemplate": "%{customdata}<extra></extra>",
            "marker": {"color": colors[verdict]},
            "textfont": {"color": "#394457" if verdict == "works" else colors[verdict]},
        }
        for verdict, bucket in sorted(buckets.items(), key=lambda item: list(names).index(item[0]))
    ]
    top = max([100.0, *(y for t in traces for y in t["y"])])
    peak = (
        f"100% = datasheet peak of {plot_text(gpu_name, limit=60)}" if gpu_name else "100% = datasheet peak"
    )
    return {
        "data": traces,
        "layout": {
            "height": 340,
            "margin": {"l": 60, "r": 20, "t": 40, "b": 90},
            "barmode": "overlay",
            "hovermode": "closest",
            "hoverlabel": {"align": "left"},
            "xaxis": {
                "type": "category",
                "categoryorder": "array",
                "categoryarray": labels,
                "automargin": True,
            },
            "yaxis": {"title": {"text": "% of datasheet peak"}, "range": [0, top * 1.15], "ticksuffix": "%"},
            "shapes": [
                {
                    "type": "line",
                    "xref": "paper",
                    "x0": 0,
                    "x1": 1,
                    "yref": "y",
                    "y0": 100,
                    "y1": 100,
                    "line": {"color": PEAK_COLOR, "width": 1.5, "dash": "dash"},
                }
            ],
            "annotations": [
                {
                    "xref": "paper",
                    "x": 1,
                    "xanchor": "right",
                    "yref": "y",
                    "y": 100,
                    "yanchor": "bottom",
                    "text": peak,
                    "showarrow": False,
                    "font": {"size": 11, "color": PEAK_COLOR},
                }
            ],
            "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom", "font": {"size": 11}},
            "plot_bgcolor": "#fbfcfe",
        },
        "config": {"displaylogo": False, "responsive": True},
        "meta": {"labels": labels},
    }


def confirm_throughput_figure(throughput: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Output tokens/s of the fixed launch at each measured concurrency (1 and N), or None."""
    points = [
        p
        for p in throughput
        if isinstance(p, dict)
        and isinstance(p.get("tokens_per_s"), int | float)
        and isinstance(p.get("concurrency"), int)
    ]
    if not points:
        return None
    points.sort(key=lambda p: p["concurrency"])
    labels = [f"{p['concurrency']} concurrent" if p["concurrency"] > 1 else "1 request" for p in points]
    hovers = []
    for label, p in zip(labels, points, strict=True):
        parts = [f"<b>{label}</b>", f"{p['tokens_per_s']:.1f} output tok/s"]
        if isinstance(p.get("requests"), int):
            parts.append(f"{p['requests']} requests, {p.get('completion_tokens') or 0} tokens")
        if isinstance(p.get("seconds"), int | float):
            parts.append(f"in {p['seconds']:.1f} s")
        if p.get("errors"):
            parts.append(f"{plot_text(p['errors'], limit=80)} errors")
        hovers.append("<br>".join(parts))
    return {
        "data": [
            {
                "type": "bar",
                "name": "output tok/s",
                "x": labels,
                "y": [round(float(p["tokens_per_s"]), 1) for p in points],
                "text": [f"{p['tokens_per_s']:.0f}" for p in points],
                "textposition": "outside",
                "cliponaxis": False,
                "customdata": hovers,
                "hovertemplate": "%{customdata}<extra></extra>",
                "marker": {"color": WORKS_COLOR},
            }
        ],
        "layout": {
            "height": 280,
            "margin": {"l": 60, "r": 20, "t": 30, "b": 40},
            "xaxis": {"type": "category"},
            "yaxis": {"title": {"text": "output tokens/s"}, "rangemode": "tozero"},
            "showlegend": False,
            "plot_bgcolor": "#fbfcfe",
        },
        "config": {"displaylogo": False, "responsive": True},
        "meta": {"concurrency": [p["concurrency"] for p in points]},
    }
