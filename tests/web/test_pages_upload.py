"""Pages: upload, re-analysis, addresses, limits, short logs, compare, filters, duplicates and sparklines."""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone
from fixtures_docs import CRASH_DOC, FIXED_DOC, XSS

from dispatchlab.reports.models import Report

# fixtures are found by name: imported as re-exports
from tests.web.test_pages import (
    _listed as _listed,
)
from tests.web.test_pages import (
    cast as cast,
)
from tests.web.test_pages import (
    crash as crash,
)
from tests.web.test_pages import (
    crash_log_lines as crash_log_lines,
)
from tests.web.test_pages import (
    login as login,
)
from tests.web.test_pages import (
    three as three,
)

# ---- upload ----


def test_a_member_uploads_several_files_as_one_report(client, cast):
    login(client, cast.alice)
    assert b'id="dropzone"' in client.get(reverse("front:upload")).content
    files = [
        SimpleUploadedFile("rank0.log", b"[2025-11-20 09:14:00 TP0] hello\n"),
        SimpleUploadedFile("rank1.log", b"[2025-11-20 09:14:00 TP1] hello\n"),
    ]
    response = client.post(
        reverse("front:upload"),
        {"project": "gpu-lab", "file": files, "title": "two ranks"},
        headers={"X-Requested-With": "XMLHttpRequest"},
    )
    assert response.status_code == 201
    body = response.json()
    report = Report.objects.get(pk=body["id"])
    assert report.project == cast.lab and report.title == "two ranks"
    assert [f.original_name for f in report.files.order_by("position")] == ["rank0.log", "rank1.log"]
    assert body["status_url"] == reverse("front:report_status", args=[report.pk])


def test_a_plain_form_upload_goes_to_the_report_page(client, cast):
    login(client, cast.alice)
    response = client.post(
        reverse("front:upload"), {"project": "gpu-lab", "file": SimpleUploadedFile("a.log", b"line\n")}
    )
    report = Report.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("front:report", args=[report.pk])


def test_a_viewer_cannot_upload(client, cast):
    login(client, cast.bob)
    response = client.post(
        reverse("front:upload"), {"project": "gpu-lab", "file": SimpleUploadedFile("a.log", b"line\n")}
    )
    assert response.status_code == 403 and not Report.objects.exists()
    assert "may read this project&#x27;s reports but not upload" in response.content.decode()


def test_an_outsider_cannot_upload_into_a_project(client, cast):
    login(client, cast.charlie)
    response = client.post(
        reverse("front:upload"),
        {"project": "gpu-lab", "file": SimpleUploadedFile("a.log", b"line\n")},
        headers={"X-Requested-With": "XMLHttpRequest"},
    )
    assert response.status_code == 400 and not Report.objects.filter(project=cast.lab).exists()


def test_an_upload_without_files_is_refused(client, cast):
    login(client, cast.alice)
    response = client.post(reverse("front:upload"), {"project": "gpu-lab"})
    assert response.status_code == 400 and b"Choose a log file or paste a log" in response.content


def test_an_uploaded_file_name_is_shown_as_text(client, cast):
    login(client, cast.alice)
    client.post(
        reverse("front:upload"),
        {"project": "gpu-lab", "file": SimpleUploadedFile("a.log", b"x\n"), "title": XSS},
    )
    html = client.get(reverse("front:report_list")).content.decode()
    assert "<script>alert(1)" not in html and "&lt;script&gt;" in html
    # The title is kept as typed (escaped only where it is shown), not stripped on the way in.
    assert Report.objects.get(project=cast.lab).title == XSS


def test_backticks_in_knowledge_base_prose_become_code_and_nothing_else(client, cast):
    doc = copy.deepcopy(CRASH_DOC)
    doc["matches"][0]["fix"]["summary"] = (
        "Use `--moe-runner-backend flashinfer_cutlass` not `<b>x</b>` <i>y</i>"
    )
    report = cast.report(doc)
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[report.pk])).content.decode()
    assert "<code>--moe-runner-backend flashinfer_cutlass</code>" in html
    assert "<code>&lt;b&gt;x&lt;/b&gt;</code> &lt;i&gt;y&lt;/i&gt;" in html


MINIMAL_DOC = {
    "server": "sglang",
    "server_version": None,
    "model": None,
    "gpu": {"name": None, "arch": None, "count": None},
    "server_args": {},
    "backends": {"attention_backend": "fa3"},
    "draft_backends": {},
    "timeline": [
        {"line": 3, "time": None, "rank": None, "kind": "error", "name": "exception", "detail": "boom"}
    ],
    "tracebacks": [],
    "kernels": [],
    "crash": {"line": 3, "phase": None, "exception": None, "message": "boom"},
    "outcome": "crashed",
    "matches": [],
    "failure_class": "other",
    "fingerprint": "abc",
}


def test_a_document_with_only_the_contract_fields_renders_everywhere(client, cast):
    report = cast.report(MINIMAL_DOC, lines=["a", "b", "boom"])
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[report.pk])).content.decode()
    assert "No known signature matched" in html or "no known signature matched" in html
    assert client.get(reverse("front:log", args=[report.pk]) + "?line=3").status_code == 200
    other = cast.report(CRASH_DOC)
    assert client.get(reverse("front:compare"), {"a": report.pk, "b": other.pk}).status_code == 200


# ---- a report being analysed again keeps its diagnosis ----


@pytest.mark.parametrize("status", ["queued", "parsing"])
def test_a_report_being_reanalysed_keeps_showing_its_diagnosis_with_a_banner(client, cast, crash, status):
    Report.objects.filter(pk=crash.pk).update(status=status, progress=30.0)
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[crash.pk])).content.decode()
    assert CRASH_DOC["matches"][0]["title"] in html
    assert 'id="timeline-chart"' in html and 'id="backends"' in html
    assert "re-analysing with the current knowledge base…" in html
    status_url = reverse("front:report_status", args=[crash.pk])
    assert f'hx-get="{status_url}"' in html
    assert "Waiting for a worker" not in html and "Parsing the log" not in html


def test_the_status_fragment_of_a_report_being_reanalysed_is_the_banner(client, cast, crash):
    Report.objects.filter(pk=crash.pk).update(status="queued")
    login(client, cast.alice)
    html = client.get(
        reverse("front:report_status", args=[crash.pk]), headers={"HX-Request": "true"}
    ).content.decode()
    assert "re-analysing with the current knowledge base…" in html and "hx-get" in html


def test_a_failed_reanalysis_keeps_the_previous_diagnosis_and_says_why(client, cast, crash):
    Report.objects.filter(pk=crash.pk).update(status="failed", error="internal error while parsing: boom")
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[crash.pk])).content.decode()
    assert CRASH_DOC["matches"][0]["title"] in html
    assert "internal error while parsing: boom" in html and "previous" in html


def test_a_report_being_reanalysed_keeps_its_row_and_its_place_in_compare(client, cast, three):
    crash, fixed, _ = three
    Report.objects.filter(pk=crash.pk).update(status="parsing", progress=30.0)
    login(client, cast.alice)
    html = client.get(reverse("front:report_list")).content.decode()
    row = html[html.index(f'href="/reports/{crash.pk}/"') :]
    row = row[: row.index("</tr>")]
    assert "arch_unsupported_kernel" in row and CRASH_DOC["matches"][0]["title"][:40] in row
    assert "re-analysing" in row
    group_html = client.get(reverse("front:group", args=[crash.group_id])).content.decode()
    assert "arch_unsupported_kernel</span>" in group_html
    picker = client.get(reverse("front:compare")).content.decode()
    assert f'<option value="{crash.pk}"' in picker
    other = client.get(reverse("front:report", args=[fixed.pk])).content.decode()
    assert f'<option value="{crash.pk}"' in other
    compared = client.get(reverse("front:compare"), {"a": crash.pk, "b": fixed.pk}).content.decode()
    assert 'id="first-difference"' in compared


# ---- numbers in the address ----


def test_unicode_digits_in_the_address_are_bad_values_not_errors(client, cast, crash):
    login(client, cast.alice)
    assert client.get(reverse("front:report_list"), {"q": "²"}).status_code == 200
    assert client.get(reverse("front:groups"), {"q": "²"}).status_code == 200
    picker = client.get(reverse("front:compare"), {"a": "²", "b": crash.pk})
    assert picker.status_code == 200 and '<select name="a"' in picker.content.decode()
    log = reverse("front:log", args=[crash.pk])
    for params in ({"line": "²"}, {"start": "²"}, {"q": "filler", "from": "²"}, {"line": "١٢"}):
        assert client.get(log, params).status_code == 200, params


# ---- upload limits ----


def test_a_form_upload_over_the_limit_is_refused_before_it_is_read(client, cast, settings):
    settings.DISPATCHLAB_MAX_UPLOAD_BYTES = 10
    login(client, cast.alice)
    # The declared length is far beyond the body: reading the body would fail the test client.
    upload = {"project": "gpu-lab", "file": SimpleUploadedFile("a.log", b"line\n")}
    response = client.post(reverse("front:upload"), upload, CONTENT_LENGTH=str(50 * 1024 * 1024))
    assert response.status_code == 413
    assert "the limit is 10 bytes" in response.content.decode()
    response = client.post(
        reverse("front:upload"),
        upload,
        CONTENT_LENGTH=str(50 * 1024 * 1024),
        headers={"X-Requested-With": "XMLHttpRequest"},
    )
    assert response.status_code == 413 and "the limit is 10 bytes" in response.json()["error"]
    assert not Report.objects.exists()


def test_the_upload_form_still_needs_the_csrf_token(cast):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    login(client, cast.alice)
    response = client.post(
        reverse("front:upload"), {"project": "gpu-lab", "file": SimpleUploadedFile("a.log", b"line\n")}
    )
    assert response.status_code == 403 and not Report.objects.exists()
    client.get(reverse("front:upload"))
    token = client.cookies["csrftoken"].value
    response = client.post(
        reverse("front:upload"),
        {"project": "gpu-lab", "file": SimpleUploadedFile("a.log", b"line\n"), "csrfmiddlewaretoken": token},
    )
    assert response.status_code == 302 and Report.objects.count() == 1


# ---- the page of a short or unknown log (issue #9, item 4) ----


def short_unknown_doc() -> dict:
    doc = copy.deepcopy(CRASH_DOC)
    doc["timeline"] = doc["timeline"][:1]
    doc["phases"] = []
    doc["metrics"] = {"points": [], "total": 0, "sampled_every": 1}
    return doc


def test_a_log_with_fewer_than_three_timed_events_gets_an_event_list_not_a_chart(client, cast):
    login(client, cast.alice)
    report = cast.report(short_unknown_doc(), lines=crash_log_lines())
    html = client.get(reverse("front:report", args=[report.pk])).content.decode()
    assert 'class="event-list' in html and 'id="timeline-fig"' not in html
    assert "event-crash" in html or "event-error" in html


def test_a_log_with_a_full_timeline_still_gets_the_chart(client, cast, crash):
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[crash.pk])).content.decode()
    assert 'id="timeline-fig"' in html and 'class="event-list' not in html


def test_explanations_render_their_markdown_and_stay_safe(client, cast):
    doc = copy.deepcopy(CRASH_DOC)
    doc["matches"][0]["explanation"] = (
        "Two causes:\n\n- **arch** `sm_120`\n- a [link](javascript:alert(1)) <script>x</script>"
    )
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[cast.report(doc).pk])).content.decode()
    assert "<li><strong>arch</strong> <code>sm_120</code></li>" in html
    assert 'href="javascript:' not in html and "<script>x" not in html and "&lt;script&gt;x" in html


def test_references_become_links_to_their_threads_and_files(client, cast):
    doc = copy.deepcopy(CRASH_DOC)
    doc["matches"][0]["references"] = [
        "flashinfer-ai/flashinfer#3670",
        "sglang:python/sglang/srt/server_args.py",
        "CUDA runtime error codes",
        "research:seed-case.md",
    ]
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[cast.report(doc).pk])).content.decode()
    assert 'href="https://github.com/flashinfer-ai/flashinfer/issues/3670"' in html
    assert 'href="https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/server_args.py"' in html
    assert "<code>CUDA runtime error codes</code>" in html  # a name to look up, shown as it is
    assert "research:" not in html  # the knowledge base's own notes are no page a reader can open


def test_identical_evidence_from_several_ranks_is_one_line_that_shows_the_kernel(client, cast):
    kernel = "bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x8x512_s3_et128x8_m128x8x64_cga1x1x4_16dp256b_TN_sm100f"
    message = "RuntimeError: " + "x" * 200 + f" kernel {kernel} has no image for sm_120"
    doc = copy.deepcopy(CRASH_DOC)
    doc["matches"][0]["evidence"] = [
        {"line": 1400 + rank, "text": f"[2025-11-20 09:16:27 TP{rank}] {message}"} for rank in range(4)
    ]
    doc["matches"][0]["lines"] = []
    doc["matches"][0]["facts"] = {"kernel": kernel}
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[cast.report(doc).pk])).content.decode()
    evidence = html[html.index('<ul class="evidence-list">') :]
    evidence = evidence[: evidence.index("</ul>")]
    assert evidence.count("<li>") == 1 and "4 ranks: TP0, TP1, TP2, TP3" in evidence
    assert kernel in evidence


def test_jump_to_crash_on_a_short_unknown_log_lands_on_the_exception_not_the_traceback_head(client, cast):
    lines = [
        "[2025-12-02 14:03:11] server_args=ServerArgs(model_path='Qwen/Qwen3-8B', tp_size=1)",
        "Traceback (most recent call last):",
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/template_manager.py", line 163, in load',
        "    raise jinja2.exceptions.TemplateSyntaxError(message, lineno)",
        "jinja2.exceptions.TemplateSyntaxError: expected token 'end of statement block', got 'tool'",
    ]
    doc = short_unknown_doc()
    doc["crash"] |= {"line": 2, "exception": "jinja2.exceptions.TemplateSyntaxError", "message": "expected"}
    doc["timeline"] = [{"line": 1, "time": "2025-12-02T14:03:11", "kind": "backend", "name": "server_args"}]
    doc["timeline"] += [
        {"line": 2, "time": None, "kind": "error", "name": name} for name in ("traceback", "crash")
    ]
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[cast.report(doc, lines=lines).pk])).content.decode()
    assert "Jump to crash · L5" in html
    events = html[html.index('class="event-list') : html.index("</ol>")]
    # the traceback and the crash it ends in, on one line, are one event: the server args, then the crash
    assert events.count("<li") == 2 and "event-crash" in events and "TemplateSyntaxError" in events


# ---- compare: one-sided arguments, no backends (issue #9, item 4) ----


def test_compare_folds_arguments_only_one_report_prints(client, cast):
    with_args = cast.report(CRASH_DOC, title="with args")
    without = cast.report(FIXED_DOC | {"server_args": {}, "fingerprint": "0" * 16}, title="no args dump")
    login(client, cast.alice)
    html = client.get(reverse("front:compare"), {"a": with_args.pk, "b": without.pk}).content.decode()
    args = html[html.index('id="compare-args"') :]
    args = args[: args.index("</section>")]
    count = len(CRASH_DOC["server_args"])
    assert '<details class="one-sided-args" id="args-only-a">' in args
    assert f"<summary>{count} arguments only in A</summary>" in args
    assert "args-only-b" not in args and '<tr class="differs">' not in args
    assert "Only the first report&#x27;s log prints its server arguments" in args


def test_compare_of_two_reports_without_backends_does_not_call_them_the_same(client, cast):
    bare = [
        cast.report(
            doc | {"backends": {}, "draft_backends": {}, "fingerprint": f"{n:016x}"}, title=f"bare {n}"
        )
        for n, doc in enumerate((CRASH_DOC, FIXED_DOC))
    ]
    login(client, cast.alice)
    html = client.get(reverse("front:compare"), {"a": bare[0].pk, "b": bare[1].pk}).content.decode()
    assert "Neither report resolved any backend" in html and "same backends" not in html
    same = client.get(reverse("front:compare"), {"a": bare[0].pk, "b": bare[0].pk}).content.decode()
    assert "Neither report resolved any backend" in same


# ---- the reports filter's free text finds the GPU and its arch ----


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sm_120", {0, 1}),
        ("SM120", {0, 1}),
        ("sm_90", {2}),
        ("hopper", {2}),
        ("blackwell", {0, 1}),
        ("pro 6000", {0, 1}),
        ("H100", {2}),
        ("sm_89", set()),
    ],
)
def test_the_report_lists_free_text_finds_the_gpu_and_its_arch(client, cast, three, text, expected):
    login(client, cast.alice)
    assert _listed(client, q=text) == {three[i].pk for i in expected}


def test_the_free_text_gpu_search_still_respects_the_other_filters(client, cast, three):
    login(client, cast.alice)
    assert _listed(client, q="blackwell", signature="flashinfer-trtllm-moe-sm100-only") == {three[0].pk}
    assert _listed(client, q="hopper", server="sglang") == set()


# ---- a duplicate upload says it is one ----


def test_uploading_the_same_bytes_again_says_which_report_they_already_are(client, cast):
    login(client, cast.alice)
    upload = {"project": "gpu-lab", "file": SimpleUploadedFile("a.log", b"[2025-11-20 09:14:00 TP0] hi\n")}
    first = client.post(reverse("front:upload"), upload, headers={"X-Requested-With": "XMLHttpRequest"})
    assert first.status_code == 201 and first.json()["duplicate"] is False and not first.json()["message"]
    report_page = client.get(first.json()["url"]).content.decode()
    assert "already uploaded" not in report_page
    again = {"project": "gpu-lab", "file": SimpleUploadedFile("b.log", b"[2025-11-20 09:14:00 TP0] hi\n")}
    response = client.post(reverse("front:upload"), again)
    report = Report.objects.get()
    assert response["Location"] == reverse("front:report", args=[report.pk])
    html = client.get(response["Location"]).content.decode()
    assert f"This file was already uploaded as report #{report.pk}" in html
    # said once: the next visit of the page is a plain report page again
    assert "already uploaded" not in client.get(response["Location"]).content.decode()


def test_a_duplicate_upload_by_script_is_marked_in_its_json_answer(client, cast):
    login(client, cast.alice)
    ajax = {"headers": {"X-Requested-With": "XMLHttpRequest"}}
    for name in ("a.log", "b.log"):
        upload = {"project": "gpu-lab", "file": SimpleUploadedFile(name, b"same bytes\n")}
        body = client.post(reverse("front:upload"), upload, **ajax).json()
    assert body["duplicate"] is True and body["id"] == Report.objects.get().pk
    assert f"already uploaded as report #{body['id']}" in body["message"]


# ---- the group sparkline has axes ----


def test_the_group_sparklines_have_a_date_axis_and_a_count_axis(client, cast, three):
    cast.report(CRASH_DOC, title="again")  # same fingerprint: two reports today
    login(client, cast.alice)
    today = timezone.localdate()
    first = today - dt.timedelta(days=29)
    html = client.get(reverse("front:groups")).content.decode()
    row = html[html.index(CRASH_DOC["matches"][0]["title"]) :]
    row = row[: row.index("</tr>")]
    assert '<g class="axis"' in row
    assert f">{first:%b} {first.day}</text>" in row and f">{today:%b} {today.day}</text>" in row
    assert '<text x="' in row and ">2</text>" in row and ">0</text>" in row
    page = client.get(reverse("front:group", args=[three[0].group_id])).content.decode()
    start = today - dt.timedelta(days=89)
    assert (
        f">{start:%b} {start.day}</text>" in page
        and f"<title>{today:%b} {today.day}: 2 reports</title>" in page
    )


def test_a_crash_no_signature_explains_leads_with_its_exceptions_diagnosis_not_the_wrapper(client, cast):
    from dispatchlab.core import analyze_paths

    log = Path(__file__).resolve().parents[1] / "fixtures" / "terminal" / "flashinfer_gemm_runner_error.log"
    doc = analyze_paths([log])
    report = cast.report(doc, title="GEMM runner", lines=log.read_text().splitlines())
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[report.pk])).content.decode()
    diagnosis = html[html.index('id="diagnosis"') :]
    top, wrapper = doc["matches"][0], doc["matches"][-1]
    assert top["source"] == "exception" and wrapper["level"] == "wrapper"
    # the header and the card agree, the card says where it comes from, the wrapper is listed after it
    assert 'class="badge class">cuda_error<' in html.split('id="diagnosis"')[0]
    assert "top diagnosis" in diagnosis[:400] and top["title"] in diagnosis[:600]
    assert "from the exception" in html
    assert html.index(top["title"]) < html.index(wrapper["title"])
    assert "--log-level" not in html


def test_tracebacks_and_error_lines_past_the_caps_are_counted_on_the_page(client, cast):
    doc = copy.deepcopy(CRASH_DOC)
    doc["tracebacks_omitted"], doc["errors_omitted"] = 3996, 12
    report = cast.report(doc, title="flood")
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[report.pk])).content.decode()
    assert "... and 3996 more tracebacks, not listed" in html
    assert "... and 12 more error lines" in html


def test_a_big_logs_sampled_garbage_checks_say_how_much_of_it_they_read(client, cast):
    doc = copy.deepcopy(CRASH_DOC)
    doc["checks_sampled"] = {
        "checks": {
            "gen_repeat": "a bare output line of one token repeated",
            "gen_words": "a word repeated back to back",
        },
        "checked_bytes": 25_200_000,
        "total_bytes": 100_700_000,
        "where": "its first and last 8 MB and one 8 MB stretch in eight between",
    }
    report = cast.report(doc, title="big")
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[report.pk])).content.decode()
    note = html[html.index('id="checks-sampled"') :]
    note = note[: note.index("</p>")]
    assert "24.0\xa0MB of this log" in note and "96.0\xa0MB (its first and last 8 MB and one 8 MB" in note
    assert "a bare output line of one token repeated; a word repeated back to back" in note
    assert "checked in every line" in note
    plain = copy.deepcopy(CRASH_DOC)
    report = cast.report(plain, title="small")
    assert 'id="checks-sampled"' not in client.get(reverse("front:report", args=[report.pk])).content.decode()
