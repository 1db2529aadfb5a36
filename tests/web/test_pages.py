"""The pages, as alice (member), bob (viewer) and charlie (member of another project only) see them."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
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
