"""The pages, as alice (member), bob (viewer) and charlie (member of another project only) see them."""

from __future__ import annotations

import copy
import datetime as dt
import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone
from fixtures_docs import CRASH_DOC, FIXED_DOC, VLLM_OOM_DOC, XSS, hostile_doc

from dispatchlab.core.lineindex import write_line_index
from dispatchlab.reports.groups import report_columns
from dispatchlab.reports.models import FailureGroup, Membership, Project, Report


def crash_log_lines(count: int = 1520) -> list[str]:
    lines = [f"[2025-11-20 09:14:{n % 60:02d} TP{n % 4}] INFO filler line {n}" for n in range(1, count + 1)]
    lines[1387] = "[2025-11-20 09:16:11 TP0] Mxfp4MoEMethod: using flashinfer_trtllm_routed for MXFP4 experts"
    lines[1449] = "[2025-11-20 09:16:27 TP0] Scheduler hit an exception: Traceback (most recent call last):"
    lines[1465] = "RuntimeError: Error in function 'trtllm_fp4_block_scale_routed_moe'"
    lines[99] = XSS
    return lines


class Cast:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.lab = Project.objects.create(name="GPU lab", slug="gpu-lab")
        self.other = Project.objects.create(name="Other team", slug="other-team")
        self.alice = User.objects.create_user("alice", password="password")
        self.bob = User.objects.create_user("bob", password="password")
        self.charlie = User.objects.create_user("charlie", password="password")
        Membership.objects.create(user=self.alice, project=self.lab, role="member")
        Membership.objects.create(user=self.bob, project=self.lab, role="viewer")
        Membership.objects.create(user=self.charlie, project=self.other, role="member")

    def report(
        self,
        doc: dict | None,
        *,
        project: Project | None = None,
        title: str = "",
        status: str = "done",
        lines: list[str] | None = None,
        group: bool = True,
    ) -> Report:
        project = project or self.lab
        n = Report.objects.count() + 1
        report = Report.objects.create(
            project=project,
            title=title,
            status=status,
            checksum=f"{n:064x}",
            created_by=self.alice,
            document=copy.deepcopy(doc) if doc else None,
            **(report_columns(doc) if doc else {}),
        )
        if lines is not None:
            folder = self.tmp_path / f"r{report.pk}"
            folder.mkdir()
            (folder / "in.log").write_text("\n".join(lines) + "\n")
            report.text_path = str(folder / "text.log")
            report.index_path = str(folder / "lines.idx")
            report.line_count = write_line_index([folder / "in.log"], report.text_path, report.index_path)
        if doc and group and doc.get("failure_class") not in (None, "none"):
            report.group, _ = FailureGroup.objects.get_or_create(
                project=project,
                fingerprint=doc["fingerprint"],
                defaults={"title": report.top_match_title, "failure_class": report.failure_class},
            )
            FailureGroup.objects.filter(pk=report.group.pk).update(
                count=Report.objects.filter(group=report.group).count() + 1
            )
        report.save()
        return report


@pytest.fixture
def cast(db, tmp_path, settings):
    settings.MEDIA_ROOT = tmp_path / "media"
    return Cast(tmp_path)


@pytest.fixture
def crash(cast):
    return cast.report(CRASH_DOC, title="DSv4 EAGLE TP4", lines=crash_log_lines())


def login(client, user):
    client.force_login(user)
    return client


def page_urls(report: Report) -> list[str]:
    urls = [
        reverse("front:report", args=[report.pk]),
        reverse("front:report_status", args=[report.pk]),
        reverse("front:log", args=[report.pk]),
        reverse("front:compare") + f"?a={report.pk}&b={report.pk}",
    ]
    if report.group_id:
        urls.append(reverse("front:group", args=[report.group_id]))
    return urls


# ---- access ----


def test_it_sends_anonymous_visitors_to_the_login_page(client, crash):
    for url in [
        *page_urls(crash),
        reverse("front:report_list"),
        reverse("front:groups"),
        reverse("front:upload"),
    ]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/accounts/login/")


def test_the_login_page_renders(client, db):
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert b'name="username"' in response.content


def test_it_shows_an_outsider_nothing(client, cast, crash):
    login(client, cast.charlie)
    for url in page_urls(crash):
        assert client.get(url).status_code == 404, url
    listing = client.get(reverse("front:report_list")).content.decode()
    assert "DSv4 EAGLE TP4" not in listing
    groups = client.get(reverse("front:groups")).content.decode()
    assert CRASH_DOC["matches"][0]["title"] not in groups
    own = cast.report(VLLM_OOM_DOC, project=cast.other, title="charlie's own")
    assert client.get(reverse("front:compare") + f"?a={own.pk}&b={crash.pk}").status_code == 404
    assert "charlie&#x27;s own" in client.get(reverse("front:report_list")).content.decode()


def test_a_viewer_reads_every_page(client, cast, crash):
    login(client, cast.bob)
    for url in page_urls(crash):
        assert client.get(url).status_code == 200, url


# ---- the report page ----


def test_the_report_page_leads_with_the_top_diagnosis(client, cast, crash):
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[crash.pk])).content.decode()
    top = CRASH_DOC["matches"][0]
    assert top["title"] in html
    assert html.index(top["title"]) < html.index('id="timeline-chart"') < html.index('id="backends"')
    assert "arch_unsupported_kernel" in html and "93%" in html
    # the fix as a copyable launch-arg patch, and what was already tried
    assert "# remove --speculative-algorithm" in html
    assert 'class="tried-failed"' in html and "--speculative-moe-runner-backend triton: same crash" in html
    # header facts
    for text in (
        "sglang",
        "0.5.6.dev2+gdsv4",
        "RTX PRO 6000",
        "sm_120",
        "/models/DeepSeek-V4-Flash-NVFP4",
        "crashed",
    ):
        assert text in html


def test_evidence_links_open_the_log_at_their_line(client, cast, crash):
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[crash.pk])).content.decode()
    log = reverse("front:log", args=[crash.pk])
    for line in (1388, 1450, 1466):
        assert f'href="{log}?line={line}#L{line}"' in html
    # the crash's traceback starts at L1450; the exception type and message are printed at L1466
    assert "Jump to crash · L1466" in html and "Jump to crash · L1450" not in html


def test_the_timeline_is_a_json_data_island_not_inline_script(client, cast, crash):
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[crash.pk])).content.decode()
    assert '<script id="timeline-fig" type="application/json">' in html
    assert 'data-figure="timeline-fig"' in html
    assert "vendor/plotly-basic.min.js" in html
    # no throughput chart: the crash log has no batch metrics
    assert "throughput-fig" not in html


def test_backends_show_main_and_draft_with_origins_and_highlight_differences(client, cast, crash):
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[crash.pk])).content.decode()
    table = html[html.index('id="backends"') :]
    table = table[: table.index("</table>")]
    row = re.search(
        r'<tr class="differs">\s*<th scope="row"><code>moe_runner_backend</code>.*?</tr>', table, re.S
    )
    assert row, "the draft's moe_runner_backend differs from the main model's"
    assert "flashinfer_trtllm_routed" in row.group(0) and "triton" in row.group(0)
    assert "origin-flag" in row.group(0) and "origin-message" in row.group(0)
    assert "?line=1388#L1388" in row.group(0)
    assert "origin-default" in table


def test_the_fingerprint_links_to_its_failure_group(client, cast, crash):
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[crash.pk])).content.decode()
    assert reverse("front:group", args=[crash.group_id]) in html
    assert CRASH_DOC["fingerprint"] in html


def test_tracebacks_are_collapsed(client, cast, crash):
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[crash.pk])).content.decode()
    assert '<details class="traceback">' in html and "deepseek_v4_nextn.py" in html


def test_a_serving_log_gets_a_throughput_chart(client, cast):
    report = cast.report(FIXED_DOC, title="fixed")
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[report.pk])).content.decode()
    assert '<script id="throughput-fig" type="application/json">' in html
    assert "No failure found in this log" in html


def test_every_user_string_on_the_report_page_is_inert(client, cast):
    report = cast.report(hostile_doc(), title=XSS)
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[report.pk])).content.decode()
    assert "<script>alert(1)" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'href="javascript:' not in html
    # inside the data island too
    island = html[html.index('id="timeline-fig"') :]
    assert "<script>alert" not in island[: island.index("</script>")]


def test_a_report_still_parsing_shows_live_progress(client, cast):
    report = cast.report(None, status="parsing", title="big log")
    Report.objects.filter(pk=report.pk).update(progress=42.5)
    login(client, cast.alice)
    html = client.get(reverse("front:report", args=[report.pk])).content.decode()
    status_url = reverse("front:report_status", args=[report.pk])
    assert f'hx-get="{status_url}"' in html and 'hx-trigger="every 1s"' in html
    assert 'value="42.5"' in html


def test_the_status_fragment_sends_the_browser_to_the_report_when_done(client, cast, crash):
    login(client, cast.alice)
    url = reverse("front:report_status", args=[crash.pk])
    response = client.get(url, headers={"HX-Request": "true"})
    assert response["HX-Redirect"] == reverse("front:report", args=[crash.pk])
    assert "hx-get" not in response.content.decode()


def test_the_status_fragment_stops_polling_when_parsing_failed(client, cast):
    report = cast.report(None, status="failed")
    Report.objects.filter(pk=report.pk).update(error="upload.bin: binary data, not a text log")
    login(client, cast.alice)
    html = client.get(
        reverse("front:report_status", args=[report.pk]), headers={"HX-Request": "true"}
    ).content.decode()
    assert "binary data, not a text log" in html and "hx-get" not in html


# ---- the log viewer ----


def test_the_log_opens_centred_on_a_line_with_anchors(client, cast, crash):
    login(client, cast.alice)
    html = client.get(reverse("front:log", args=[crash.pk]) + "?line=1388").content.decode()
    assert re.search(r'<tr id="L1388" class="target evidence">', html)
    assert 'id="L1288"' in html and 'id="L1487"' in html
    assert 'id="L1287"' not in html and 'id="L1488"' not in html
    assert 'href="#L1388"' in html
    assert "lines 1288–1487 of 1520" in html
    # the crash's line is where its exception is printed, as on the report page
    assert "Jump to crash · L1466" in html


def test_the_log_marks_the_crash_line(client, cast, crash):
    login(client, cast.alice)
    html = client.get(reverse("front:log", args=[crash.pk]) + "?line=1466").content.decode()
    assert re.search(r'<tr id="L1466" class="target[^"]* crash">', html)


def test_log_search_lists_hits_with_links(client, cast, crash):
    login(client, cast.alice)
    html = client.get(reverse("front:log", args=[crash.pk]), {"q": "mxfp4moemethod"}).content.decode()
    log = reverse("front:log", args=[crash.pk])
    assert f'href="{log}?line=1388&amp;q=mxfp4moemethod#L1388"' in html
    assert "1 line containing" in html


def test_log_lines_render_as_inert_text(client, cast, crash):
    login(client, cast.alice)
    html = client.get(reverse("front:log", args=[crash.pk]) + "?line=100").content.decode()
    assert "<script>alert(1)" not in html and "<img src=x" not in html
    assert "&lt;script&gt;" in html
    html = client.get(reverse("front:log", args=[crash.pk]), {"q": "<script>"}).content.decode()
    assert "<script>alert(1)" not in html and "L100" in html


def test_the_log_pages_through_the_file(client, cast, crash):
    login(client, cast.alice)
    html = client.get(reverse("front:log", args=[crash.pk]) + "?start=1401").content.decode()
    # the last window is kept full: it starts 200 lines before the end
    assert 'id="L1321"' in html and 'id="L1520"' in html and 'id="L1320"' not in html
    assert "end of log" in html and "?start=1121" in html


def test_a_log_not_indexed_yet_says_so(client, cast):
    report = cast.report(None, status="queued")
    login(client, cast.alice)
    html = client.get(reverse("front:log", args=[report.pk])).content.decode()
    assert "not ready to view yet" in html


# ---- lists ----


@pytest.fixture
def three(cast, crash):
    fixed = cast.report(FIXED_DOC, title="DSv4 no MTP")
    oom = cast.report(VLLM_OOM_DOC, title="Qwen3 OOM")
    return crash, fixed, oom


def _listed(client, **params) -> set[int]:
    html = client.get(reverse("front:report_list"), params).content.decode()
    return {int(n) for n in re.findall(r'href="/reports/(\d+)/"', html)}


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, {0, 1, 2}),
        ({"server": "vllm"}, {2}),
        ({"arch": "sm_120"}, {0, 1}),
        ({"failure_class": "oom"}, {2}),
        ({"signature": "flashinfer-trtllm-moe-sm100-only"}, {0}),
        ({"backend": "moe_runner_backend=flashinfer_trtllm_routed"}, {0}),
        ({"backend": "moe_runner_backend=triton"}, {0, 1}),
        ({"backend": "FLASH_ATTN"}, {2}),
        ({"q": "no mtp"}, {1}),
        ({"q": "7f3a9c2e"}, {0}),
        ({"q": "qwen3"}, {2}),
    ],
)
def test_the_report_list_filters(client, cast, three, params, expected):
    login(client, cast.alice)
    assert _listed(client, **params) == {three[i].pk for i in expected}


def test_a_filter_value_that_matches_nothing_lists_nothing_rather_than_everything(client, cast, three):
    login(client, cast.alice)
    assert _listed(client, server="vllm", arch="nonsense") == set()
    assert _listed(client, server="vllm", project="other-team") == set()
    html = client.get(reverse("front:report_list"), {"project": "no-such-project"}).content.decode()
    assert "No reports match." in html and not re.findall(r'href="/reports/(\d+)/"', html)


@pytest.mark.parametrize(
    "params",
    [
        {"server": "vllm"},
        {"arch": "sm_90"},
        {"signature": "nonexistent"},
        {"project": "other-team"},
        {"failure_class": "oom"},
        {"status": "nonsense"},
        {"backend": "attention_backend"},
        {"backend": "draft_quantization"},
        {"backend": "bad key!=x"},
    ],
)
def test_the_report_list_filters_by_a_value_no_visible_report_has_yet(client, cast, crash, params):
    cast.report(VLLM_OOM_DOC, project=cast.other, title="charlie's vllm")
    login(client, cast.alice)
    assert _listed(client) == {crash.pk}
    html = client.get(reverse("front:report_list"), params).content.decode()
    assert not re.findall(r'href="/reports/(\d+)/"', html), params
    assert "No reports match." in html


def test_the_report_list_keeps_the_filter_value_and_suggests_known_ones(client, cast, crash):
    login(client, cast.alice)
    html = client.get(reverse("front:report_list"), {"server": "vllm"}).content.decode()
    assert re.search(r'<input[^>]*name="server"[^>]*value="vllm"', html)
    assert re.search(r'<datalist id="[^"]*server[^"]*"><option value="sglang">', html)


def test_a_bare_backend_value_matches_values_not_key_names(client, cast, three):
    login(client, cast.alice)
    assert _listed(client, backend="attention_backend") == set()
    assert _listed(client, backend="flashinfer") == {three[0].pk, three[1].pk}


def test_the_group_list_lists_nothing_for_a_failure_class_outside_the_taxonomy(client, cast, three):
    login(client, cast.alice)
    html = client.get(reverse("front:groups"), {"failure_class": "nonsense"}).content.decode()
    assert CRASH_DOC["matches"][0]["title"] not in html


def test_the_report_list_is_paginated_with_a_fixed_number_of_queries(
    client, cast, three, django_assert_max_num_queries
):
    for n in range(60):
        Report.objects.create(project=cast.lab, title=f"filler {n}", checksum=f"f{n:063x}")
    login(client, cast.alice)
    with django_assert_max_num_queries(12):
        html = client.get(reverse("front:report_list")).content.decode()
    assert "page 1 of 2" in html and "?page=2" in html


def test_the_group_list_shows_counts_sparklines_arches_and_versions(client, cast, three):
    cast.report(CRASH_DOC | {"server_version": "0.5.7"}, title="again")  # same fingerprint
    login(client, cast.alice)
    html = client.get(reverse("front:groups")).content.decode()
    assert CRASH_DOC["matches"][0]["title"] in html
    assert '<svg class="sparkline"' in html
    row = html[html.index(CRASH_DOC["matches"][0]["title"]) :]
    row = row[: row.index("</tr>")]
    assert "sm_120" in row and "0.5.6.dev2+gdsv4" in row and "0.5.7" in row
    assert "2 in the last 30 days" in row


def test_a_group_page_lists_its_reports(client, cast, three):
    crash = three[0]
    login(client, cast.alice)
    html = client.get(reverse("front:group", args=[crash.group_id])).content.decode()
    assert f'href="/reports/{crash.pk}/"' in html
    assert f'href="/reports/{three[2].pk}/"' not in html


# ---- compare ----


def test_compare_puts_the_first_differing_backend_decision_on_top(client, cast, three):
    crash, fixed, _ = three
    login(client, cast.alice)
    html = client.get(reverse("front:compare"), {"a": crash.pk, "b": fixed.pk}).content.decode()
    top = html[html.index('id="first-difference"') :]
    top = top[: top.index("</section>")]
    assert "<code>quantization</code> of the draft model" in top
    assert "mxfp4" in top and "?line=1376#L1376" in top
    assert (
        html.index('id="first-difference"')
        < html.index('id="compare-backends"')
        < html.index('id="compare-args"')
    )
    assert "speculative_algorithm" in html and "EAGLE" in html


def test_compare_without_two_reports_shows_the_picker(client, cast, three):
    login(client, cast.alice)
    html = client.get(reverse("front:compare")).content.decode()
    assert '<select name="a"' in html and "Qwen3 OOM" in html


def test_compare_refuses_a_report_still_parsing(client, cast, three):
    queued = cast.report(None, status="queued")
    login(client, cast.alice)
    html = client.get(reverse("front:compare"), {"a": three[0].pk, "b": queued.pk}).content.decode()
    assert "must be parsed" in html


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
