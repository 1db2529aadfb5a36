"""A structured diff of two match documents: e.g. the crash and the run that fixed it.

The first differing backend decision goes on top, because in a bring-up that is usually the answer:
which component resolved to something else, on which model, and which log line decided it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dispatchlab.core.parse.vocabulary import PHASE_ORDER
from dispatchlab.core.signatures import BACKEND_KEYS

# the contract's backend keys, in the core's order (the rest of BACKEND_KEYS are extras)
BACKEND_ORDER = list(BACKEND_KEYS[:10])
VERSION_ORDER = ["sglang", "vllm", "torch", "cuda", "driver", "flashinfer", "sgl_kernel", "triton"]
NO_LINE = 1 << 62


def ordered_keys(*dicts: dict[str, Any], order: list[str] = BACKEND_ORDER) -> list[str]:
    keys = set().union(*(d.keys() for d in dicts))
    rank = {key: i for i, key in enumerate(order)}
    return sorted(keys, key=lambda key: (rank.get(key, len(order)), key))


def show(value: Any) -> str:
    """A JSON scalar as a person reads it: strings bare, the rest as JSON."""
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


@dataclass
class Side:
    value: str | None
    source: str | None = None
    line: int | None = None
    text: str | None = None


@dataclass
class BackendRow:
    model: str  # "main" | "draft"
    key: str
    a: Side
    b: Side
    differs: bool
    first_line: int  # the earliest log line that decided this value, in either report

    @property
    def decided_at(self) -> str:
        return "" if self.first_line == NO_LINE else str(self.first_line)


@dataclass
class ValueRow:
    key: str
    a: str
    b: str
    differs: bool


@dataclass
class PhaseRow:
    model: str
    name: str
    a: float | None
    b: float | None
    delta: float | None
    differs: bool  # present in one only, or more than 10% and 1 s apart


@dataclass
class Comparison:
    first_difference: BackendRow | None
    backends: list[BackendRow]
    summary: list[ValueRow]
    versions: list[ValueRow]
    args: list[ValueRow]  # only the arguments both reports set, to different values
    args_same: int
    phases: list[PhaseRow]
    notes: list[str] = field(default_factory=list)
    # Arguments one report sets and the other does not print at all (often: one log has no args dump).
    args_only_a: list[ValueRow] = field(default_factory=list)
    args_only_b: list[ValueRow] = field(default_factory=list)
    args_note: str = ""  # said when one log prints no arguments at all
    backends_resolved: bool = True  # False: neither report resolved any backend, nothing to compare

    @property
    def backends_same(self) -> bool:
        return self.backends_resolved and self.first_difference is None


def _side(values: dict[str, Any], origins: dict[str, Any], key: str) -> Side:
    if key not in values:
        return Side(None)
    origin = origins.get(key) if isinstance(origins.get(key), dict) else {}
    line = origin.get("line") if isinstance(origin.get("line"), int) else None
    return Side(show(values[key]), origin.get("source"), line, origin.get("text"))


def backend_rows(a: dict[str, Any], b: dict[str, Any]) -> list[BackendRow]:
    rows = []
    for model, values_key, origins_key in (
        ("main", "backends", "backend_origins"),
        ("draft", "draft_backends", "draft_backend_origins"),
    ):
        a_values, b_values = a.get(values_key) or {}, b.get(values_key) or {}
        a_origins, b_origins = a.get(origins_key) or {}, b.get(origins_key) or {}
        for key in ordered_keys(a_values, b_values):
            left, right = _side(a_values, a_origins, key), _side(b_values, b_origins, key)
            lines = [side.line for side in (left, right) if side.line is not None]
            rows.append(
                BackendRow(
                    model=model,
                    key=key,
                    a=left,
                    b=right,
                    differs=left.value != right.value,
                    first_line=min(lines) if lines else NO_LINE,
                )
            )
    return rows


def _first_difference(rows: list[BackendRow]) -> BackendRow | None:
    """The differing backend decided earliest in the log; values with no deciding line (defaults)
    come after those with one, main before draft, then in the canonical key order."""
    differing = [(i, row) for i, row in enumerate(rows) if row.differs]
    if not differing:
        return None
    return min(differing, key=lambda item: (item[1].first_line, item[1].model != "main", item[0]))[1]


def _value_rows(
    a: dict[str, Any], b: dict[str, Any], order: list[str], *, only_differing: bool
) -> list[ValueRow]:
    rows = []
    for key in ordered_keys(a, b, order=order):
        left, right = show(a.get(key)), show(b.get(key))
        if key not in a:
            left = "(absent)"
        if key not in b:
            right = "(absent)"
        differs = left != right
        if differs or not only_differing:
            rows.append(ValueRow(key, left, right, differs))
    return rows


def _phase_seconds(doc: dict[str, Any]) -> dict[tuple[str, str], float | None]:
    """Seconds per (model, phase): the slowest rank, since the launch waits for it."""
    out: dict[tuple[str, str], float | None] = {}
    for phase in doc.get("phases") or []:
        key = (str(phase.get("model") or "main"), str(phase.get("name") or "?"))
        seconds = phase.get("seconds")
        seconds = float(seconds) if isinstance(seconds, int | float) else None
        if key not in out or (seconds is not None and (out[key] is None or seconds > out[key])):  # type: ignore[operator]
            out[key] = seconds
    return out


def _phase_rows(a: dict[str, Any], b: dict[str, Any]) -> list[PhaseRow]:
    left, right = _phase_seconds(a), _phase_seconds(b)
    rank = {name: i for i, name in enumerate(PHASE_ORDER)}
    keys = sorted(set(left) | set(right), key=lambda k: (k[0] != "main", rank.get(k[1], 99), k[1]))
    rows = []
    for model, name in keys:
        sa, sb = left.get((model, name)), right.get((model, name))
        present_both = (model, name) in left and (model, name) in right
        delta = None if sa is None or sb is None else round(sb - sa, 3)
        differs = not present_both or (
            delta is not None and abs(delta) >= 1.0 and abs(delta) > 0.1 * max(abs(sa or 0), abs(sb or 0))
        )
        rows.append(PhaseRow(model, name, sa, sb, delta, differs))
    return rows


def _resolves_a_backend(doc: dict[str, Any]) -> bool:
    return any(
        value is not None for key in ("backends", "draft_backends") for value in (doc.get(key) or {}).values()
    )


def _args_note(args_a: dict[str, Any], args_b: dict[str, Any]) -> str:
    for mine, other, name in ((args_a, args_b, "first"), (args_b, args_a, "second")):
        if mine and not other:
            return (
                f"Only the {name} report's log prints its server arguments: the other's are unknown, "
                "not absent."
            )
    return ""


def compare_documents(a: dict[str, Any], b: dict[str, Any]) -> Comparison:
    backends = backend_rows(a, b)
    gpu_a, gpu_b = a.get("gpu") or {}, b.get("gpu") or {}
    summary_a = {
        "server": a.get("server"),
        "server_version": a.get("server_version"),
        "model": a.get("model"),
        "gpu": gpu_a.get("name"),
        "arch": gpu_a.get("arch"),
        "gpu_count": gpu_a.get("count"),
        "outcome": a.get("outcome"),
        "failure_class": a.get("failure_class"),
        "crash_phase": (a.get("crash") or {}).get("phase"),
        "fingerprint": a.get("fingerprint"),
    }
    summary_b = {
        "server": b.get("server"),
        "server_version": b.get("server_version"),
        "model": b.get("model"),
        "gpu": gpu_b.get("name"),
        "arch": gpu_b.get("arch"),
        "gpu_count": gpu_b.get("count"),
        "outcome": b.get("outcome"),
        "failure_class": b.get("failure_class"),
        "crash_phase": (b.get("crash") or {}).get("phase"),
        "fingerprint": b.get("fingerprint"),
    }
    args_a, args_b = a.get("server_args") or {}, b.get("server_args") or {}
    differing = _value_rows(args_a, args_b, [], only_differing=True)
    notes = []
    if (a.get("draft_backends") or {}) and not (b.get("draft_backends") or {}):
        notes.append("Only the first report runs a draft (speculative) model.")
    elif (b.get("draft_backends") or {}) and not (a.get("draft_backends") or {}):
        notes.append("Only the second report runs a draft (speculative) model.")
    return Comparison(
        first_difference=_first_difference(backends),
        backends=backends,
        summary=_value_rows(summary_a, summary_b, list(summary_a), only_differing=False),
        versions=_value_rows(
            a.get("versions") or {}, b.get("versions") or {}, VERSION_ORDER, only_differing=False
        ),
        args=[row for row in differing if row.key in args_a and row.key in args_b],
        args_same=len(set(args_a) | set(args_b)) - len(differing),
        phases=_phase_rows(a, b),
        notes=notes,
        args_only_a=[row for row in differing if row.key not in args_b],
        args_only_b=[row for row in differing if row.key not in args_a],
        args_note=_args_note(args_a, args_b),
        backends_resolved=_resolves_a_backend(a) or _resolves_a_backend(b),
    )
