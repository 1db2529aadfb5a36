"""The last good run before a crash: the most recent report of the same project that launched the same
model on the same server and came up clean, and what the crash did differently from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Case, IntegerField, Q, Value, When

from dispatchlab.core.lastgood import CLEAN_OUTCOMES, GoodRunDiff, compare_with_good_run
from dispatchlab.core.lineindex import LineIndex
from dispatchlab.reports.models import Report
from dispatchlab.reports.selectors import report_line_index

# How much of each log is read to find the new lines: the head (arguments, backend choices, warnings)
# and the tail (the crash) of a long log, so that a page of a gigabyte log costs what a short one does.
LINES_READ = 40_000
LINE_CHARS = 2_000


@dataclass(frozen=True)
class LastGoodRun:
    report: Report
    diff: GoodRunDiff
    # False when a log was longer than LINES_READ and only its head and tail were compared.
    whole_logs: bool


def last_good_report(report: Report) -> Report | None:
    """The clean run the crash is read against: the same project, server and model, parsed, with an outcome
    of ready or serving (it came up and did not crash), uploaded before it; one on the crash's own GPU arch first. None for a
    report that did not crash or names no model."""
    if report.outcome != "crashed" or not report.model_name:
        return None
    candidates = (
        Report.objects.filter(
            project_id=report.project_id,
            status=Report.Status.DONE,
            outcome__in=sorted(CLEAN_OUTCOMES),
            server=report.server,
            model_name=report.model_name,
        )
        .filter(Q(created_at__lt=report.created_at) | Q(created_at=report.created_at, pk__lt=report.pk))
        .exclude(pk=report.pk)
    )
    same_arch = Case(When(arch=report.arch, then=Value(0)), default=Value(1), output_field=IntegerField())
    return candidates.order_by(same_arch, "-created_at", "-pk").first()


def _lines(index: LineIndex | None, line_count: int) -> tuple[list[tuple[int, str]], bool]:
    if index is None:
        return [], True
    if line_count <= LINES_READ:
        texts = index.read_lines(1, LINES_READ, max_chars=LINE_CHARS)
        return [(number, text) for number, (text, _size) in enumerate(texts, 1)], True
    half = LINES_READ // 2
    head = index.read_lines(1, half, max_chars=LINE_CHARS)
    tail_start = line_count - half + 1
    tail = index.read_lines(tail_start, half, max_chars=LINE_CHARS)
    numbered = list(enumerate((text for text, _ in head), 1))
    numbered += list(enumerate((text for text, _ in tail), tail_start))
    return numbered, False


def _line_count(report: Report) -> int:
    return report.line_count or int(report.document_field("line_count") or 0)


def last_good_run(report: Report) -> LastGoodRun | None:
    """The crash compared with its last good run, or None when there is no such run."""
    good = last_good_report(report)
    if good is None or not isinstance(report.document, dict) or not isinstance(good.document, dict):
        return None
    crash_lines, crash_whole = _lines(report_line_index(report), _line_count(report))
    good_lines, good_whole = _lines(report_line_index(good), _line_count(good))
    diff = compare_with_good_run(
        report.document, good.document, crash_lines, (text for _number, text in good_lines)
    )
    return LastGoodRun(report=good, diff=diff, whole_logs=crash_whole and good_whole)


def last_good_context(report: Report) -> dict[str, Any]:
    """The report page's "compared with the last good run" panel."""
    found = last_good_run(report)
    if found is None:
        return {"last_good": None}
    tables = [
        ("Arguments", found.diff.args),
        ("Versions", found.diff.versions),
        ("Resolved backends", found.diff.backends),
    ]
    return {"last_good": found, "diff_tables": tables, "lines_read_half": LINES_READ // 2}
