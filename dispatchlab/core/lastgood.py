"""What a crashed run did differently from the last clean run of the same launch: the arguments, versions
and resolved backends that changed, and the log lines the clean run never printed.

CI failure analysers read a failed job against the last green one and hide every line both printed: what
remains is short and usually holds the cause. Lines are compared after the parts that change from run to
run anyway (times, pids, numbers, hex addresses, the directories of paths) are blanked out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# A run that came up: its server became ready, or answered requests, and did not crash.
CLEAN_OUTCOMES = frozenset({"ready", "serving"})
VERSION_ORDER = ("sglang", "vllm", "torch", "cuda", "driver", "flashinfer", "sgl_kernel", "triton")
NEW_LINES_SHOWN = 20
NOT_SET = "(not set)"
NOT_PRINTED = "(not printed)"

_TIMESTAMP = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"  # 2025-12-02 14:03:11,123
    r"|\b\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?"  # vLLM's 12-02 14:03:11
    r"|\b\d{2}:\d{2}:\d{2}(?:\.\d+)?"
)
_PID = re.compile(r"\b(pid|tid|PID|process)([=: ]+)\d+")
_UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b|\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b")
# A path's directories vary with the host, the venv and the snapshot hash; its file name says what it is.
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:/[\w.@+~-]+)+/(?=[\w.@+-]+)")
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?")
_SPACE = re.compile(r"\s+")


def normalise_line(text: str) -> str:
    """The line with what differs between two runs of one launch blanked out, so that equal lines of two
    runs compare equal: `[2025-12-02 14:03:11 TP0] Load weight end. mem=41.2 GB` and the same line of
    another day and size read alike."""
    text = _TIMESTAMP.sub("<t>", text)
    text = _PID.sub(r"\1\2<n>", text)
    text = _UUID.sub("<hex>", text)
    text = _HEX.sub("<hex>", text)
    text = _PATH.sub(".../", text)
    text = _NUMBER.sub("<n>", text)
    return _SPACE.sub(" ", text).strip()


def shown(value: Any) -> str:
    """A JSON value as a person reads it: strings bare, the rest as JSON, nothing as '—'."""
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


@dataclass(frozen=True)
class Change:
    key: str
    good: str  # `missing` of value_changes when that run's log does not print it
    crash: str


@dataclass(frozen=True)
class NewLine:
    line: int
    text: str


@dataclass(frozen=True)
class NewLines:
    """The crash log's lines whose normalised text the good run never printed, each text once."""

    first: list[NewLine]
    total: int

    @property
    def more(self) -> int:
        return self.total - len(self.first)


@dataclass(frozen=True)
class GoodRunDiff:
    args: list[Change]
    versions: list[Change]
    backends: list[Change]
    new_lines: NewLines
    # Said when one side's log prints no arguments at all: its values are unknown, not changed.
    notes: list[str] = field(default_factory=list)

    @property
    def same_setup(self) -> bool:
        return not (self.args or self.versions or self.backends)


def value_changes(
    good: Mapping[str, Any],
    crash: Mapping[str, Any],
    *,
    order: Iterable[str] = (),
    missing: str = NOT_SET,
) -> list[Change]:
    """The keys whose value differs between the two, in `order` first and then by name; a key one side
    lacks reads `missing` there."""
    rank = {key: i for i, key in enumerate(order)}
    keys = sorted(set(good) | set(crash), key=lambda key: (rank.get(key, len(rank)), key))
    changes = []
    for key in keys:
        before = shown(good[key]) if key in good else missing
        after = shown(crash[key]) if key in crash else missing
        if before != after:
            changes.append(Change(key, before, after))
    return changes


def new_log_lines(
    crash_lines: Iterable[tuple[int, str]], good_lines: Iterable[str], *, shown_at_most: int = NEW_LINES_SHOWN
) -> NewLines:
    """The crash log's lines (number, text) that the good run's log never printed, after normalise_line;
    a text printed again (by every rank, say) counts once, at its first line."""
    known = {normalise_line(text) for text in good_lines}
    first: list[NewLine] = []
    total = 0
    for number, text in crash_lines:
        key = normalise_line(text)
        if not key or key in known:
            continue
        known.add(key)
        total += 1
        if len(first) < shown_at_most:
            first.append(NewLine(number, text))
    return NewLines(first, total)


def _dict(doc: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key)
    return dict(value) if isinstance(value, Mapping) else {}


def _backends(doc: Mapping[str, Any]) -> dict[str, Any]:
    merged = _dict(doc, "backends")
    merged.update({f"draft {key}": value for key, value in _dict(doc, "draft_backends").items()})
    return merged


def _versions(doc: Mapping[str, Any]) -> dict[str, Any]:
    versions = {key: value for key, value in _dict(doc, "versions").items() if value is not None}
    if doc.get("server_version") and doc.get("server") in ("sglang", "vllm"):
        versions.setdefault(str(doc["server"]), doc["server_version"])
    return versions


def is_clean(doc: Mapping[str, Any]) -> bool:
    """Whether the document's run came up and served: a good run to compare a crash with."""
    return doc.get("outcome") in CLEAN_OUTCOMES and not doc.get("crash")


def compare_with_good_run(
    crash_doc: Mapping[str, Any],
    good_doc: Mapping[str, Any],
    crash_lines: Iterable[tuple[int, str]] = (),
    good_lines: Iterable[str] = (),
    *,
    shown_at_most: int = NEW_LINES_SHOWN,
) -> GoodRunDiff:
    good_args, crash_args = _dict(good_doc, "server_args"), _dict(crash_doc, "server_args")
    notes = []
    if bool(good_args) != bool(crash_args):
        which = "good run's" if not good_args else "crashed run's"
        notes.append(f"The {which} log prints no server arguments: only the launch's other facts compare.")
        args: list[Change] = []
    else:
        args = value_changes(good_args, crash_args)
    return GoodRunDiff(
        args=args,
        versions=value_changes(
            _versions(good_doc), _versions(crash_doc), order=VERSION_ORDER, missing=NOT_PRINTED
        ),
        backends=value_changes(_backends(good_doc), _backends(crash_doc), missing=NOT_PRINTED),
        new_lines=new_log_lines(crash_lines, good_lines, shown_at_most=shown_at_most),
        notes=notes,
    )
