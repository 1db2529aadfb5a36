"""Every page of the app, in a real browser, over realistic data: each one answers, shows the navigation,
holds nothing wider than the window, and leaves a full-page screenshot in test-artifacts/ for the next
reader to look at (issue #21). And the crash report's "compared with the last good run" panel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import URLPattern, reverse
from django.utils import timezone
from seedlog import seed_case_lines

from dispatchlab.decisions.services import decision_create, decision_update
from dispatchlab.front.urls import urlpatterns
from dispatchlab.gpu import services as gpu_services
from dispatchlab.gpu import sweep_services
from dispatchlab.gpu.models import ConfirmRun
from dispatchlab.notify import services as notify_services
from dispatchlab.reports.analysis import report_analyze
from dispatchlab.reports.models import Report
from dispatchlab.reports.submit import report_create
from tests.web.test_sweep_pages import worker_result

pytestmark = pytest.mark.browser

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WIDTH = 1280
MAX_HEIGHT = 2400
MAX_BYTES = 400_000
# Not pages: fragments the pages poll, and the targets of POST buttons.
NOT_PAGES = {
    "report_status",
    "confirm_status",
    "sweep_status",
    "host_probe",
    "sweep_new",
    "sweep_confirm",
    "confirm_cancel",
    "notify_test",
    "notify_pause",
    "notify_resume",
    "notify_delete",
}


def _analysed(lab: Any, alice: Any, name: str, data: bytes, title: str) -> Report:
    report = report_create(project=lab, user=alice, files=[SimpleUploadedFile(name, data)], title=title)
    report_analyze(report_id=report.pk)
    report.refresh_from_db()
    assert report.status == Report.Status.DONE, report.error
    return report


@pytest.fixture
def world(lab: Any, alice: Any, settings: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A project a team has used for a while: a good run and the crash after it, the seed case on sm_120
    with a finished sweep and confirm, a vLLM crash, a GPU host, a decision edited once, a webhook."""
    settings.DISPATCHLAB_NOTIFY_ALLOW_NETWORKS = ["127.0.0.0/8"]  # the webhook points at loopback
    monkeypatch.setattr(gpu_services, "_send", lambda task, kwargs, queue: None)
    monkeypatch.setattr(sweep_services, "_send", lambda task, kwargs, queue: None)
    good = _analysed(lab, alice, "qwen3-good.log", (FIXTURES / "lastgood" / "good.log").read_bytes(), "")
    crash = _analysed(lab, alice, "qwen3-crash.log", (FIXTURES / "lastgood" / "crash.log").read_bytes(), "")
    seed_log = ("\n".join(seed_case_lines(filler=120)) + "\n").encode()
    seed = _analysed(lab, alice, "dsv4-tp4.log", seed_log, "DSv4 EAGLE TP4 on RTX PRO 6000")
    vllm = _analysed(
        lab, alice, "llama70b.log", (FIXTURES / "logs" / "vllm_engine_core_oom.log").read_bytes(), ""
    )
    serving = _analysed(
        lab, alice, "qwen3-8b.log", (FIXTURES / "logs" / "sglang_h100_serving.log").read_bytes(), ""
    )
    gpu_services.host_heartbeat(
        payload={
            "host": "rtx-box",
            "queues": ["gpu", "gpu.sm_120"],
            "inventory": {
                "gpus": [
                    {
                        "index": i,
                        "name": "NVIDIA RTX PRO 6000 Blackwell",
                        "arch": "sm_120",
                        "memory_mib": 97_887,
                    }
                    for i in range(4)
                ]
            },
        }
    )
    sweep = sweep_services.sweep_create(report=seed, component="moe")
    sweep = sweep_services.sweep_finished(
        payload={"sweep_id": sweep.id, "host": "rtx-box", "result": worker_result()}
    )
    confirm = ConfirmRun.objects.create(
        project=lab,
        report=seed,
        status=ConfirmRun.Status.FIXED,
        queue="gpu.sm_120",
        arch="sm_120",
        launcher="sglang",
        args=[
            "--model-path",
            "/models/DeepSeek-V4-Flash-NVFP4",
            "--tp",
            "4",
            "--moe-runner-backend",
            "triton",
        ],
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
        },
    )
    decision = decision_create(
        project=lab,
        user=alice,
        data={
            "title": "MTP off on sm_120 until flashinfer ships SM120 trtllm-gen kernels",
            "context": "The EAGLE draft's MoE runs **trtllm-gen** kernels built for `sm_100` only.",
            "decision": "Launch with `--moe-runner-backend triton` on sm_120.",
            "links": {"groups": [seed.fingerprint], "reports": [seed.pk]},
        },
    )
    decision_update(
        decision=decision, user=alice, data={"status": "accepted", "revisit_when": {"flashinfer": ">=0.7"}}
    )
    endpoint = notify_services.endpoint_create(
        project=lab,
        user=None,
        url="http://127.0.0.1:9/hooks/dispatchlab/gpu-lab/serving-oncall/incidents?channel=inference-bringup",
        kind="generic",
        events=["group.new"],
    )
    return {
        "good": good,
        "crash": crash,
        "seed": seed,
        "vllm": vllm,
        "serving": serving,
        "sweep": sweep,
        "confirm": confirm,
        "decision": decision,
        "endpoint": endpoint,
        "lab": lab,
    }


def _pages(world: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """URL pattern name -> (screenshot name, URL)."""
    seed, lab = world["seed"], world["lab"]
    return {
        "report_list": ("reports", reverse("front:report_list")),
        "upload": ("upload", reverse("front:upload")),
        "report": ("report-crash-last-good", reverse("front:report", args=[world["crash"].pk])),
        "log": ("log", reverse("front:log", args=[seed.pk]) + f"?line={seed.document['crash']['line']}"),
        "redact": ("redact", reverse("front:redact", args=[seed.pk])),
        "groups": ("groups", reverse("front:groups")),
        "group": ("group", reverse("front:group", args=[seed.group_id])),
        "compare": ("compare", reverse("front:compare") + f"?a={world['good'].pk}&b={world['crash'].pk}"),
        "hosts": ("hosts", reverse("front:hosts")),
        "confirm_new": ("confirm-new", reverse("front:confirm_new", args=[seed.pk])),
        "confirm": ("confirm", reverse("front:confirm", args=[world["confirm"].pk])),
        "compat": ("compat", reverse("front:compat")),
        "sweep": ("sweep", reverse("front:sweep", args=[world["sweep"].pk])),
        "decisions": ("decisions", reverse("front:decisions")),
        "decision_new": ("decision-new", reverse("front:decision_new")),
        "decision": ("decision", reverse("front:decision", args=[world["decision"].pk])),
        "decision_edit": ("decision-edit", reverse("front:decision_edit", args=[world["decision"].pk])),
        "notifications": ("notifications", reverse("front:notifications")),
        "notify_project": ("notify-project", reverse("front:notify_project", args=[lab.slug])),
        "notify_endpoint": (
            "notify-endpoint",
            reverse("front:notify_endpoint", args=[lab.slug, world["endpoint"].pk]),
        ),
    }


def _shoot(page: Any, artifacts: Path, name: str) -> None:
    """A full-page screenshot, the first MAX_HEIGHT pixels of a longer page; JPEG when a PNG is too big
    for the repository to keep (the screenshots are committed for readers)."""
    for stale in artifacts.glob(f"page-{name}.*"):
        stale.unlink()
    height = min(MAX_HEIGHT, int(page.evaluate("document.documentElement.scrollHeight")))
    clip = {"x": 0, "y": 0, "width": WIDTH, "height": height}
    path = artifacts / f"page-{name}.png"
    page.screenshot(path=str(path), full_page=True, clip=clip)
    if path.stat().st_size > MAX_BYTES:
        path.unlink()
        page.screenshot(
            path=str(path.with_suffix(".jpg")), full_page=True, clip=clip, type="jpeg", quality=60
        )


# The most lines the text of any element matching the selector is laid out on.
MOST_LINES = """selector => Math.max(...[...document.querySelectorAll(selector)].map(element => {
  const range = document.createRange();
  range.selectNodeContents(element);
  return new Set([...range.getClientRects()].map(rect => Math.round(rect.top))).size;
}))"""


def _most_lines(page: Any, selector: str) -> int:
    assert page.locator(selector).count(), f"nothing matches {selector}"
    return int(page.evaluate(MOST_LINES, selector))


def _too_wide(page: Any) -> int:
    return int(page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth"))


def test_every_page_answers_with_the_navigation_and_fits_the_window(
    browser, live_server, page, world, artifacts
):
    pages = _pages(world)
    named = {p.name for p in urlpatterns if isinstance(p, URLPattern)}
    assert named - NOT_PAGES == set(pages), "a page was added or removed: walk it too"

    page.set_viewport_size({"width": WIDTH, "height": 900})
    extra = {
        "report-seed-sm120": reverse("front:report", args=[world["seed"].pk]),
        "report-vllm": reverse("front:report", args=[world["vllm"].pk]),
        "report-serving": reverse("front:report", args=[world["serving"].pk]),
        "api-docs": "/api/",
        "not-found": "/reports/987654/",
    }
    walk = [*pages.values(), *extra.items()]
    problems = []
    for name, url in walk:
        response = page.goto(url)
        page.wait_for_load_state("networkidle")
        expected = 404 if name == "not-found" else 200
        if response.status != expected:
            problems.append(f"{url}: {response.status}")
        if page.locator("nav a[href='/']").count() == 0:
            problems.append(f"{url}: no navigation")
        if _too_wide(page) > 0:
            problems.append(f"{url}: {_too_wide(page)} px wider than the window")
        _shoot(page, artifacts, name)
    assert problems == []
    assert page.dialogs == []

    page.goto(reverse("front:upload"))
    assert not page.locator("#upload-progress").is_visible(), "no progress bar before an upload"

    # names keep their words: one line each, never a letter a line
    page.goto("/api/")
    assert _most_lines(page, "table.api-params td:first-child code, table.api-params thead th") == 1
    page.goto(reverse("front:decision", args=[world["decision"].pk]))
    assert _most_lines(page, "#history table.changes tbody th") == 1
    page.goto(reverse("front:notify_endpoint", args=[world["lab"].slug, world["endpoint"].pk]))
    assert _most_lines(page, ".page-head .actions .button") == 1

    context = browser.new_context(viewport={"width": WIDTH, "height": 900}, base_url=live_server.url)
    anonymous = context.new_page()
    anonymous.goto(reverse("login"))
    assert anonymous.locator("input[name='username']").count() == 1
    _shoot(anonymous, artifacts, "login")
    context.close()


def test_a_crash_shows_what_changed_since_the_last_good_run(page, world, artifacts):
    crash, good = world["crash"], world["good"]
    page.goto(reverse("front:report", args=[crash.pk]))
    panel = page.locator("#last-good")
    assert panel.is_visible()
    assert panel.locator(f"a[href='/reports/{good.pk}/']").count() == 1
    row = panel.locator("table.changes tr", has_text="mem_fraction_static")
    assert row.locator("td").all_inner_texts() == ["0.85", "0.92"]
    assert _most_lines(page, "#last-good table.changes tbody th") == 1
    new_lines = panel.locator("ol.new-lines li")
    assert "torch.OutOfMemoryError" in " ".join(new_lines.all_inner_texts())
    assert "Load weight end" not in panel.inner_text()
    panel.screenshot(path=str(artifacts / "report-last-good-panel.png"))
    new_lines.filter(has_text="torch.OutOfMemoryError").locator("a").click()
    page.wait_for_url(f"**/reports/{crash.pk}/log/**")
