"""Plotly figures of the GPU pages, as plain dicts (see figures.py): kernel probes as % of the chip's
datasheet peak, a confirm run's serving throughput at 1 and N concurrent requests, and the NCCL
all-reduce's bus bandwidth per message size against the link's datasheet bandwidth.

Every string from a worker (probe names, errors) goes through `plot_text`.
"""

from __future__ import annotations

import math
from typing import Any

from dispatchlab.front.figures import figure, hover_nearest, legend_on_top, plot_text
from dispatchlab.gpu.selectors import is_allreduce, probe_verdict

WORKS_COLOR = "#1f5fbf"
FAILS_COLOR = "#c0392b"
OTHER_COLOR = "#9aa3b2"
PEAK_COLOR = "#1e7e4a"
TP_COLOR = "#9a5b00"
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
    its error on hover, so a missing kernel shows as plainly as a slow one. None without probes.
    The all-reduce is left out: its rate is a link's, not a share of the chip's peak (`allreduce_figure`)."""
    probes = [p for p in probes if isinstance(p, dict) and not is_allreduce(p)]
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
            "legend": legend_on_top(),
        },
        meta={"labels": labels},
    )


def confirm_throughput_figure(
    throughput: list[dict[str, Any]], *, unit: str = "tokens/s"
) -> dict[str, Any] | None:
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
        parts = [
            f"<b>{label}</b>",
            f"{p['tokens_per_s']:.1f} {'output tok/s' if unit == 'tokens/s' else unit}",
        ]
        if isinstance(p.get("requests"), int):
            parts.append(f"{p['requests']} requests, {p.get('completion_tokens') or 0} tokens")
        if isinstance(p.get("seconds"), int | float):
            parts.append(f"in {p['seconds']:.1f} s")
        if p.get("errors"):
            parts.append(f"{plot_text(p['errors'], limit=80)} errors")
        hovers.append("<br>".join(parts))
    return figure(
        [
            {
                "type": "bar",
                "name": "output tok/s" if unit == "tokens/s" else unit,
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
        {
            "height": 280,
            "margin": {"l": 60, "r": 20, "t": 30, "b": 40},
            "xaxis": {"type": "category"},
            "yaxis": {
                "title": {"text": "output tokens/s" if unit == "tokens/s" else "kernel steps per second"},
                "rangemode": "tozero",
            },
            "showlegend": False,
        },
        meta={"concurrency": [p["concurrency"] for p in points]},
    )


# ---------------------------------------------------------------- the NCCL all-reduce

SIZE_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def size_text(size: float) -> str:
    """Bytes as people read a message size: 1048576 -> "1 MiB", 1.5 * 2**30 -> "1.5 GiB"."""
    for unit, scale in SIZE_UNITS:
        if size >= scale:
            value = size / scale
            return f"{value:.0f} {unit}" if value == int(value) or value >= 100 else f"{value:.1f} {unit}"
    return f"{size:.0f} B"


def allreduce_sizes(probe: dict[str, Any]) -> list[dict[str, Any]]:
    """The measured sizes of an all-reduce result that have a size in bytes, smallest first."""
    extra = probe.get("extra") if isinstance(probe.get("extra"), dict) else {}
    sizes = [
        s for s in extra.get("sizes") or [] if isinstance(s, dict) and (_number(s.get("bytes")) or 0) > 0
    ]
    return sorted(sizes, key=lambda s: float(s["bytes"]))


def allreduce_link(probe: dict[str, Any]) -> dict[str, Any]:
    extra = probe.get("extra") if isinstance(probe.get("extra"), dict) else {}
    return extra["link"] if isinstance(extra.get("link"), dict) else {}


def _size_ticks(low: float, high: float) -> list[float]:
    """Powers of two across the measured range: every one over a short range, else every third
    (1 MiB, 8 MiB, 64 MiB ...) and the largest."""
    first, last = math.floor(math.log2(low)), math.ceil(math.log2(high))
    step = 1 if last - first <= 6 else 3
    exponents = list(range(first, last + 1, step))
    if exponents[-1] != last:
        exponents.append(last)
    return [float(2**e) for e in exponents]


def allreduce_figure(
    probe: dict[str, Any], *, link: dict[str, Any] | None = None, height: int = 320
) -> dict[str, Any] | None:
    """Bus bandwidth (GB/s) per message size on a log axis, the link's datasheet bandwidth as a line
    across, and the model's tensor-parallel all-reduce size as a line up when the probe knows it.

    `link` is the host's link the probe ran over when the result does not say (`extra.link`). None when
    no size has a bus bandwidth (skipped, failed)."""
    points = [s for s in allreduce_sizes(probe) if _number(s.get("busbw_gbps")) is not None]
    if not points:
        return None
    link = allreduce_link(probe) or link or {}
    peak = _number(link.get("gbps"))
    kind = plot_text(link.get("kind") or "link", limit=20)
    extra = probe.get("extra") if isinstance(probe.get("extra"), dict) else {}
    tp_bytes = _number(extra.get("model_tp_bytes"))
    tp_bytes = tp_bytes if tp_bytes and tp_bytes > 0 else None

    sizes = [float(p["bytes"]) for p in points]
    busbw = [round(float(p["busbw_gbps"]), 2) for p in points]
    hovers = []
    for point, size in zip(points, sizes, strict=True):
        parts = [f"<b>{size_text(size)}</b>", f"bus bandwidth {float(point['busbw_gbps']):.1f} GB/s"]
        if _number(point.get("algbw_gbps")) is not None:
            parts.append(f"algorithm bandwidth {float(point['algbw_gbps']):.1f} GB/s")
        if _number(point.get("ms")) is not None:
            parts.append(f"{float(point['ms']):.4g} ms")
        fraction = size_fraction(point, peak)
        if fraction is not None:
            parts.append(f"{fraction * 100:.0f}% of the {kind} datasheet bandwidth")
        hovers.append("<br>".join(parts))
    traces: list[dict[str, Any]] = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": "bus bandwidth",
            "x": sizes,
            "y": busbw,
            "customdata": hovers,
            "hovertemplate": "%{customdata}<extra></extra>",
            "line": {"color": WORKS_COLOR, "width": 2},
            "marker": {"size": 7, "color": WORKS_COLOR},
        }
    ]
    top = max([*busbw, peak or 0.0]) * 1.18 or 1.0
    if tp_bytes is not None:
        label = f"model's TP all-reduce, {size_text(tp_bytes)}"
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": label,
                "x": [tp_bytes, tp_bytes],
                "y": [0, top],
                "hovertemplate": f"{label}<extra></extra>",
                "line": {"color": TP_COLOR, "width": 1.5, "dash": "dot"},
            }
        )
        # the worker measures that size too: its point stands out on the curve
        measured = [i for i, size in enumerate(sizes) if size == tp_bytes]
        if measured:
            traces.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": label,
                    "showlegend": False,
                    "x": [sizes[i] for i in measured],
                    "y": [busbw[i] for i in measured],
                    "customdata": [hovers[i] + f"<br>{label}" for i in measured],
                    "hovertemplate": "%{customdata}<extra></extra>",
                    "marker": {"size": 13, "symbol": "star", "color": TP_COLOR},
                }
            )
    low, high = min([*sizes, tp_bytes or sizes[0]]), max([*sizes, tp_bytes or sizes[-1]])
    ticks = _size_ticks(low, high)
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    if peak is not None:
        shapes.append(
            {
                "type": "line",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "yref": "y",
                "y0": peak,
                "y1": peak,
                "line": {"color": PEAK_COLOR, "width": 1.5, "dash": "dash"},
            }
        )
        annotations.append(
            {
                "xref": "paper",
                "x": 0,
                "xanchor": "left",
                "yref": "y",
                "y": peak,
                "yanchor": "bottom",
                "text": f"{kind} datasheet {peak:.0f} GB/s per direction",
                "showarrow": False,
                "font": {"size": 11, "color": PEAK_COLOR},
            }
        )
    return figure(
        traces,
        {
            "height": height,
            "margin": {"l": 60, "r": 20, "t": 30, "b": 50},
            **hover_nearest(),
            "xaxis": {
                "type": "log",
                "title": {"text": "message size"},
                # a log axis' range is in powers of ten
                "range": [math.log10(low) - 0.08, math.log10(high) + 0.08],
                "tickvals": ticks,
                "ticktext": [size_text(t) for t in ticks],
            },
            "yaxis": {"title": {"text": "bus bandwidth (GB/s)"}, "range": [0, top], "rangemode": "tozero"},
            "shapes": shapes,
            "annotations": annotations,
            "showlegend": tp_bytes is not None,
            "legend": legend_on_top(),
        },
        meta={"bytes": sizes, "busbw_gbps": busbw, "peak_gbps": peak, "model_tp_bytes": tp_bytes},
    )


def size_fraction(point: dict[str, Any], peak: float | None) -> float | None:
    """A size's bus bandwidth as a share of the link's: the probe's own figure, else computed."""
    fraction = _number(point.get("peak_fraction"))
    if fraction is not None:
        return fraction
    busbw = _number(point.get("busbw_gbps"))
    return busbw / peak if busbw is not None and peak else None
