"""Browser flow: a crash report -> "Confirm on GPU" -> the fix as a diff of the launch -> queued, waiting
for a host of the report's arch. And a finished confirm run draws its charts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone
from seedlog import seed_case_lines

from dispatchlab.gpu import confirm_outcomes, services
from dispatchlab.gpu.models import ConfirmRun, GpuHost
from dispatchlab.reports.analysis import report_analyze
from dispatchlab.reports.models import Report
from dispatchlab.reports.submit import report_create

pytestmark = pytest.mark.browser

CONFIRM_URL = re.compile(r"/confirms/(\d+)/$")


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any], str]]:
    """The broker, as a list: (task, kwargs, queue)."""
    messages: list[tuple[str, dict[str, Any], str]] = []
    monkeypatch.setattr(services, "_send", lambda task, kwargs, queue: messages.append((task, kwargs, queue)))
    return messages


def _crash_report(lab: Any, alice: Any) -> Report:
    upload = SimpleUploadedFile("seed-tp4.log", ("\n".join(seed_case_lines(filler=50)) + "\n").encode())
    report = report_create(project=lab, user=alice, files=[upload], title="DSv4 EAGLE TP4 on RTX PRO 6000")
    report_analyze(report_id=report.pk)
    report.refresh_from_db()
    assert report.status == Report.Status.DONE and report.arch == "sm_120", report.error
    return report


def test_confirm_a_fix_and_land_on_the_run_waiting_for_an_sm_120_host(
    page, lab, alice, sent, artifacts: Path
):
    services.host_heartbeat(
        payload={
            "host": "h200-box",
            "queues": ["gpu", "gpu.sm_90"],
            "inventory": {
                "gpus": [{"index": 0, "name": "NVIDIA H200", "arch": "sm_90", "memory_mib": 143_771}]
            },
        }
    )
    report = _crash_report(lab, alice)
    page.goto(f"/reports/{report.pk}/")
    panel = page.locator("#confirm-gpu")
    assert "No live GPU host of sm_120" in panel.inner_text()
    panel.screenshot(path=str(artifacts / "report-confirm-panel.png"))

    page.click("#confirm-on-gpu")
    page.wait_for_url(re.compile(rf"/reports/{report.pk}/confirm/$"))
    diff = page.locator("#launch-diff")
    removed = diff.locator(".diff-removed").all_inner_texts()
    # the fix removes the algorithm; the --speculative-* values it leaves without a purpose go with it
    assert removed[0] == "---speculative-algorithm EAGLE" and len(removed) > 1
    assert all(line.startswith("---speculative-") for line in removed)
    changed = diff.locator(".diff-changed").inner_text()
    assert "--moe-runner-backend triton" in changed and "--moe-runner-backend flashinfer_cutlass" in changed
    command = page.input_value("#confirm-command")
    assert "flashinfer_cutlass" in command and "--speculative-algorithm" not in command
    assert page.is_checked("input[value='component:moe']")
    page.screenshot(path=str(artifacts / "confirm-form.png"), full_page=True)

    page.click("#confirm-submit")
    page.wait_for_url(CONFIRM_URL)
    status = page.locator("#confirm-status")
    assert "Waiting in queue gpu.sm_120: no live host of sm_120" in status.inner_text()
    assert status.get_attribute("data-status") == "waiting_for_host"
    assert [li.strip() for li in page.locator("#argv li").all_inner_texts()][:3] == [
        "python",
        "-m",
        "sglang.launch_server",
    ]
    run = ConfirmRun.objects.get()
    assert [(task, queue) for task, _, queue in sent] == [("gpu.confirm", "gpu.sm_120")]
    page.screenshot(path=str(artifacts / "confirm-waiting.png"), full_page=True)

    # a host of sm_120 says hello and takes the job: the polled status follows
    services.host_heartbeat(
        payload={
            "host": "rtx-box",
            "queues": ["gpu", "gpu.sm_120"],
            "inventory": {"gpus": [{"index": 0, "name": "NVIDIA RTX PRO 6000 Blackwell", "arch": "sm_120"}]},
        }
    )
    confirm_outcomes.confirm_started(
        payload={"confirm_id": run.pk, "host": "rtx-box", "argv": ["python", "-m", "x"]}
    )
    confirm_outcomes.confirm_output(payload={"confirm_id": run.pk, "seq": 0, "text": "Load weight begin.\n"})
    page.wait_for_selector("#confirm-status[data-status='running']")
    page.wait_for_selector("#confirm-output")
    assert "Running on host rtx-box" in page.locator("#confirm-status").inner_text()
    assert "Load weight begin." in page.locator("#confirm-output").inner_text()
    assert page.dialogs == []


PROBES = [
    {
        "name": "moe_nvfp4",
        "backend": "flashinfer_cutlass",
        "component": "moe",
        "runs": True,
        "status": "PASSED",
    }
    | {"peak_fraction": 0.62, "tflops": 310.0, "ms": 1.2, "max_error": 0.004, "arch": "sm_120"},
    {"name": "moe_nvfp4", "backend": "flashinfer_trtllm", "component": "moe", "runs": False}
    | {"status": "UNSUPPORTED_ARCH", "error": "MoE kernel requires 10.x architecture", "arch": "sm_120"},
    {"name": "gemm_fp4", "backend": "cutlass", "component": "gemm", "runs": True, "status": "PASSED"}
    | {"peak_fraction": 0.81, "tflops": 1620.0, "ms": 0.4, "arch": "sm_120"},
]


# the NCCL probe of a 2-GPU host: bus bandwidth at 1, 2, 4 and 8 MiB over NV18
ALLREDUCE = {"name": "allreduce", "backend": "nccl", "component": "comm", "status": "PASSED"} | {
    "runs": True,
    "gbps": 290.0,
    "shape": {"world_size": 2, "dtype": "bf16"},
    "extra": {
        "sizes": [
            {"bytes": (1 << 20) << n, "ms": 0.02 * (n + 1), "algbw_gbps": busbw, "busbw_gbps": busbw}
            for n, busbw in enumerate((61.0, 150.0, 212.0, 290.0))
        ],
        "model_tp_bytes": 8 << 20,
        "link": {"a": 0, "b": 1, "kind": "NV18", "gbps": 450.0},
        "transports": [{"a": 0, "b": 1, "via": "P2P/CUMEM/read"}],
    },
}


def test_a_finished_confirm_draws_throughput_and_probes_against_the_peak(page, lab, alice, artifacts: Path):
    report = _crash_report(lab, alice)
    run = ConfirmRun.objects.create(
        project=lab,
        report=report,
        status=ConfirmRun.Status.FIXED,
        queue="gpu.sm_120",
        arch="sm_120",
        launcher="sglang",
        args=["--model-path", "/models/DeepSeek-V4-Flash-NVFP4", "--tp", "4"],
        host_name="rtx-box",
        finished_at=timezone.now(),
        result={
            "ready": True,
            "ready_seconds": 180.0,
            "smoke": {"prompt": "The capital of France is", "text": " Paris.", "garbage": {"garbage": False}},
            "throughput": [
                {
                    "concurrency": 1,
                    "requests": 2,
                    "tokens_per_s": 41.0,
                    "seconds": 6.0,
                    "completion_tokens": 256,
                },
                {
                    "concurrency": 4,
                    "requests": 8,
                    "tokens_per_s": 118.0,
                    "seconds": 9.0,
                    "completion_tokens": 1024,
                },
            ],
            "probes": PROBES,
            "inventory": {"gpus": [{"name": "NVIDIA RTX PRO 6000 Blackwell", "arch": "sm_120"}]},
        },
    )
    page.goto(f"/confirms/{run.pk}/")
    page.wait_for_selector("#confirm-probe-fig-chart[data-drawn='1']")
    page.wait_for_selector("#confirm-throughput-chart[data-drawn='1']")
    chart = page.locator("#confirm-probe-fig-chart")
    assert chart.locator(".barlayer .point").count() == 3
    assert "unsupported arch" in chart.inner_text()
    page.screenshot(path=str(artifacts / "confirm-finished.png"), full_page=True)

    host = GpuHost.objects.create(name="rtx-box", arches=["sm_120"], queues=["gpu", "gpu.sm_120"])
    run.probe_runs.create(
        project=lab, host=host, host_name="rtx-box", status="done", arch="sm_120", results=PROBES
    )
    run.probe_runs.create(
        project=lab, host=host, status="done", finished_at=timezone.now(), arch="sm_120", results=[ALLREDUCE]
    )
    page.goto("/hosts/")
    page.wait_for_selector(f"#probe-fig-{host.pk}-chart[data-drawn='1']")
    page.wait_for_selector(f"#allreduce-fig-{host.pk}-chart[data-drawn='1']")
    assert page.locator(f"#allreduce-fig-{host.pk}-chart .scatterlayer .point").count() >= 4
    page.screenshot(path=str(artifacts / "hosts.png"), full_page=True)
    page.goto("/compat/")
    assert page.locator("td.compat-fails[data-arch='sm_120']").count() >= 1
    page.screenshot(path=str(artifacts / "compat.png"), full_page=True)
    assert page.dialogs == []
