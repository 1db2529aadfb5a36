"""Browser flows: upload -> progress -> report with the timeline drawn -> evidence line in the log."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from playwright.sync_api import expect
from seedlog import HOSTILE, fixed_run_lines, seed_case_lines

from dispatchlab.core.crashline import crash_line
from dispatchlab.reports.analysis import report_analyze
from dispatchlab.reports.models import Report
from dispatchlab.reports.submit import report_create

pytestmark = pytest.mark.browser

REPORT_URL = re.compile(r"/reports/(\d+)/$")


def _drop_files(page: Any, selector: str, files: dict[str, str]) -> None:
    """A real drop event carrying File objects, as a drag from the desktop delivers it."""
    transfer = page.evaluate_handle(
        """(files) => {
            const dt = new DataTransfer();
            for (const [name, text] of Object.entries(files)) dt.items.add(new File([text], name, {type: "text/plain"}));
            return dt;
        }""",
        files,
    )
    page.dispatch_event(selector, "drop", {"dataTransfer": transfer})


def _analyzed_report(lab: Any, alice: Any, lines: list[str]) -> Report:
    upload = SimpleUploadedFile("seed-tp4.log", ("\n".join(lines) + "\n").encode())
    report = report_create(project=lab, user=alice, files=[upload], title="DSv4 EAGLE TP4 on RTX PRO 6000")
    report_analyze(report_id=report.pk)
    report.refresh_from_db()
    assert report.status == Report.Status.DONE, report.error
    return report


def test_upload_watch_progress_and_land_on_the_drawn_timeline(page, background_analysis, artifacts: Path):
    lines = seed_case_lines(filler=300)
    page.goto("/upload/")
    # several files in one drop: the log split in two parts, read in order as one report
    _drop_files(
        page,
        "#dropzone",
        {"seed-part1.log": "\n".join(lines[:200]) + "\n", "seed-part2.log": "\n".join(lines[200:]) + "\n"},
    )
    listed = page.locator("#file-list li").all_inner_texts()
    assert [name.split(" (")[0] for name in listed] == ["seed-part1.log", "seed-part2.log"]
    page.click("#upload-button")

    # the upload progress bar fills, then the parse progress fragment takes over
    expect(page.locator("#upload-progress progress")).to_have_js_property("value", 100)
    status = page.wait_for_selector("#parse-progress #report-status")
    seen = status.inner_text()
    page.screenshot(path=str(artifacts / "upload-progress.png"), full_page=True)
    assert "Waiting for a worker" in seen or "Parsing" in seen or "ready" in seen

    # htmx polls until the report is done, then the browser moves to the report page
    page.wait_for_url(REPORT_URL, timeout=30_000)
    report_id = int(REPORT_URL.search(page.url).group(1))
    page.wait_for_selector("#timeline-chart[data-drawn='1']")

    chart = page.locator("#timeline-chart")
    assert chart.locator(".barlayer .point path, .barlayer .point").count() >= 16  # phases of 4 ranks
    assert chart.locator(".scatterlayer .point").count() >= 4  # decisions, warnings, the crash
    lanes = chart.locator(".yaxislayer-above .ytick text").all_text_contents()
    assert "TP0 main" in lanes and "TP0 draft" in lanes and "TP3 draft" in lanes

    diagnosis = page.locator("#diagnosis")
    assert "Speculative draft" in diagnosis.inner_text()
    assert "Tried and failed" in diagnosis.inner_text()
    assert page.locator("#backends tr.differs").count() >= 1
    page.screenshot(path=str(artifacts / "report-page.png"), full_page=True)
    page.screenshot(path=str(artifacts / "report-top.png"))
    chart.screenshot(path=str(artifacts / "report-timeline.png"))

    # a match's evidence link lands on its line in the log viewer
    link = diagnosis.locator("a.evidence-link").first
    line = int(link.inner_text().lstrip("L"))
    link.click()
    page.wait_for_url(re.compile(rf"/reports/{report_id}/log/\?line={line}#L{line}$"))
    row = page.locator(f"tr#L{line}")
    assert "target" in (row.get_attribute("class") or "")
    assert page.evaluate(f"document.querySelector('tr#L{line}').matches(':target')")
    top = row.bounding_box()["y"]
    assert 0 <= top <= 1000, "the evidence line is scrolled into view"
    page.screenshot(path=str(artifacts / "log-evidence.png"))
    assert page.dialogs == []


def test_hovering_the_crash_shows_the_exception_and_a_click_opens_its_line(page, lab, alice):
    report = _analyzed_report(lab, alice, seed_case_lines(filler=50))
    page.goto(f"/reports/{report.pk}/")
    page.wait_for_selector("#timeline-chart[data-drawn='1']")
    at = crash_line(report.document)  # the exception's own line, as every crash pointer names it
    # the crash trace is the last one; its markers are the red X's
    marker = page.locator("#timeline-chart .scatterlayer .trace").last.locator(".point").first
    marker.scroll_into_view_if_needed()
    box = marker.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    hover = page.wait_for_selector(".hoverlayer .hovertext")
    label = hover.text_content()
    assert "crash" in label and f"line {at}" in label
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_url(re.compile(rf"/log/\?line={at}#L{at}$"))
    assert "crash" in (page.locator(f"tr#L{at}").get_attribute("class") or "")


def test_a_log_with_script_and_img_tags_renders_as_inert_text(page, lab, alice, artifacts: Path):
    lines = seed_case_lines(filler=50)
    report = _analyzed_report(lab, alice, lines)
    number = next(i for i, text in enumerate(lines, 1) if HOSTILE[0] in text)
    page.goto(f"/reports/{report.pk}/log/?line={number}#L{number}")
    row = page.locator(f"tr#L{number}")
    assert HOSTILE[0] in row.inner_text()
    assert HOSTILE[1] in page.locator(f"tr#L{number + 1}").inner_text()
    assert page.locator("table.log script, table.log img").count() == 0
    assert page.evaluate("document.body.dataset.pwned") is None
    page.screenshot(path=str(artifacts / "log-hostile.png"))

    # search results show them as text too
    page.goto(f"/reports/{report.pk}/log/?q=onerror")
    assert HOSTILE[1] in page.locator("#search-results").inner_text()
    assert page.locator("#search-results img").count() == 0

    # and the timeline's hover labels (the warnings carry the text)
    page.goto(f"/reports/{report.pk}/")
    page.wait_for_selector("#timeline-chart[data-drawn='1']")
    assert page.locator("#timeline-chart img, #timeline-chart script").count() == 0
    assert page.evaluate("document.body.dataset.pwned") is None
    assert page.dialogs == []


def test_the_report_page_follows_parsing_progress_live(page, lab, alice):
    report = report_create(
        project=lab,
        user=alice,
        files=[SimpleUploadedFile("seed.log", ("\n".join(seed_case_lines(filler=20)) + "\n").encode())],
    )
    Report.objects.filter(pk=report.pk).update(status=Report.Status.PARSING, progress=30.0)
    page.goto(f"/reports/{report.pk}/")
    expect(page.locator("#report-status progress")).to_have_js_property("value", 30)
    Report.objects.filter(pk=report.pk).update(progress=70.0)
    expect(page.locator("#report-status progress")).to_have_js_property("value", 70)
    assert "70" in page.locator("#report-status .pct").inner_text()
    # the parse finishes: the page turns into the report by itself
    Report.objects.filter(pk=report.pk).update(status=Report.Status.QUEUED)
    report_analyze(report_id=report.pk)
    page.wait_for_selector("#timeline-chart[data-drawn='1']")
    assert page.url.endswith(f"/reports/{report.pk}/")


def test_compare_the_crash_with_the_fixed_run(page, lab, alice, artifacts: Path):
    crash = _analyzed_report(lab, alice, seed_case_lines(filler=50))
    fixed = _analyzed_report(lab, alice, fixed_run_lines(decode_batches=150))
    page.goto(f"/reports/{fixed.pk}/")
    page.wait_for_selector("#throughput-chart[data-drawn='1']")
    assert page.locator("#throughput-chart .scatterlayer .trace").count() >= 2
    page.locator("#throughput").screenshot(path=str(artifacts / "report-throughput.png"))

    page.goto(f"/compare/?a={crash.pk}&b={fixed.pk}")
    first = page.locator("#first-difference").inner_text()
    assert "moe_runner_backend" in first and "triton" in first and "flashinfer_cutlass" in first
    assert page.locator("#compare-args tr.differs").count() >= 1
    page.screenshot(path=str(artifacts / "compare.png"), full_page=True)

    page.goto("/")
    assert page.locator("table.reports tbody tr").count() == 2
    page.screenshot(path=str(artifacts / "report-list.png"))

    page.goto("/groups/")
    assert page.locator("svg.sparkline").count() == 1
    page.screenshot(path=str(artifacts / "groups.png"))
    assert page.dialogs == []
