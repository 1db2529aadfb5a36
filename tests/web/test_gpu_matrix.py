"""GPU pages: the compatibility matrix, the figures, and evidence that says what ran."""

from __future__ import annotations

import copy
import html
import json
import re
from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from dispatchlab.front.gpu_figures import confirm_throughput_figure, probe_figure
from dispatchlab.gpu import services
from dispatchlab.gpu.models import ConfirmRun, ProbeRun
from dispatchlab.gpu.selectors import compat_matrix

# fixtures are found by name: imported as re-exports
from tests.web.test_gpu_pages import (
    FINISHED as FINISHED,
)
from tests.web.test_gpu_pages import (
    PROBES as PROBES,
)
from tests.web.test_gpu_pages import (
    _canonical_document as _canonical_document,
)
from tests.web.test_gpu_pages import (
    _run as _run,
)
from tests.web.test_gpu_pages import (
    crash as crash,
)
from tests.web.test_gpu_pages import (
    heartbeat as heartbeat,
)
from tests.web.test_gpu_pages import (
    page as page,
)
from tests.web.test_gpu_pages import (
    sent as sent,
)
from tests.web.test_gpu_pages import (
    text_of as text_of,
)

# ---------------------------------------------------------------- compatibility


def _cell(matrix, component: str, backend: str, arch: str):
    cell = matrix.cell(component, backend, arch)
    assert cell is not None, (component, backend, arch)
    return cell


def test_the_matrix_says_what_the_knowledge_base_says_fails_where(alice):
    matrix = compat_matrix(alice)
    trtllm = _cell(matrix, "moe", "flashinfer_trtllm", "sm_120")
    assert trtllm.verdict == "fails" and trtllm.source == "kb"
    assert trtllm.deciding.url.endswith("#sig-nvfp4-cutedsl-moe-garbage-on-sm120")
    assert _cell(matrix, "moe", "flashinfer_cutedsl", "sm_120").verdict == "fails"
    assert _cell(matrix, "moe", "flashinfer_cutedsl", "sm_100").verdict == "untested"
    assert _cell(matrix, "moe", "triton", "sm_90").verdict == "untested"
    assert {"sm_80", "sm_89", "sm_90", "sm_100", "sm_120"} <= set(matrix.arches)


def test_a_probe_run_fills_its_cell_and_links_to_it(alice, acme, umbrella):
    host = heartbeat("h200-box", arch="sm_90", gpu="NVIDIA H200")
    passed = {**PROBES[0], "backend": "triton", "arch": "sm_90"}
    wrong = {**PROBES[0], "backend": "flashinfer_cutedsl", "status": "INCORRECT_NUMERICAL", "arch": "sm_90"}
    run = ProbeRun.objects.create(
        project=acme, host=host, host_name="h200-box", status="done", arch="sm_90", results=[passed, wrong]
    )
    theirs = {**PROBES[0], "backend": "deep_gemm", "arch": "sm_90"}
    ProbeRun.objects.create(project=umbrella, host=host, status="done", arch="sm_90", results=[theirs])
    matrix = compat_matrix(alice)
    triton = _cell(matrix, "moe", "triton", "sm_90")
    assert triton.verdict == "works" and triton.source == "probe"
    assert triton.deciding.url == f"{reverse('front:hosts')}?probe={run.pk}#host-{host.pk}"
    cutedsl = _cell(matrix, "moe", "flashinfer_cutedsl", "sm_90")
    assert cutedsl.verdict == "fails" and cutedsl.source == "probe"  # a run, though the KB agrees
    assert matrix.cell("moe", "deep_gemm", "sm_90") is None  # another project's probes stay theirs


def test_a_link_to_an_older_probe_run_opens_that_run_on_the_hosts_page(alice_client, acme):
    host = heartbeat("rtx-box")
    old = ProbeRun.objects.create(
        project=acme,
        host=host,
        status="done",
        finished_at=timezone.now() - timedelta(days=2),
        results=[PROBES[1]],
    )
    ProbeRun.objects.create(
        project=acme, host=host, status="done", finished_at=timezone.now(), results=[PROBES[0]]
    )
    assert "unsupported arch" not in page(alice_client, reverse("front:hosts"))
    assert "unsupported arch" in page(alice_client, reverse("front:hosts") + f"?probe={old.pk}")


def test_a_fixed_confirm_run_beats_the_knowledge_base(alice, crash, make_report, make_document):
    after = make_document(
        gpu={"name": "NVIDIA RTX PRO 6000 Blackwell", "arch": "sm_120", "count": 4},
        backends={"moe_runner_backend": "flashinfer_trtllm", "attention_backend": "flashinfer"},
        draft_backends={},
    )
    new = make_report(crash.project, document=after)
    run = _run(crash, status="fixed", result_report=new, finished_at=timezone.now())
    matrix = compat_matrix(alice)
    cell = _cell(matrix, "moe", "flashinfer_trtllm", "sm_120")
    assert cell.verdict == "works" and cell.source == "confirm"
    assert cell.deciding.url == reverse("front:confirm", args=[run.pk])
    assert len(cell.evidence) >= 2  # the signature still shows on hover
    assert _cell(matrix, "attention", "flashinfer", "sm_120").verdict == "works"


def test_a_confirm_that_still_fails_blames_only_what_the_fix_changed(
    alice, crash, make_report, make_document
):
    after = make_document(
        gpu={"name": "NVIDIA RTX PRO 6000 Blackwell", "arch": "sm_120", "count": 4},
        backends={**crash.document["backends"], "moe_runner_backend": "flashinfer_cutlass"},
        draft_backends=crash.document["draft_backends"],
    )
    new = make_report(crash.project, document=after)
    _run(
        crash,
        status="still_fails",
        error="the fixed launch died",
        result_report=new,
        finished_at=timezone.now(),
    )
    matrix = compat_matrix(alice)
    assert _cell(matrix, "moe", "flashinfer_cutlass", "sm_120").verdict == "fails"
    assert _cell(matrix, "attention", "flashinfer", "sm_120").verdict == "untested"


def test_the_matrix_costs_one_query_per_source(alice, crash, make_report, django_assert_max_num_queries):
    for _ in range(3):
        _run(crash, status="fixed", result_report=make_report(crash.project), finished_at=timezone.now())
        ProbeRun.objects.create(project=crash.project, status="done", arch="sm_90", results=PROBES)
    with django_assert_max_num_queries(2):
        compat_matrix(alice)


def test_the_compat_page_links_every_tested_cell_to_its_evidence(alice_client, charlie_client, crash):
    body = page(alice_client, reverse("front:compat"))
    row = body.split('data-backend="flashinfer_trtllm"', 1)[1].split("</tr>", 1)[0]
    cell = re.search(
        r'<td class="compat-cell compat-fails src-kb" data-arch="sm_120"[^>]*>(.*?)</td>', row, re.S
    )
    assert cell and 'href="/compat/#sig-nvfp4-cutedsl-moe-garbage-on-sm120"' in cell.group(1)
    assert 'id="sig-nvfp4-cutedsl-moe-garbage-on-sm120"' in body
    assert "untested" in body.split('id="compat-legend"', 1)[1].split("</p>", 1)[0]
    # a confirm run of acme is evidence for acme only
    _run(crash, status="fixed", result_report=crash, finished_at=timezone.now())
    assert reverse("front:confirm", args=[ConfirmRun.objects.get().pk]) not in page(
        charlie_client, reverse("front:compat")
    )


def test_the_nav_links_the_gpu_pages(alice_client):
    body = page(alice_client, reverse("front:compat"))
    nav = body.split("<nav>", 1)[1].split("</nav>", 1)[0]
    assert f'href="{reverse("front:hosts")}"' in nav and "GPU hosts" in nav
    assert f'href="{reverse("front:compat")}" aria-current="page"' in nav


# ---------------------------------------------------------------- figures (plain dicts)


def test_the_probe_chart_is_a_bar_per_probe_as_percent_of_peak_with_a_line_at_100():
    fig = probe_figure(PROBES, gpu_name="NVIDIA RTX PRO 6000 Blackwell")
    works, _ = fig["data"]
    assert works["x"] == ["moe_nvfp4 · flashinfer_cutlass"] and works["y"] == [62.0]
    assert works["text"] == ["62%"]
    assert fig["layout"]["xaxis"]["categoryarray"] == [
        "moe_nvfp4 · flashinfer_cutlass",
        "moe_nvfp4 · flashinfer_trtllm",
    ]
    [peak] = fig["layout"]["shapes"]
    assert (peak["y0"], peak["y1"], peak["xref"]) == (100, 100, "paper")
    assert "NVIDIA RTX PRO 6000 Blackwell" in fig["layout"]["annotations"][0]["text"]
    assert "310.0 TFLOP/s" in works["customdata"][0] and "tokens=256" in works["customdata"][0]


def test_a_probe_that_cannot_run_is_a_labelled_zero_bar_with_its_error_on_hover():
    fig = probe_figure(PROBES)
    fails = next(t for t in fig["data"] if t["name"] == "fails on this GPU")
    assert fails["y"] == [0] and fails["text"] == ["unsupported arch"]
    assert "MoE kernel requires 10.x architecture" in fails["customdata"][0]
    skipped = {"name": "triton_matmul", "backend": "triton", "status": "NOT_INSTALLED", "runs": False}
    other = next(t for t in probe_figure([skipped])["data"])
    assert other["name"] == "no verdict" and other["text"] == ["not installed"]


def test_probe_names_and_errors_from_a_worker_are_inert_in_the_chart():
    hostile = {"name": "<img src=x onerror=alert(1)>", "backend": "b", "status": "RUNTIME_ERROR"}
    fig = probe_figure([{**hostile, "error": "<script>alert(1)</script>"}, hostile])
    dumped = json.dumps(fig)
    assert "<img" not in dumped and "<script" not in dumped
    assert len(set(fig["layout"]["xaxis"]["categoryarray"])) == 2  # the same probe twice stays two bars


def test_no_probes_and_no_throughput_draw_nothing():
    assert probe_figure([]) is None
    assert confirm_throughput_figure([]) is None
    assert confirm_throughput_figure([{"concurrency": 1, "tokens_per_s": None}]) is None


def test_the_throughput_chart_has_a_bar_at_1_and_at_n_concurrent_requests():
    fig = confirm_throughput_figure(FINISHED["throughput"])
    [bars] = fig["data"]
    assert bars["x"] == ["1 request", "4 concurrent"] and bars["y"] == [42.7, 112.5]
    assert fig["meta"]["concurrency"] == [1, 4]
    assert "8 requests, 1024 tokens" in bars["customdata"][1]


def test_the_crash_and_its_confirm_output_both_chart_the_probes_of_the_newest_finished_run(
    alice_client, crash, make_report
):
    new = make_report(crash.project)
    run = _run(
        crash, status=ConfirmRun.Status.FIXED, result=FINISHED, result_report=new, finished_at=timezone.now()
    )
    for report in (crash, new):
        body = page(alice_client, reverse("front:report", args=[report.pk]))
        assert f"Kernel probes of confirm run {run.pk}" in text_of(body)
        figure = json.loads(re.search(r'id="report-probe-fig"[^>]*>(.*?)</script>', body, re.S).group(1))
        assert figure["layout"]["shapes"][0]["y0"] == 100  # the chip's peak as a line


def test_a_report_without_a_finished_confirm_draws_no_probe_chart(alice_client, crash):
    _run(crash, status=ConfirmRun.Status.RUNNING, result=FINISHED)
    body = page(alice_client, reverse("front:report", args=[crash.pk]))
    assert "report-probe-fig" not in body


# ---------------------------------------------------------------- evidence says what ran (issue 18)

STAND_IN_RESULT = {
    **FINISHED,
    "smoke": {"prompt": "The capital of France is", "text": "Paris.", "garbage": {"garbage": False}},
    "inventory": {"gpus": [{"name": "NVIDIA H200", "arch": "sm_90"}], "versions": {}},
    "launcher_identity": {"kind": "stand-in", "name": "repro:moe-serve", "label": "the moe-serve stand-in",
                          "version": None, "how": "it identified itself in its log", "inferred": False},
    "weights": {"kind": "reference", "how": "the repro's own seeded reference weights", "inferred": False},
    "throughput_unit": "kernel steps/s",
}  # fmt: skip


def test_a_stand_in_confirm_page_says_kernel_level_evidence_and_kernel_steps_per_second(
    alice_client, crash, make_report
):
    run = _run(crash, status=ConfirmRun.Status.FIXED, launcher="repro:moe-serve", host_name="h200",
               result=STAND_IN_RESULT, result_report=make_report(crash.project), finished_at=timezone.now())  # fmt: skip
    body = page(alice_client, reverse("front:confirm", args=[run.pk]))
    shown = text_of(body)
    assert (
        "Kernel-level confirm with the moe-serve stand-in on NVIDIA H200 sm_90 (reference weights)" in shown
    )
    assert "Kernel path works" in shown and "Fixed: the launch" not in shown
    assert "the failure group stays open" in shown
    head = text_of(body.split('id="throughput"', 1)[1].split("</thead>", 1)[0])
    assert "kernel steps per second errors" in head and "tokens/s" not in head.split(")", 1)[1]
    ran = text_of(body.split('id="what-ran"', 1)[1].split("</dl>", 1)[0])
    assert "the moe-serve stand-in" in ran and "reference (the repro's own seeded reference weights)" in ran


def test_a_stand_in_run_is_kernel_evidence_in_the_matrix_never_a_server_confirmation(
    alice, crash, make_report, make_document
):
    after = make_document(
        gpu={"name": "NVIDIA H200", "arch": "sm_90", "count": 1},
        backends={"moe_runner_backend": "flashinfer_cutlass"},
        draft_backends={},
    )
    new = make_report(crash.project, document=after)
    _run(crash, status="fixed", launcher="repro:moe-serve", result_report=new, finished_at=timezone.now())
    cell = _cell(compat_matrix(alice), "moe", "flashinfer_cutlass", "sm_90")
    assert cell.verdict == "works" and cell.source == "kernel"
    assert all(e.source != "confirm" for e in cell.evidence)
    assert "kernel-level confirm run" in cell.deciding.label and "moe-serve stand-in" in cell.deciding.label


def test_a_waiting_confirm_has_a_cancel_button_that_cancels_it(alice_client, crash, monkeypatch):
    told: list[int] = []
    monkeypatch.setattr(services, "_send_cancel", told.append)
    run = _run(crash, status=ConfirmRun.Status.WAITING_FOR_HOST)
    body = page(alice_client, reverse("front:confirm", args=[run.pk]))
    assert reverse("front:confirm_cancel", args=[run.pk]) in body and "Cancel this confirm" in body
    answer = alice_client.post(reverse("front:confirm_cancel", args=[run.pk]))
    assert answer.status_code == 302
    run.refresh_from_db()
    assert run.status == ConfirmRun.Status.CANCELLED
    body = page(alice_client, reverse("front:confirm", args=[run.pk]))
    assert "Cancelled: cancelled while waiting for a host by alice." in text_of(body)
    assert "Cancel this confirm" not in body


def test_a_viewer_cannot_cancel_a_confirm(bob_client, crash):
    run = _run(crash, status=ConfirmRun.Status.QUEUED)
    assert bob_client.post(reverse("front:confirm_cancel", args=[run.pk])).status_code == 403
    run.refresh_from_db()
    assert run.status == ConfirmRun.Status.QUEUED


def test_the_confirm_form_of_a_diagnosis_without_a_fix_says_there_is_nothing_to_confirm(
    alice_client, acme, make_report, sent
):
    document = copy.deepcopy(_canonical_document())
    for match in document["matches"]:
        match["fix"] = {}
    report = make_report(acme, document=document)
    body = page(alice_client, reverse("front:confirm_new", args=[report.pk]))
    banner = text_of(body.split('id="nothing-to-confirm"', 1)[1].split("</div>", 1)[0])
    assert (
        "Nothing to confirm: the diagnosis" in banner
        and "has no fix" in banner
        and "backend sweep" in banner
        and "edit the launch" in banner
    )
    assert "Queue the edited launch" in body
    command = html.unescape(re.search(r"<textarea[^>]*>(.*?)</textarea>", body, re.S).group(1))
    answer = alice_client.post(reverse("front:confirm_new", args=[report.pk]), {"command": command})
    assert answer.status_code == 400 and "nothing to confirm" in text_of(answer.content.decode())
    assert sent == [] and not ConfirmRun.objects.exists()
