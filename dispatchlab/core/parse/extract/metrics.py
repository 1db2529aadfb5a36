"""Throughput over time: the sampled batch-statistics lines of SGLang and vLLM as metric points."""

from __future__ import annotations

from typing import Any

from dispatchlab.core.lazyre import lazy_compile
from dispatchlab.core.parse.lineformat import split_line
from dispatchlab.core.parse.observations import Observations
from dispatchlab.core.reading import decode_line

_FIELDS = [
    (
        "gen_throughput",
        lazy_compile(r"gen throughput \(token/s\): ([\d.]+)|Avg generation throughput: ([\d.]+)"),
    ),
    (
        "input_throughput",
        lazy_compile(r"input throughput \(token/s\): ([\d.]+)|Avg prompt throughput: ([\d.]+)"),
    ),
    ("running", lazy_compile(r"#running-req: (\d+)|Running: (\d+) reqs")),
    ("queued", lazy_compile(r"#queue-req: (\d+)|Waiting: (\d+) reqs")),
    ("token_usage", lazy_compile(r"token usage: ([\d.]+)|KV cache usage: ([\d.]+)%")),
]


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _kind(msg: str) -> str | None:
    if msg.startswith("Decode batch"):
        return "decode"
    if msg.startswith("Prefill batch"):
        return "prefill"
    return "vllm" if "Avg prompt throughput" in msg else None


class Metrics:
    """Not rule-driven: the scan hands it the statistics lines it sampled."""

    def __init__(self, obs: Observations) -> None:
        self.obs = obs

    def sample(self, raw: bytes, number: int) -> None:
        obs = self.obs
        line = split_line(number, decode_line(raw), obs.year)
        kind = _kind(line.msg)
        if kind is None:
            return
        if kind != "prefill":
            obs.first_decode_line = obs.first_decode_line or number
        point: dict[str, Any] = {"line": number, "time": line.time, "rank": line.rank, "kind": kind}
        for field_name, pattern in _FIELDS:
            found = pattern.search(line.msg)
            point[field_name] = (
                _number(next((g for g in found.groups() if g is not None), None)) if found else None
            )
        if point["token_usage"] is not None and kind == "vllm":
            point["token_usage"] = point["token_usage"] / 100.0
        obs.last_metric_line = number
        obs.metric_points.append(point)
        if line.time:
            obs.last_time = line.time
