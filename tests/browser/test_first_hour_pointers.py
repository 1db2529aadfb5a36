"""Issue #21 in the browser: every pointer to the crash lands on the same log line, and a vLLM log under a
header dispatchlab does not know gets vLLM's flags only (the server inferred from the lines that name it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from dispatchlab.core.crashline import crash_line
from dispatchlab.reports.analysis import report_analyze
from dispatchlab.reports.models import Report
from dispatchlab.reports.submit import report_create

pytestmark = pytest.mark.browser

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CRASHES = [
    FIXTURES / "logs" / "sglang_dsv4_eagle_sm120.log",
    FIXTURES / "cases" / "vllm-27508.log",
    FIXTURES / "cases" / "sglang-3582.log",
]


def _analyzed(lab: Any, alice: Any, log: Path) -> Report:
    upload = SimpleUploadedFile(log.name, log.read_bytes())
    report = report_create(project=lab, user=alice, files=[upload], title=log.name)
    report_analyze(report_id=report.pk)
    report.refresh_from_db()
    assert report.status == Report.Status.DONE, report.error
    return report


@pytest.mark.parametrize("log", CRASHES, ids=[log.name for log in CRASHES])
def test_the_header_the_diagnosis_the_timeline_and_the_log_viewer_point_at_one_line(
    page, lab, alice, artifacts, log
):
    report = _analyzed(lab, alice, log)
    line = crash_line(report.document)
    assert line is not None
    page.goto(f"/reports/{report.pk}/")
    jump = page.locator("a.button.danger", has_text="Jump to crash")
    assert jump.inner_text().strip().endswith(f"L{line}")
    assert page.locator("p.crash-line a").first.get_attribute("href").endswith(f"#L{line}")
    timeline_crash = page.locator("#timeline li.event-crash a")
    if timeline_crash.count():
        assert timeline_crash.first.get_attribute("href").endswith(f"#L{line}")
    else:  # a drawn chart: its crash marker's line is in the figure's data
        # a locator wait, not wait_for_function: the page's CSP refuses the eval that a string predicate needs
        page.locator("#timeline-chart .main-svg").first.wait_for()
        marker = page.evaluate(
            "JSON.parse(document.getElementById('timeline-fig').textContent).data"
            ".filter(t => t.name === 'crash').flatMap(t => t.customdata.map(p => p[1]))"
        )
        assert marker and set(marker) == {line}
    page.screenshot(path=str(artifacts / f"pointers-{log.stem}.png"), full_page=False)
    jump.click()
    page.wait_for_url(re.compile(rf"/reports/{report.pk}/log/\?line={line}#L{line}$"))
    assert page.evaluate(f"document.querySelector('tr#L{line}').matches(':target')")
    viewer_button = page.locator("a", has_text=re.compile(r"crash", re.I)).first
    assert viewer_button.get_attribute("href").endswith(f"#L{line}")
    assert page.dialogs == []


def test_a_vllm_log_under_an_unknown_header_gets_vllm_flags_only(page, lab, alice, artifacts):
    report = _analyzed(lab, alice, FIXTURES / "servers" / "vllm_wrapped_nccl_timeout.log")
    page.goto(f"/reports/{report.pk}/")
    server = page.locator(".server-inferred").first
    assert "inferred from" in server.inner_text()
    assert report.document["server"] == "vllm"
    patch = page.locator("#patch-top")
    shown = patch.inner_text() if patch.count() else ""
    assert "--dist-timeout" not in shown and "--moe-runner-backend" not in shown
    assert "which vllm does not take" in page.locator("body").inner_text()
    page.screenshot(path=str(artifacts / "server-inferred-vllm.png"), full_page=False)
    assert page.dialogs == []
