"""Multi-GPU hosts and crashes as alice (member of acme), bob (acme viewer) and charlie (umbrella only) see
them: the link matrix and the NCCL all-reduce probe on the hosts page, the "GPU links" panel of a report,
the all-reduce of a confirm run."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from dispatchlab.front.gpu_figures import allreduce_figure, probe_figure
from dispatchlab.gpu import services
from dispatchlab.gpu.models import ConfirmRun, GpuHost, ProbeRun
from dispatchlab.messaging.contract import PROBE_TASK
from tests.web.test_gpu_pages import PROBES, heartbeat, page, text_of

MIB = 1 << 20
TP_BYTES = 14 * MIB  # hidden_size 7168 x 1024 tokens x 2 bytes
NV18 = {
    "a": 0,
    "b": 1,
    "kind": "NV18",
    "gbps": 450.0,
    "transport": "nvlink",
    "nvlink_gen": 4,
    "lanes": 18,
    "switched": True,
    "p2p": True,
    "gbps_bidirectional": 900.0,
    "source": "NVIDIA datasheet, per direction: 18 NVLink4 links x 25 GB/s",
}
# size -> bus bandwidth GB/s; two ranks, so the algorithm bandwidth is the same number
MEASURED = {MIB: 61.0, 8 * MIB: 212.0, TP_BYTES: 248.0, 64 * MIB: 331.0, 512 * MIB: 362.0, 1024 * MIB: 368.0}
ALLREDUCE = {
    "name": "allreduce",
    "backend": "nccl",
    "component": "comm",
    "runs": True,
    "status": "PASSED",
    "error": None,
    "gbps": 368.0,
    "peak_fraction": 0.818,
    "ms": 2.918,
    "shape": {"world_size": 2, "dtype": "bf16"},
    "arch": "sm_90",
    "extra": {
        "sizes": [
            {
                "bytes": size,
                "ms": round(size / (busbw * 1e9) * 1e3, 4),
                "algbw_gbps": busbw,
                "busbw_gbps": busbw,
                "peak_fraction": round(busbw / 450.0, 3),
                "correct": True,
                "model_tp": size == TP_BYTES,
            }
            for size, busbw in MEASURED.items()
        ],
        "model_tp_bytes": TP_BYTES,
        "link": NV18,
        "transports": [{"a": 0, "b": 1, "via": "P2P/CUMEM/read"}, {"a": 1, "b": 0, "via": "P2P/CUMEM/read"}],
        "nccl_version": "2.27.5+cuda12.9",
    },
}
SKIPPED = {
    "name": "allreduce",
    "backend": "nccl",
    "component": "comm",
    "runs": False,
    "status": "SKIPPED",
    "error": "1 GPU: an all-reduce needs at least two",
    "gbps": None,
    "peak_fraction": None,
    "shape": {"world_size": 0, "dtype": "bf16"},
    "extra": {"sizes": [], "model_tp_bytes": None, "link": None, "transports": [], "nccl_version": None},
}


@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, dict[str, Any], str]]:
    """What would have gone to the broker: (task, kwargs, queue)."""
    messages: list[tuple[str, dict[str, Any], str]] = []
    monkeypatch.setattr(services, "_send", lambda task, kwargs, queue: messages.append((task, kwargs, queue)))
    return messages


def h200_box(name: str = "h200-box", *, gpus: int = 2) -> GpuHost:
    """A host of H200s as its heartbeat describes it: two joined by 18 NVLinks, or one alone."""
    host = heartbeat(name, arch="sm_90", gpu="NVIDIA H200")
    host.inventory["gpus"] = host.inventory["gpus"][:gpus]
    host.inventory["links"] = [dict(NV18)] if gpus >= 2 else []
    host.save(update_fields=["inventory"])
    return host


def _measured(host: GpuHost, project: Any, *, results: list[dict[str, Any]], ago: timedelta, **fields: Any):
    return ProbeRun.objects.create(
        project=project,
        host=host,
        host_name=host.name,
        status="done",
        gpu_name="NVIDIA H200",
        arch="sm_90",
        finished_at=timezone.now() - ago,
        results=results,
        **fields,
    )


def _section(body: str, marker: str, end: str = "</section>") -> str:
    return body.split(marker, 1)[1].split(end, 1)[0]


def _figure(body: str, fig_id: str) -> dict[str, Any]:
    return json.loads(re.search(rf'id="{fig_id}"[^>]*>(.*?)</script>', body, re.S).group(1))


# ---------------------------------------------------------------- hosts


def test_the_link_matrix_of_a_two_gpu_host_shows_nv18_and_its_bandwidth(alice_client):
    host = h200_box()
    body = page(alice_client, reverse("front:hosts"))
    matrix = _section(body, f'id="links-{host.pk}"', "</table>")
    rows = [text_of(row).strip() for row in re.findall(r"<tr>(.*?)</tr>", matrix, re.S)]
    assert rows == ["GPU0 GPU1", "GPU0 X NV18 450 GB/s", "GPU1 NV18 450 GB/s X"]
    titles = " ".join(re.findall(r'title="([^"]*)"', matrix))  # what a cell says on hover
    assert "18 NVLink4 links through NVSwitch" in titles and "900 GB/s both ways" in titles
    legend = text_of(_section(body, f'id="links-{host.pk}"', "</dl>"))
    assert "NV# a bonded set of # NVLinks" in legend and "SYS PCIe and the SMP interconnect" in legend
    button = re.search(r'<button[^>]*value="allreduce"[^>]*>', body).group(0)
    assert "disabled" not in button


def test_a_one_gpu_host_shows_no_matrix_and_a_disabled_all_reduce_button_with_the_reason(alice_client):
    host = h200_box("h200-single", gpus=1)
    section = _section(page(alice_client, reverse("front:hosts")), f'id="host-{host.pk}"')
    assert f'id="links-{host.pk}"' not in section and "All-reduce (NCCL)" not in section
    button = re.search(r'<button[^>]*value="allreduce"[^>]*>Run all-reduce probe</button>', section).group(0)
    assert " disabled" in button and "needs at least 2 GPUs" in button
    assert "all-reduce needs at least 2 GPUs" in text_of(section)


def test_run_all_reduce_probe_sends_a_probe_job_for_allreduce_to_the_hosts_own_queue(
    alice_client, acme, sent, django_capture_on_commit_callbacks
):
    host = h200_box()
    with django_capture_on_commit_callbacks(execute=True):
        response = alice_client.post(reverse("front:host_probe", args=[host.pk]), {"probes": "allreduce"})
    assert response.status_code == 302 and response["Location"].endswith(f"#host-{host.pk}")
    run = ProbeRun.objects.get()
    assert run.host == host and run.project == acme and run.status == ProbeRun.Status.QUEUED
    [(task, kwargs, queue)] = sent
    assert (task, queue) == (PROBE_TASK, "gpu.host.h200-box")
    assert kwargs["job"]["probes"] == ["allreduce"] and kwargs["job"]["probe_run_id"] == run.pk


def test_a_viewer_cannot_run_the_all_reduce_probe(bob_client, sent):
    host = h200_box()
    response = bob_client.post(reverse("front:host_probe", args=[host.pk]), {"probes": "allreduce"})
    assert response.status_code == 403
    assert not ProbeRun.objects.exists() and sent == []


def test_a_host_with_one_gpu_refuses_the_all_reduce_probe(alice_client, sent):
    host = h200_box("h200-single", gpus=1)
    response = alice_client.post(reverse("front:host_probe", args=[host.pk]), {"probes": "allreduce"})
    assert response.status_code == 400 and "needs at least 2 GPUs" in response.content.decode()
    assert not ProbeRun.objects.exists() and sent == []


def test_the_hosts_page_charts_the_newest_all_reduce_and_keeps_the_kernel_probes_of_the_run_before(
    alice_client, acme
):
    host = h200_box()
    _measured(host, acme, results=[PROBES[0]], ago=timedelta(hours=2))
    _measured(host, acme, results=[{**ALLREDUCE, "gbps": 1.0}], ago=timedelta(days=3))  # an older measurement
    _measured(host, acme, results=[ALLREDUCE], ago=timedelta(minutes=5))
    body = page(alice_client, reverse("front:hosts"))
    figure = _figure(body, f"allreduce-fig-{host.pk}")
    assert figure["layout"]["xaxis"]["type"] == "log" and figure["meta"]["busbw_gbps"][-1] == 368.0
    block = _section(body, f'id="allreduce-fig-{host.pk}-block"', "</table>")
    rows = [text_of(row).strip() for row in re.findall(r"<tr[^>]*>(.*?)</tr>", block, re.S)]
    assert rows[1] == "1 MiB 0.0172 61.0 61.0 14%"
    assert rows[-1] == "1 GiB 2.918 368.0 368.0 82%"
    assert "model TP 14 MiB" in rows[3]
    shown = text_of(body)
    assert "368 GB/s bus bandwidth at the largest size (82% of the link)" in shown
    assert "2 GPUs · bf16 · nccl 2.27.5+cuda12.9" in shown
    assert "over NV18 , 450 GB/s datasheet" in shown  # (text_of leaves a space where a tag ends)
    assert "GPU0 → GPU1 P2P/CUMEM/read" in shown
    # the kernel probes of the run before stay on show, and their chart has no all-reduce bar
    kernels = _figure(body, f"probe-fig-{host.pk}")
    assert kernels["layout"]["xaxis"]["categoryarray"] == ["moe_nvfp4 · flashinfer_cutlass"]
    assert "62%" in body


def test_a_skipped_all_reduce_shows_its_reason(alice_client, acme):
    host = h200_box("h200-single", gpus=1)
    _measured(host, acme, results=[SKIPPED], ago=timedelta(minutes=1))
    section = _section(page(alice_client, reverse("front:hosts")), f'id="host-{host.pk}"')
    assert "Skipped: 1 GPU: an all-reduce needs at least two" in text_of(section)
    assert f'id="allreduce-fig-{host.pk}"' not in section  # nothing to draw


def test_another_projects_all_reduce_stays_theirs_on_the_hosts_page(alice_client, charlie_client, umbrella):
    host = h200_box()
    _measured(host, umbrella, results=[ALLREDUCE], ago=timedelta(minutes=1))
    assert f'id="allreduce-fig-{host.pk}"' in page(charlie_client, reverse("front:hosts"))
    assert f'id="allreduce-fig-{host.pk}"' not in page(alice_client, reverse("front:hosts"))


# ---------------------------------------------------------------- figures (plain dicts)


def test_the_all_reduce_figure_is_bus_bandwidth_per_size_on_a_log_axis_under_the_links_peak():
    fig = allreduce_figure(ALLREDUCE)
    curve = fig["data"][0]
    assert curve["x"] == [float(size) for size in MEASURED] and curve["y"] == list(MEASURED.values())
    hover = curve["customdata"][2]
    assert "<b>14 MiB</b>" in hover and "bus bandwidth 248.0 GB/s" in hover and "55% of the NV18" in hover
    xaxis = fig["layout"]["xaxis"]
    assert xaxis["type"] == "log"
    assert xaxis["ticktext"] == ["1 MiB", "8 MiB", "64 MiB", "512 MiB", "1 GiB"]
    assert xaxis["tickvals"][0] == MIB and xaxis["tickvals"][-1] == 1024 * MIB
    [peak] = fig["layout"]["shapes"]
    assert (peak["y0"], peak["y1"], peak["xref"]) == (450.0, 450.0, "paper")
    assert fig["layout"]["annotations"][0]["text"] == "NV18 datasheet 450 GB/s per direction"
    assert fig["layout"]["yaxis"]["range"][1] > 450.0
    tp_line, tp_point = fig["data"][1:]
    assert tp_line["x"] == [TP_BYTES, TP_BYTES] and tp_line["name"] == "model's TP all-reduce, 14 MiB"
    assert tp_point["x"] == [TP_BYTES] and tp_point["y"] == [248.0]


def test_an_all_reduce_without_its_link_takes_the_hosts_and_one_without_sizes_draws_nothing():
    alone = {**ALLREDUCE, "extra": {**ALLREDUCE["extra"], "link": None, "model_tp_bytes": None}}
    fig = allreduce_figure(alone, link={"a": 0, "b": 1, "kind": "SYS", "gbps": 63.0})
    assert fig["layout"]["shapes"][0]["y0"] == 63.0 and len(fig["data"]) == 1
    assert allreduce_figure(alone)["layout"]["shapes"] == []  # no datasheet figure: no line
    assert allreduce_figure(SKIPPED) is None


def test_the_kernel_probe_chart_leaves_the_all_reduce_out():
    fig = probe_figure([PROBES[0], ALLREDUCE])
    assert fig["layout"]["xaxis"]["categoryarray"] == ["moe_nvfp4 · flashinfer_cutlass"]
    assert probe_figure([ALLREDUCE]) is None


# ---------------------------------------------------------------- reports


NCCL_TRANSPORTS = [
    {"a": 0, "b": 1, "transport": "SHM", "via": "SHM/direct/direct", "line": 12},
    {"a": 1, "b": 0, "transport": "SHM", "via": "SHM/direct/direct", "line": 13},
]


@pytest.fixture
def nccl_crash(acme, make_report, make_document):
    """A TP2 launch on two H200s that died in NCCL, its log at NCCL_DEBUG=INFO."""
    document = make_document(
        gpu={"name": "NVIDIA H200", "arch": "sm_90", "count": 2},
        failure_class="nccl_error",
        nccl_transports=NCCL_TRANSPORTS,
    )
    return make_report(acme, document=document, title="TP2 NCCL crash")


def test_a_multi_gpu_crash_report_shows_its_nccl_transports_and_the_newest_all_reduce_of_its_arch(
    alice_client, charlie_client, nccl_crash, acme, umbrella, make_report
):
    _measured(h200_box("h200-old"), acme, results=[ALLREDUCE], ago=timedelta(days=1))
    newest = _measured(h200_box("h200-box"), acme, results=[ALLREDUCE], ago=timedelta(hours=1))
    _measured(h200_box("h200-theirs"), umbrella, results=[ALLREDUCE], ago=timedelta(minutes=1))
    _measured(h200_box("h200-single", gpus=1), acme, results=[SKIPPED], ago=timedelta(minutes=1))
    rtx = heartbeat("rtx-box")
    ProbeRun.objects.create(
        project=acme, host=rtx, host_name="rtx-box", status="done", arch="sm_120", results=[ALLREDUCE]
    )
    body = page(alice_client, reverse("front:report", args=[nccl_crash.pk]))
    panel = _section(body, 'id="gpu-links"')
    log = reverse("front:log", args=[nccl_crash.pk])
    transports = _section(panel, 'id="nccl-transports"', "</table>")
    rows = [text_of(row).strip() for row in re.findall(r"<tr>(.*?)</tr>", transports, re.S)]
    assert rows[1:] == ["0 → 1 SHM SHM/direct/direct L12", "1 → 0 SHM SHM/direct/direct L13"]
    assert f'href="{log}?line=12#L12"' in transports and f'href="{log}?line=13#L13"' in transports
    source = text_of(_section(panel, 'id="allreduce-source"', "</p>"))
    assert "on h200-box (NVIDIA H200 sm_90)" in source
    assert f"?probe={newest.pk}#host-{newest.host_id}" in panel
    for other in ("h200-old", "h200-theirs", "h200-single", "rtx-box"):
        assert other not in panel, other
    figure = _figure(body, "report-allreduce-fig")
    assert figure["layout"]["height"] < 320 and figure["layout"]["shapes"][0]["y0"] == 450.0
    # an outsider sees neither the report nor, on their own crash, acme's measurements
    assert charlie_client.get(reverse("front:report", args=[nccl_crash.pk])).status_code == 404
    theirs = make_report(umbrella, document=nccl_crash.document)
    panel = _section(page(charlie_client, reverse("front:report", args=[theirs.pk])), 'id="gpu-links"')
    assert "h200-theirs" in panel and "h200-box" not in panel


def test_a_multi_gpu_crash_without_a_measurement_says_where_to_get_one(alice_client, nccl_crash, umbrella):
    _measured(h200_box(), umbrella, results=[ALLREDUCE], ago=timedelta(minutes=1))  # not alice's to see
    panel = _section(page(alice_client, reverse("front:report", args=[nccl_crash.pk])), 'id="gpu-links"')
    sentence = "No all-reduce measurement of a sm_90 host yet: run the all-reduce probe on the GPU hosts page"
    assert sentence in text_of(panel)
    assert f'href="{reverse("front:hosts")}"' in panel


def test_a_report_of_a_single_gpu_shows_no_links_panel(alice_client, acme, make_report):
    h200_box()
    report = make_report(acme)  # one H100, out of memory
    body = page(alice_client, reverse("front:report", args=[report.pk]))
    assert 'id="gpu-links"' not in body and "GPU links" not in body


# ---------------------------------------------------------------- confirm runs


def test_a_confirm_with_an_all_reduce_among_its_probes_charts_it(alice_client, nccl_crash):
    run = ConfirmRun.objects.create(
        project=nccl_crash.project,
        report=nccl_crash,
        queue="gpu.sm_90",
        arch="sm_90",
        launcher="sglang",
        status=ConfirmRun.Status.FIXED,
        finished_at=timezone.now(),
        result={"ready": True, "probes": [PROBES[0], ALLREDUCE], "inventory": {"links": [NV18]}},
    )
    body = page(alice_client, reverse("front:confirm", args=[run.pk]))
    assert _figure(body, "confirm-allreduce-fig")["meta"]["peak_gbps"] == 450.0
    assert "368 GB/s bus bandwidth" in text_of(_section(body, 'id="allreduce"'))
    kernels = _figure(body, "confirm-probe-fig")
    assert kernels["layout"]["xaxis"]["categoryarray"] == ["moe_nvfp4 · flashinfer_cutlass"]
