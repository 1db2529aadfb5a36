"""What a newcomer saw in the screenshots and should not see again (issue #21, item 7): summaries cut inside
Markdown, a decision banner that does not say what was decided, bare error pages, internal notes in
user-facing text, and a compatibility matrix that reads one arch's note as every arch's failure."""

from __future__ import annotations

import re
from datetime import date

import pytest
from django.test import Client

from dispatchlab.core.records import replace
from dispatchlab.core.signatures import KnowledgeBase, TriedAndFailed, load_knowledge_base
from dispatchlab.decisions.markdown import markdown_cut, render_markdown_excerpt
from dispatchlab.decisions.services import decision_create
from dispatchlab.front.figures import sparkline_svg
from dispatchlab.gpu.selectors import compat_matrix
from dispatchlab.reports.models import FailureGroup

EXPLANATION = (
    "The runner string is a copy of the target's resolved `moe_runner_backend` (or "
    "`--speculative-moe-runner-backend`). The quant-method class, however, comes from the *draft "
    "checkpoint's* `quant_method` (the draft `ModelConfig` uses `speculative_draft_model_quantization`)."
)


@pytest.mark.parametrize("limit", range(20, len(EXPLANATION), 7))
def test_a_summary_cut_anywhere_shows_no_raw_markup(limit):
    html = str(render_markdown_excerpt(EXPLANATION, limit))
    text = re.sub(r"<[^>]+>", "", html)
    assert "`" not in text and "*" not in text
    assert html.count("<code>") == html.count("</code>")
    assert len(markdown_cut(EXPLANATION, limit)) <= limit + 2  # the cut, a space and "…"


def test_a_summary_keeps_snake_case_names_and_ends_with_an_ellipsis_when_cut():
    assert (
        markdown_cut("set moe_runner_backend to triton on sm_120 and retry", 30)
        == "set moe_runner_backend to …"
    )
    assert markdown_cut("short enough", 30) == "short enough"


def test_the_report_summary_renders_the_cut_explanation_as_markdown(
    alice_client, acme, make_report, make_document
):
    document = make_document()
    document["matches"][0]["explanation"] = EXPLANATION * 3
    report = make_report(acme, document=document)
    html = alice_client.get(f"/reports/{report.pk}/").content.decode()
    short = re.search(r'<span class="short">(.*?)</span><span class="more">', html, re.S)
    assert short, "a long explanation is folded behind its summary"
    assert "<code>moe_runner_backend</code>" in short.group(1)
    assert "`" not in short.group(1) and "*" not in re.sub(r"<[^>]+>", "", short.group(1))


def test_the_decision_banner_says_what_was_decided(alice_client, alice, acme, make_report, make_document):
    report = make_report(acme, document=make_document())
    decision_create(
        project=acme,
        user=alice,
        data={
            "title": "Keep Qwen3 on the FA3 backend",
            "decision": "Launch with `--mem-fraction-static 0.85` on H100 until the graph pool is fixed.",
            "links": {"reports": [report.pk]},
        },
    )
    html = alice_client.get(f"/reports/{report.pk}/").content.decode()
    banner = re.search(r'<section class="decisions-banner.*?</section>', html, re.S).group(0)
    assert "Keep Qwen3 on the FA3 backend" in banner
    assert "Decided:</span> Launch with <code>--mem-fraction-static 0.85</code> on H100" in banner


def test_a_missing_page_is_a_styled_404_with_the_navigation(alice_client):
    response = alice_client.get("/reports/987654/")
    assert response.status_code == 404
    html = response.content.decode()
    assert '<link rel="stylesheet"' in html
    assert 'href="/decisions/"' in html  # the navigation
    assert "This page does not exist" in html


def test_an_anonymous_404_is_styled_too_and_leaks_no_navigation(db):
    html = Client().get("/no/such/page/").content.decode()
    assert "This page does not exist" in html and '<link rel="stylesheet"' in html
    assert 'href="/decisions/"' not in html


def test_no_internal_note_of_the_knowledge_base_reaches_a_reader():
    for signature in load_knowledge_base().signatures:
        texts = [signature.explanation, signature.fix_summary, *signature.references]
        texts += [f"{d.what} {d.why}" for d in signature.tried_and_failed]
        for text in texts:
            assert not re.search(r"(?i)research:|seed campaign|seed-case", text), (signature.id, text)


def test_a_slow_first_jit_build_is_not_marked_a_failure(alice, acme):
    matrix = compat_matrix(alice, kb=load_knowledge_base())
    for arch in ("sm_80", "sm_90", "sm_120"):
        cell = matrix.cell("moe", "flashinfer_cutlass", arch)
        assert cell is None or cell.verdict != "fails", arch


def test_a_dead_end_seen_on_one_arch_fails_there_only(alice, acme):
    kb = load_knowledge_base()
    matrix = compat_matrix(alice, kb=kb)
    # "Measured on RTX PRO 6000 (sm_120): ... answers `!!!!`" under a signature of every arch but SM100
    assert matrix.cell("moe", "flashinfer_cutedsl", "sm_120").verdict == "fails"
    assert matrix.cell("moe", "flashinfer_cutedsl", "sm_90").verdict == "untested"
    # "... crashes, `trtllm_fp4_block_scale_moe` is built for SM100 only": seen on sm_120, not on sm_100
    assert matrix.cell("moe", "flashinfer_trtllm", "sm_120").verdict == "fails"
    assert all(
        e.source != "kb" or "built for SM100" not in e.detail
        for e in matrix.cell("moe", "flashinfer_trtllm", "sm_100").evidence
    )


def test_a_dead_end_that_names_no_arch_keeps_the_signatures_arches(alice, acme):
    kb = load_knowledge_base()
    base = next(s for s in kb.signatures if s.id == "trtllm-gen-moe-module-refused-on-hopper")
    assert base.conditions.get("arch_in")
    crash = TriedAndFailed(
        what="--moe-runner-backend flashinfer_cutedsl", why="crashes with an illegal instruction"
    )
    changed = replace(base, tried_and_failed=[crash])
    others = [s for s in kb.signatures if s.id != base.id]
    matrix = compat_matrix(alice, kb=KnowledgeBase.from_signatures([*others, changed], kb.digest))
    for arch in base.conditions["arch_in"]:
        assert matrix.cell("moe", "flashinfer_cutedsl", arch).verdict == "fails", arch


def test_a_group_shows_when_its_logs_ran_not_only_when_they_were_uploaded(
    alice_client, acme, make_report, make_document
):
    group = FailureGroup.objects.create(project=acme, fingerprint="a" * 16, title="CUDA out of memory")
    for when in ("2026-05-27T08:10:44", "2026-05-24T00:51:02"):
        timeline = [{"line": 1, "time": when, "rank": None, "kind": "phase", "name": "init", "detail": ""}]
        make_report(acme, document=make_document(timeline=timeline), group=group)
    html = alice_client.get(f"/groups/{group.pk}/").content.decode()
    assert "first uploaded" in html and "first seen" not in html
    assert re.search(r"in the logs</span>2026-05-24 00:51 to 2026-05-27 08:10", html)
    assert "log 2026-05-24 00:51" in html and "log 2026-05-27 08:10" in html


def test_a_vllm_log_time_without_a_year_is_shown_without_one(alice_client, acme, make_report, make_document):
    timeline = [
        {
            "line": 1,
            "time": "1900-12-02T14:03:11",
            "rank": None,
            "kind": "phase",
            "name": "init",
            "detail": "",
        }
    ]
    make_report(acme, document=make_document(timeline=timeline))
    html = alice_client.get("/").content.decode()
    assert "log 12-02 14:03" in html and "1900" not in html


def test_a_log_without_times_shows_no_log_time(alice_client, acme, make_report, make_document):
    untimed = [{"line": 1, "time": None, "rank": None, "kind": "phase", "name": "init", "detail": ""}]
    make_report(acme, document=make_document(timeline=untimed, phases=[]))
    html = alice_client.get("/").content.decode()
    assert 'class="muted log-time"' not in html and "log null" not in html


def test_every_day_of_a_group_sparkline_answers_a_hover_with_its_count():
    svg = str(sparkline_svg([0, 2, 0], width=210, height=54, first_day=date(2026, 5, 24)))
    hits = re.findall(r'<path class="hit" d="[^"]+"><title>([^<]+)</title></path>', svg)
    assert hits == ["May 24: 0 reports", "May 25: 2 reports", "May 26: 0 reports"]
