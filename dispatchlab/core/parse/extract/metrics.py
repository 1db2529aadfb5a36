"""Throughput over time: the sampled batch-statistics lines of SGLang and vLLM as metric points."""

from __future__ import annotations

from typing import Any

from dispatchlab.core.lazyre import lazy_compile
from dispatchlab.core.parse.lineformat import split_line
from dispatchlab.core.parse.observations import Observations
from dispatchlab.core.reading import decode_line

# each field as SGLang's statistics lines print it, then as vLLM's: a line is searched for its own server's
# form only (an alternation of both was tried at every character of the line)
_FIELDS = [
    ("gen_throughput", r"gen throughput \(token/s\): ([\d.]+)", r"Avg generation throughput: ([\d.]+)"),
    ("input_throughput", r"input throughput \(token/s\): ([\d.]+)", r"Avg prompt throughput: ([\d.]+)"),
    ("running", r"#running-req: (\d+)", r"Running: (\d+) reqs"),
    ("queued", r"#queue-req: (\d+)", r"Waiting: (\d+) reqs"),
    ("token_usage", r"token usage: ([\d.]+)", r"KV cache usage: ([\d.]+)%"),
]
_SGLANG_FIELDS = [(name, lazy_compile(sglang)) for name, sglang, _vllm in _FIELDS]
_VLLM_FIELDS = [(name, lazy_compile(vllm)) for name, _sglang, vllm in _FIELDS]


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
        msg = line.msg
        for field_name, pattern in _VLLM_FIELDS if kind == "vllm" else _SGLANG_FIELDS:
            found = pattern.search(msg)
            point[field_name] = _number(found.group(1)) if found else None
        if point["token_usage"] is not None and kind == "vllm":
            point["token_usage"] = point["token_usage"] / 100.0
        obs.last_metric_line = number
        obs.metric_points.append(point)
        if line.time:
            obs.last_time = line.time
