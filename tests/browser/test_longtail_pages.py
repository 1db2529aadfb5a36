"""The pages of the long tail (issue #9, item 4) in a real browser: a short crash no signature knows, a
vLLM crash timed by `MM-DD HH:MM:SS`, and the comparison of a log with an args dump and one without.
Screenshots go to test-artifacts/."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from dispatchlab.reports.analysis import report_analyze
from dispatchlab.reports.models import Report
from dispatchlab.reports.submit import report_create

pytestmark = pytest.mark.browser

VLLM_OOM = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "vllm_engine_core_oom.log"

# An SGLang launch that dies on a malformed chat template before the scheduler starts: a dozen lines, one
# timestamp, and a traceback that no signature of the knowledge base describes.
SHORT_UNKNOWN = """\
[2025-12-02 14:03:11] server_args=ServerArgs(model_path='Qwen/Qwen3-8B', tokenizer_path='Qwen/Qwen3-8B', host='0.0.0.0', port=30000, tp_size=1, mem_fraction_static=0.88, chat_template='/models/templates/qwen3_tools.jinja')
[2025-12-02 14:03:14] Using default HuggingFace chat template with detected content format: string
Traceback (most recent call last):
  File "/usr/lib/python3.12/runpy.py", line 198, in _run_module_as_main
    return _run_code(code, main_globals, None,
  File "/sgl-workspace/sglang/python/sglang/launch_server.py", line 14, in <module>
    launch_server(server_args)
  File "/sgl-workspace/sglang/python/sglang/srt/entrypoints/http_server.py", line 1128, in launch_server
    tokenizer_manager, template_manager, scheduler_info = _launch_subprocesses(server_args=server_args)
  File "/sgl-workspace/sglang/python/sglang/srt/managers/template_manager.py", line 117, in load_chat_template
    self._load_jinja_template(chat_template_arg)
  File "/sgl-workspace/sglang/python/sglang/srt/managers/template_manager.py", line 163, in _load_jinja_template
    raise jinja2.exceptions.TemplateSyntaxError(message, lineno)
jinja2.exceptions.TemplateSyntaxError: expected token 'end of statement block', got 'tool' (line 42)
"""


def _analyzed(lab: Any, alice: Any, name: str, text: str, title: str) -> Report:
    upload = SimpleUploadedFile(name, text.encode())
    report = report_create(project=lab, user=alice, files=[upload], title=title)
    report_analyze(report_id=report.pk)
    report.refresh_from_db()
    assert report.status == Report.Status.DONE, report.error
    return report


def _line_of(text: str, needle: str) -> int:
    return next(number for number, line in enumerate(text.splitlines(), 1) if needle in line)


def _jump_to_crash_lands_on(page: Any, report: Report, line: int) -> None:
    jump = page.locator("a.button.danger", has_text="Jump to crash")
    assert jump.inner_text().strip().endswith(f"L{line}")
    jump.click()
    page.wait_for_url(re.compile(rf"/reports/{report.pk}/log/\?line={line}#L{line}$"))
    assert page.evaluate(f"document.querySelector('tr#L{line}').matches(':target')")


def test_a_short_unknown_crash_gets_an_event_list_and_jumps_to_its_exception(page, lab, alice, artifacts):
    report = _analyzed(lab, alice, "qwen3-template.log", SHORT_UNKNOWN, "Qwen3-8B chat template crash")
    assert not report.top_match_id, "the fixture is meant to be a crash no signature knows"
    page.goto(f"/reports/{report.pk}/")
    timeline = page.locator("#timeline")
    assert timeline.locator("#timeline-chart").count() == 0, "too few events for a chart"
    events = timeline.locator("ol.event-list li")
    assert events.count() == 2  # the server args, then the crash (its traceback folded into it)
    crash = timeline.locator("ol.event-list li.event-crash")
    assert "TemplateSyntaxError" in crash.inner_text()
    page.screenshot(path=str(artifacts / "report-short-unknown.png"), full_page=True)

    exception = _line_of(SHORT_UNKNOWN, "jinja2.exceptions.TemplateSyntaxError:")
    assert exception > report.document["crash"]["line"], "the traceback head is not the exception line"
    _jump_to_crash_lands_on(page, report, exception)
    assert "got 'tool' (line 42)" in page.locator(f"tr#L{exception}").inner_text()
    assert page.dialogs == []


def test_a_vllm_crash_is_drawn_on_its_month_day_clock_times(page, lab, alice, artifacts):
    text = VLLM_OOM.read_text()
    report = _analyzed(lab, alice, VLLM_OOM.name, text, "Llama-3.1-70B TP4 OOM in KV cache profiling")
    page.goto(f"/reports/{report.pk}/")
    chart = page.wait_for_selector("#timeline-chart[data-drawn='1']")
    ticks = " ".join(page.locator("#timeline-chart .xaxislayer-above .xtick text").all_text_contents())
    assert "10:2" in ticks, ticks  # the log's clock: 10:21 to 10:23
    assert "1900" not in ticks, "vLLM prints no year: the axis must not invent one"
    assert page.locator("#timeline-chart .scatterlayer .point").count() >= 4
    chart.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "report-vllm-timestamps.png"), full_page=True)
    _jump_to_crash_lands_on(page, report, _line_of(text, "torch.OutOfMemoryError"))
    assert page.dialogs == []


def test_compare_collapses_the_arguments_only_the_log_with_an_args_dump_has(page, lab, alice, artifacts):
    full = VLLM_OOM.read_text()
    # what people often paste: the tail of the log, from the model load on, without the args dump
    tail = "\n".join(line for line in full.splitlines()[5:]) + "\n"
    a = _analyzed(lab, alice, "vllm-full.log", full, "vLLM OOM, whole log")
    b = _analyzed(lab, alice, "vllm-tail.log", tail, "vLLM OOM, pasted tail")
    assert a.document["server_args"] and not b.document["server_args"]
    page.goto(f"/compare/?a={a.pk}&b={b.pk}")
    args = page.locator("#compare-args")
    only_a = args.locator("details#args-only-a")
    count = len(a.document["server_args"])
    assert only_a.locator("summary").inner_text() == f"{count} arguments only in A"
    assert only_a.get_attribute("open") is None and not only_a.locator("table").is_visible()
    assert args.locator("details#args-only-b").count() == 0
    assert "Only the first report's log prints its server arguments" in args.inner_text()
    page.screenshot(path=str(artifacts / "compare-args.png"), full_page=True)

    only_a.locator("summary").click()
    assert only_a.locator("table").is_visible()
    assert "gpu_memory_utilization" in only_a.locator("table").inner_text()
    args.screenshot(path=str(artifacts / "compare-args-open.png"))
    assert page.dialogs == []
