"""The GPU pages as alice (member of acme), bob (acme viewer) and charlie (umbrella only) see them:
hosts, the report's "Confirm on GPU" panel, the confirm form and page, the compatibility matrix."""

from __future__ import annotations

import copy
import functools
import html
import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from dispatchlab.core import analyze_paths
from dispatchlab.gpu import services
from dispatchlab.gpu.models import ConfirmOutput, ConfirmRun, GpuHost, ProbeRun, SignatureConfirmation
from dispatchlab.messaging.contract import CONFIRM_TASK, PROBE_TASK

CANONICAL = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "sglang_dsv4_eagle_sm120.log"
TOP_SIGNATURE = "spec-draft-mxfp4-trtllm-moe-non-sm100"


@functools.cache
def _canonical_document() -> dict[str, Any]:
    return analyze_paths([CANONICAL])


@pytest.fixture
def crash(acme, make_report):
    """The seed case, analysed by the core: DSv4 NVFP4 + EAGLE on sm_120, the draft's MoE crashes."""
    return make_report(acme, document=copy.deepcopy(_canonical_document()), title="DSv4 EAGLE TP4")


@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, dict[str, Any], str]]:
    """What would have gone to the broker: (task, kwargs, queue)."""
    messages: list[tuple[str, dict[str, Any], str]] = []
    monkeypatch.setattr(services, "_send", lambda task, kwargs, queue: messages.append((task, kwargs, queue)))
    return messages


def heartbeat(name: str, *, arch: str = "sm_120", gpu: str = "NVIDIA RTX PRO 6000 Blackwell", **extra: Any):
    inventory = {
        "gpus": [
            {
                "index": i,
                "name": gpu,
                "arch": arch,
                "memory_mib": 97_887,
                "capability": "12.0",
                "sm_clock_max_mhz": 2430,
                "memory_clock_max_mhz": 14001,
                "power_limit_w": 600.0,
                "pcie_gen": 5,
                "pcie_width": 16,
                "pcie_max_gen": 5,
                "pcie_max_width": 16,
                "nvlinks": 0,
            }
            for i in range(2)
        ],
        "links": [{"a": 0, "b": 1, "kind": "NODE", "gbps": 128.0}],
        "driver": "580.95.05",
        "cuda_version": "13.0",
        "versions": {
            "sglang": "0.5.9",
            "vllm": None,
            "flashinfer": "0.6.1",
            "torch": "2.9.1",
            "triton": "3.5.1",
        },
    }
    payload = {
        "host": name,
        "queues": ["gpu", f"gpu.{arch}", f"gpu.host.{name}"],
        "inventory": inventory,
        "launchers": ["sglang", "vllm"],
        "model_roots": ["/models"],
        "busy": False,
        "stopping": False,
        **extra,
    }
    return services.host_heartbeat(payload=payload)


def page(client, url: str, status: int = 200) -> str:
    response = client.get(url)
    assert response.status_code == status, response.content[:500]
    return response.content.decode()


def text_of(body: str) -> str:
    """The page as a person reads it: tags dropped, entities decoded, spaces collapsed."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", body)))


# ---------------------------------------------------------------- hosts


def test_the_hosts_page_shows_a_host_from_its_heartbeat_as_alive(alice_client):
    heartbeat("rtx-box")
    body = page(alice_client, reverse("front:hosts"))
    shown = text_of(body)
    assert "rtx-box" in shown and "alive" in shown
    assert re.search(r"last heartbeat \d+ s ago", shown)
    assert "NVIDIA RTX PRO 6000 Blackwell" in shown and "96 GiB" in shown
    assert "gpu.sm_120" in shown and "580.95.05" in shown and "CUDA 13.0" in shown
    assert "Gen5 x16" in shown and "600 W" in shown
    assert "vllm not installed" in shown and "sglang 0.5.9" in shown and "sgl-kernel not installed" in shown
    assert "/models" in shown


def test_a_host_not_heard_from_for_longer_than_the_alive_window_is_not_alive(alice_client):
    heartbeat("gone-quiet", arch="sm_90", gpu="NVIDIA H200")
    GpuHost.objects.filter(name="gone-quiet").update(last_seen=timezone.now() - timedelta(minutes=10))
    heartbeat("said-goodbye", stopping=True)
    body = page(alice_client, reverse("front:hosts"))
    quiet = body.split('id="host-', 2)[1]
    assert "gone-quiet" in quiet and "not alive" in quiet and "10 min ago" in text_of(quiet)
    assert "stopped" in body.split('id="host-', 2)[2]


def test_anyone_logged_in_sees_the_hosts_but_only_a_member_can_run_probes(
    alice_client, bob_client, charlie_client, client
):
    heartbeat("rtx-box")
    assert "Run probes" in page(alice_client, reverse("front:hosts"))
    assert "Run probes" in page(charlie_client, reverse("front:hosts"))  # a member of another project
    viewer = page(bob_client, reverse("front:hosts"))
    assert "rtx-box" in viewer and "Run probes" not in viewer
    assert client.get(reverse("front:hosts")).status_code == 302  # anonymous: to the login page


def test_run_probes_asks_the_host_on_its_own_queue(
    alice_client, sent, acme, django_capture_on_commit_callbacks
):
    host = heartbeat("rtx-box")
    with django_capture_on_commit_callbacks(execute=True):
        response = alice_client.post(reverse("front:host_probe", args=[host.pk]))
    assert response.status_code == 302 and response["Location"].endswith(f"#host-{host.pk}")
    run = ProbeRun.objects.get()
    assert run.host == host and run.project == acme and run.status == ProbeRun.Status.QUEUED
    assert [(task, queue) for task, _, queue in sent] == [(PROBE_TASK, "gpu.host.rtx-box")]
    assert "waiting for the host" in page(alice_client, reverse("front:hosts"))


def test_a_viewer_cannot_run_probes(bob_client, sent):
    host = heartbeat("rtx-box")
    assert bob_client.post(reverse("front:host_probe", args=[host.pk])).status_code == 403
    assert not ProbeRun.objects.exists() and sent == []


PROBES = [
    {
        "name": "moe_nvfp4",
        "backend": "flashinfer_cutlass",
        "component": "moe",
        "runs": True,
        "status": "PASSED",
        "error": None,
        "max_error": 0.004,
        "ms": 1.25,
        "tflops": 310.0,
        "peak_fraction": 0.62,
        "shape": "tokens=256 experts=256 topk=8",
        "arch": "sm_120",
    },
    {
        "name": "moe_nvfp4",
        "backend": "flashinfer_trtllm",
        "component": "moe",
        "runs": False,
        "status": "UNSUPPORTED_ARCH",
        "error": "MoE kernel requires 10.x architecture. Current device has SM 120",
        "arch": "sm_120",
    },
]


def test_the_hosts_page_shows_the_latest_probe_run_as_a_table_and_a_chart(alice_client, acme):
    host = heartbeat("rtx-box")
    ProbeRun.objects.create(project=acme, host=host, host_name="rtx-box", status="done", results=[PROBES[0]])
    ProbeRun.objects.create(
        project=acme,
        host=host,
        host_name="rtx-box",
        status="done",
        finished_at=timezone.now(),
        gpu_name="NVIDIA RTX PRO 6000 Blackwell",
        arch="sm_120",
        results=PROBES,
    )
    body = page(alice_client, reverse("front:hosts"))
    assert "62%" in body and "unsupported arch" in body and "MoE kernel requires 10.x architecture" in body
    figure = json.loads(re.search(rf'id="probe-fig-{host.pk}"[^>]*>(.*?)</script>', body, re.S).group(1))
    assert figure["layout"]["shapes"][0]["y0"] == 100


# ---------------------------------------------------------------- the report page's panel


def test_a_report_of_sm_120_with_no_live_host_says_so_plainly(alice_client, crash):
    heartbeat("h200-box", arch="sm_90", gpu="NVIDIA H200")
    body = page(alice_client, reverse("front:report", args=[crash.pk]))
    shown = text_of(body)
    assert "No live GPU host of sm_120" in shown
    assert "waits in queue gpu.sm_120 until python -m worker runs on a sm_120 host" in shown
    assert reverse("front:confirm_new", args=[crash.pk]) in body and "Confirm on GPU" in body


def test_a_report_with_a_live_host_of_its_arch_names_it(alice_client, crash):
    heartbeat("rtx-box")
    shown = text_of(page(alice_client, reverse("front:report", args=[crash.pk])))
    assert "1 live GPU host of sm_120: rtx-box" in shown


def test_a_viewer_sees_the_plan_link_but_no_confirm_button(bob_client, crash):
    body = page(bob_client, reverse("front:report", args=[crash.pk]))
    assert 'id="confirm-on-gpu"' not in body and "viewers cannot start runs" in body


def test_the_report_lists_its_confirm_runs_and_the_signature_confirmations(alice_client, crash, make_report):
    fixed = ConfirmRun.objects.create(
        project=crash.project,
        report=crash,
        queue="gpu.sm_120",
        arch="sm_120",
        status="fixed",
        launcher="sglang",
    )
    ConfirmRun.objects.create(
        project=crash.project,
        report=crash,
        queue="gpu.sm_120",
        arch="sm_120",
        status="garbage",
        launcher="sglang",
    )
    SignatureConfirmation.objects.create(
        signature_id=TOP_SIGNATURE,
        confirm=fixed,
        outcome="fixed",
        gpu_name="NVIDIA RTX PRO 6000 Blackwell",
        arch="sm_120",
        server="sglang",
        server_version="0.5.9",
    )
    body = page(alice_client, reverse("front:report", args=[crash.pk]))
    runs = body.split('id="confirm-runs"', 1)[1].split("</ul>", 1)[0]
    assert 'class="badge confirm confirm-ok">fixed' in runs
    assert 'class="badge confirm confirm-garbage">serves garbage' in runs
    assert reverse("front:confirm", args=[fixed.pk]) in runs
    lines = text_of(body.split('id="signature-confirmations"', 1)[1].split("</ul>", 1)[0])
    assert "confirmed on NVIDIA RTX PRO 6000 Blackwell sm_120, sglang 0.5.9" in lines


def test_a_confirm_output_report_says_whose_output_it_is_and_links_the_comparison(
    alice_client, crash, make_report
):
    new = make_report(crash.project)
    run = ConfirmRun.objects.create(
        project=crash.project,
        report=crash,
        result_report=new,
        queue="gpu.sm_120",
        arch="sm_120",
        status="fixed",
        launcher="sglang",
    )
    body = page(alice_client, reverse("front:report", args=[new.pk]))
    banner = body.split('id="confirm-of"', 1)[1].split("</div>", 1)[0]
    assert f"confirm run {run.pk}" in banner and f"report {crash.pk}" in banner and "fixed" in banner
    assert f"{reverse('front:compare')}?a={crash.pk}&amp;b={new.pk}" in banner


# ---------------------------------------------------------------- the confirm form


def test_the_confirm_form_shows_the_fix_as_a_diff_of_the_launch(alice_client, crash):
    body = page(alice_client, reverse("front:confirm_new", args=[crash.pk]))
    diff = body.split('id="launch-diff"', 1)[1].split("</section>", 1)[0]
    removed = re.findall(r'diff-removed">.*?<code>(.*?)</code>', diff)
    # Without --speculative-algorithm the other --speculative-* flags mean nothing: they go too.
    assert removed == [
        "--speculative-algorithm EAGLE",
        "--speculative-num-steps 1",
        "--speculative-eagle-topk 1",
        "--speculative-num-draft-tokens 2",
        "--speculative-moe-runner-backend triton",
    ]
    changed = re.search(
        r'diff-changed">.*?<code class="before">(.*?)</code>.*?<code class="after">(.*?)</code>', diff
    )
    assert changed.groups() == ("--moe-runner-backend triton", "--moe-runner-backend flashinfer_cutlass")
    assert "<code>--tp 4</code>" in diff  # unchanged lines are shown plain
    shown = text_of(body)
    assert "Speculative draft (NextN/MTP) MoE" in shown and TOP_SIGNATURE in shown
    assert "No live GPU host of sm_120" in shown
    command = html.unescape(re.search(r"<textarea[^>]*>(.*?)</textarea>", body, re.S).group(1))
    assert "--moe-runner-backend flashinfer_cutlass" in command and "--speculative-algorithm" not in command
    assert re.search(r'value="component:moe" checked', body)
    assert not re.search(r'value="component:jit" checked', body)


def test_queueing_a_confirm_sends_the_fixed_launch_to_the_queue_of_the_reports_arch(
    alice_client, crash, sent, django_capture_on_commit_callbacks
):
    form = page(alice_client, reverse("front:confirm_new", args=[crash.pk]))
    command = html.unescape(re.search(r"<textarea[^>]*>(.*?)</textarea>", form, re.S).group(1))
    with django_capture_on_commit_callbacks(execute=True):
        response = alice_client.post(
            reverse("front:confirm_new", args=[crash.pk]),
            {"command": command, "probes": ["component:moe", "component:memory", "component:evil"]},
        )
    run = ConfirmRun.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("front:confirm", args=[run.pk])
    assert run.status == ConfirmRun.Status.WAITING_FOR_HOST and run.queue == "gpu.sm_120"
    assert run.probes == ["component:moe", "component:memory"]
    [(task, kwargs, queue)] = sent
    assert (task, queue) == (CONFIRM_TASK, "gpu.sm_120")
    args = kwargs["job"]["launch"]["args"]
    assert "--speculative-algorithm" not in args
    assert args[args.index("--moe-runner-backend") + 1] == "flashinfer_cutlass"
    body = page(alice_client, response["Location"])
    assert "Waiting in queue gpu.sm_120: no live host of sm_120" in text_of(body)


def test_a_command_that_uses_the_shell_is_refused_and_kept_for_editing(alice_client, crash, sent):
    command = "python -m sglang.launch_server --model-path /models/x ; rm -rf /"
    response = alice_client.post(reverse("front:confirm_new", args=[crash.pk]), {"command": command})
    assert response.status_code == 400
    body = response.content.decode()
    assert "shell metacharacter" in text_of(body)
    assert html.unescape(re.search(r"<textarea[^>]*>(.*?)</textarea>", body, re.S).group(1)) == command
    assert not ConfirmRun.objects.exists() and sent == []


def test_a_log_without_a_launch_asks_for_the_command(alice_client, acme, make_report, make_document):
    report = make_report(acme, document=make_document(server_args={}, launch_command=None))
    body = page(alice_client, reverse("front:confirm_new", args=[report.pk]))
    assert "paste the command line below" in body
    assert re.search(r"<textarea[^>]*></textarea>", body)


def test_a_viewer_sees_the_plan_but_cannot_queue_a_confirm(bob_client, crash, sent):
    body = page(bob_client, reverse("front:confirm_new", args=[crash.pk]))
    assert 'id="launch-diff"' in body and 'id="confirm-submit"' not in body
    response = bob_client.post(reverse("front:confirm_new", args=[crash.pk]), {"command": ""})
    assert response.status_code == 403
    assert not ConfirmRun.objects.exists() and sent == []


def test_an_outsider_cannot_see_or_queue_a_confirm(charlie_client, crash, sent):
    run = ConfirmRun.objects.create(
        project=crash.project, report=crash, queue="gpu.sm_120", arch="sm_120", launcher="sglang"
    )
    for url in [
        reverse("front:confirm_new", args=[crash.pk]),
        reverse("front:confirm", args=[run.pk]),
        reverse("front:confirm_status", args=[run.pk]),
    ]:
        assert charlie_client.get(url).status_code == 404, url
    assert (
        charlie_client.post(reverse("front:confirm_new", args=[crash.pk]), {"command": ""}).status_code == 404
    )
    assert ConfirmRun.objects.count() == 1 and sent == []


def test_the_confirm_pages_need_a_login(client, crash):
    response = client.get(reverse("front:confirm_new", args=[crash.pk]))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


# ---------------------------------------------------------------- the confirm page


def _run(report, **fields: Any) -> ConfirmRun:
    defaults = {
        "project": report.project,
        "report": report,
        "queue": "gpu.sm_120",
        "arch": "sm_120",
        "launcher": "sglang",
        "args": [
            "--model-path",
            "/models/DeepSeek-V4-Flash-NVFP4",
            "--moe-runner-backend",
            "flashinfer_cutlass",
        ],
        "signature_id": TOP_SIGNATURE,
        "job": {"smoke_prompt": services.SMOKE_PROMPT},
    }
    return ConfirmRun.objects.create(**{**defaults, **fields})


def test_a_waiting_confirm_polls_its_status_and_shows_the_launch_an_argument_a_line(alice_client, crash):
    run = _run(crash, status=ConfirmRun.Status.WAITING_FOR_HOST)
    body = page(alice_client, reverse("front:confirm", args=[run.pk]))
    status = body.split('id="confirm-status"', 1)[1].split("</div>", 1)[0]
    assert f'hx-get="{reverse("front:confirm_status", args=[run.pk])}"' in status
    assert 'hx-trigger="every 2s"' in status
    assert "Waiting in queue gpu.sm_120: no live host of sm_120" in text_of(status)
    assert reverse("front:hosts") in status
    argv = re.findall(r'<li class="arg-(\w+)"><code>(.*?)</code></li>', body)
    assert [text for _, text in argv] == [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/DeepSeek-V4-Flash-NVFP4",
        "--moe-runner-backend",
        "flashinfer_cutlass",
    ]
    assert [kind for kind, _ in argv[:5]] == ["program", "program", "program", "flag", "value"]


def test_a_running_confirm_streams_the_tail_of_its_output_as_text(alice_client, crash):
    run = _run(crash, status=ConfirmRun.Status.RUNNING, started_at=timezone.now(), host_name="rtx-box")
    lines = [f"[TP0] line {n}" for n in range(300)] + ["<script>document.body.dataset.pwned=1</script>"]
    for seq, start in enumerate(range(0, len(lines), 50)):
        ConfirmOutput.objects.create(confirm=run, seq=seq, text="\n".join(lines[start : start + 50]) + "\n")
    body = page(alice_client, reverse("front:confirm_status", args=[run.pk]))
    assert "Running on host rtx-box for" in text_of(body)
    output = body.split('id="confirm-output">', 1)[1].split("</pre>", 1)[0]
    assert "[TP0] line 299" in output and "[TP0] line 50\n" not in output
    assert "&lt;script&gt;" in output and "<script>" not in output


def test_the_status_fragment_sends_the_browser_to_the_results_once_finished(alice_client, crash):
    run = _run(crash, status=ConfirmRun.Status.FIXED)
    response = alice_client.get(reverse("front:confirm_status", args=[run.pk]), HTTP_HX_REQUEST="true")
    assert response["HX-Redirect"] == reverse("front:confirm", args=[run.pk])
    assert "hx-get" not in response.content.decode()


def test_a_refused_confirm_shows_the_workers_reason_verbatim(alice_client, crash):
    reason = "--model-path /etc/passwd is outside the model roots (/models)"
    run = _run(crash, status=ConfirmRun.Status.REFUSED, error=reason)
    body = page(alice_client, reverse("front:confirm", args=[run.pk]))
    assert "Refused by the worker" in body and html.escape(reason) in body


FINISHED = {
    "ready": True,
    "ready_by": "health URL /health",
    "ready_seconds": 212.4,
    "stopped_by": "dispatchlab after the checks",
    "exit_code": 0,
    "smoke": {
        "prompt": "The capital of France is",
        "text": "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!",
        "error": None,
        "garbage": {"garbage": True, "kind": "repeated_char", "reason": "one character repeated 32 times"},
        "latency_s": 0.42,
    },
    "throughput": [
        {
            "concurrency": 4,
            "requests": 8,
            "completion_tokens": 1024,
            "seconds": 9.1,
            "tokens_per_s": 112.5,
            "errors": 0,
        },
        {
            "concurrency": 1,
            "requests": 2,
            "completion_tokens": 256,
            "seconds": 6.0,
            "tokens_per_s": 42.7,
            "errors": 0,
        },
    ],
    "probes": PROBES,
    "inventory": {
        "gpus": [{"name": "NVIDIA RTX PRO 6000 Blackwell", "arch": "sm_120"}],
        "versions": {"sglang": "0.5.9", "vllm": None},
    },
}


def test_a_finished_confirm_shows_the_answer_the_verdict_throughput_and_probes(
    alice_client, crash, make_report
):
    new = make_report(crash.project)
    run = _run(
        crash,
        status=ConfirmRun.Status.GARBAGE,
        error="the server answers garbage: one character repeated 32 times",
        host_name="rtx-box",
        result=FINISHED,
        result_report=new,
        finished_at=timezone.now(),
    )
    body = page(alice_client, reverse("front:confirm", args=[run.pk]))
    shown = text_of(body)
    assert "Serves garbage: one character repeated 32 times" in shown
    smoke = text_of(body.split('id="smoke"', 1)[1].split("</section>", 1)[0])
    assert "The capital of France is" in smoke and "!!!!!!!!!!!!!!!!" in smoke
    assert "garbage repeated_char one character repeated 32 times" in smoke and "latency s 0.42" in smoke
    throughput = text_of(body.split('id="throughput"', 1)[1].split("</table>", 1)[0])
    assert "1 2 256 6.0 42.7" in throughput and "4 8 1024 9.1 112.5" in throughput
    probes = body.split('id="probes"', 1)[1].split("</section>", 1)[0]
    assert "flashinfer_cutlass" in probes and "62%" in probes and "unsupported arch" in probes
    figure = json.loads(re.search(r'id="confirm-probe-fig"[^>]*>(.*?)</script>', body, re.S).group(1))
    assert figure["layout"]["shapes"][0]["y0"] == 100
    links = body.split('id="confirm-links"', 1)[1].split("</div>", 1)[0]
    assert (
        reverse("front:report", args=[crash.pk]) in links and reverse("front:report", args=[new.pk]) in links
    )
    assert f"{reverse('front:compare')}?a={crash.pk}&amp;b={new.pk}" in links
    assert f"?signature={TOP_SIGNATURE}" in body
    assert "hx-get" not in body.split('id="confirm-status"', 1)[1].split("</div>", 1)[0]
