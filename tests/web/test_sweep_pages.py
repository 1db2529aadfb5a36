"""The backend sweep as alice (member of acme), bob (acme viewer) and charlie (umbrella only) see it: the
report page's "Sweep backends" panel, the sweep page while it waits and once ranked, its chart, the one
click that confirms the full launch with the proposed backend, and the API."""

from __future__ import annotations

import copy
import html
import json
import re
from typing import Any

import pytest
from django.urls import reverse

from dispatchlab.front.sweep_figures import sweep_figure
from dispatchlab.gpu import services, sweep_services
from dispatchlab.gpu.models import ConfirmRun, SweepRun
from dispatchlab.gpu.sweep_services import sweep_component_for, sweep_create, sweep_finished, sweep_started
from dispatchlab.reports.accounts import apitoken_create
from tests.web.conftest import sample_document
from tests.web.test_api_schema import bearer, conforms
from tests.web.test_api_schema import document as document  # the OpenAPI document, a fixture
from tests.web.test_gpu_pages import _canonical_document, heartbeat

FIX = {
    "candidate": "flashinfer_cutlass",
    "flag": "--moe-runner-backend",
    "value": "flashinfer_cutlass",
    "args_patch": {"moe_runner_backend": "flashinfer_cutlass"},
    "ms": 0.41,
    "why": "fastest correct candidate with a sglang value for --moe-runner-backend (rank 1)",
}
TOLERANCE = {"atol": 0.01, "rtol": 0.01, "required_match": 0.95}
REFUSAL = "TRTLLM-Gen MoE: No kernel found for the given options (mDtypeA: MxE2m1) on sm_120"


def _candidate(name: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": name,
        "backend": f"{name} backend",
        "component": "moe",
        "runs": True,
        "status": "PASSED",
        "error": None,
        "max_error": 0.004,
        "matched_ratio": 1.0,
        "checked": True,
        "ms": None,
        "tflops": None,
        "gbps": None,
        "peak_fraction": None,
        "anchor_fraction": None,
        "flag_value": name,
        "tolerance": TOLERANCE,
        "available": True,
        "correct": True,
        "jit": {},
        "rank": None,
    }
    return {**base, **fields}


def worker_result() -> dict[str, Any]:
    """A sweep report as a GPU worker sends it (CONTRACT.md "The backend sweep"): ranked first, then the
    rest; the fastest of all is wrong, one is refused by its library, one built its JIT kernels."""
    candidates = [
        _candidate("flashinfer_cutlass", ms=0.41, tflops=512.3, peak_fraction=0.518, anchor_fraction=0.64,
                   jit={"state": "built", "seconds": 41.2}, rank=1),
        _candidate("triton", ms=0.62, tflops=338.8, peak_fraction=0.342, jit={"state": "cached"}, rank=2),
        _candidate("torch_grouped_mm", ms=0.9, tflops=233.0, peak_fraction=0.236, flag_value=None, rank=3),
        _candidate("flashinfer_cutedsl", ms=0.3, tflops=700.0, peak_fraction=0.7, status="INCORRECT_NUMERICAL",
                   max_error=3.2, matched_ratio=0.12, correct=False),
        _candidate("flashinfer_trtllm", runs=False, status="UNSUPPORTED_ARCH", error=REFUSAL, max_error=None,
                   matched_ratio=None, checked=False, correct=False),
    ]  # fmt: skip
    return {
        "component": "moe",
        "device": "cuda",
        "gpu": "NVIDIA RTX PRO 6000 Blackwell",
        "arch": "sm_120",
        "timing": "CUDA events, median of 50 after 10 warm-ups",
        "tolerance": {"atol": 0.01, "rtol": 0.01},
        "candidates": candidates,
        "proposed_fix": FIX,
        "notes": [],
    }


@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, dict[str, Any], str]]:
    """What would have gone to the broker, the sweep's and the confirm's: (task, kwargs, queue)."""
    messages: list[tuple[str, dict[str, Any], str]] = []

    def record(task: str, kwargs: dict[str, Any], queue: str) -> None:
        messages.append((task, kwargs, queue))

    monkeypatch.setattr(services, "_send", record)
    monkeypatch.setattr(sweep_services, "_send", record)
    return messages


@pytest.fixture
def crash(acme, make_report):
    """The seed case analysed by the core: the draft's MoE crashes in trtllm-gen on sm_120."""
    return make_report(acme, document=copy.deepcopy(_canonical_document()), title="DSv4 EAGLE TP4")


def _done(report: Any, result: dict[str, Any] | None = None) -> SweepRun:
    sweep = sweep_create(report=report, component="moe")
    finished = sweep_finished(
        payload={"sweep_id": sweep.id, "host": "rtx-1", "result": result or worker_result()}
    )
    assert finished is not None
    return finished


def _text(response: Any) -> str:
    return html.unescape(re.sub(r"\s+", " ", response.content.decode()))


def _rows(page: str, table_id: str) -> list[str]:
    table = re.search(rf'<table[^>]*id="{table_id}".*?</table>', page, re.S)
    assert table, f"no table #{table_id}"
    return re.findall(r'<tr class="sweep-\w+" data-candidate="([^"]+)"', table.group(0))


def _row(page: str, name: str) -> str:
    found = re.search(rf'data-candidate="{name}">(.*?)</tr>', page, re.S)
    assert found, f"no row for {name}"
    return re.sub(r"<[^>]+>", " ", found.group(1))


# ---------------------------------------------------------------- the component a crash names


def test_a_moe_runner_crash_preselects_the_moe_sweep_because_its_fix_changes_the_moe_backend():
    guess = sweep_component_for(_canonical_document())
    assert guess.component == "moe" and "--moe-runner-backend" in guess.why


def test_an_attention_diagnosis_preselects_the_attention_sweep():
    document = sample_document(
        matches=[{"id": "fa3-unsupported-on-sm120", "title": "FA3 attention kernels need Hopper", "fix": {}}]
    )
    assert sweep_component_for(document).component == "attention"


def test_a_crash_message_names_the_component_when_no_diagnosis_does():
    document = sample_document(
        matches=[], crash={"exception": "RuntimeError", "message": "fused_moe: bad top_k"}
    )
    assert sweep_component_for(document).component == "moe"
    sampling = sample_document(
        matches=[], crash={"exception": "RuntimeError", "message": "sampler: top_p NaN"}
    )
    assert sweep_component_for(sampling).component == "sampling"


def test_a_crash_that_names_no_component_says_so_instead_of_guessing():
    guess = sweep_component_for(sample_document())  # CUDA out of memory
    assert not guess.guessed and "pick one" in guess.why


# ---------------------------------------------------------------- the report page


def test_the_report_page_offers_the_sweep_with_the_crashing_component_preselected(alice_client, crash):
    page = alice_client.get(reverse("front:report", args=[crash.pk])).content.decode()
    form = re.search(r'<form[^>]*id="sweep-form".*?</form>', page, re.S)
    assert form and reverse("front:sweep_new", args=[crash.pk]) in form.group(0)
    assert re.findall(r'<option value="(\w+)" selected>', form.group(0)) == ["moe"]
    assert "Sweep backends" in form.group(0)


def test_asking_for_a_sweep_from_the_report_queues_it_to_hosts_of_the_reports_arch(
    alice_client, crash, sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = alice_client.post(reverse("front:sweep_new", args=[crash.pk]), {"component": "moe"})
    sweep = SweepRun.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("front:sweep", args=[sweep.pk])
    ((task, kwargs, queue),) = sent
    assert (task, queue, kwargs["job"]["component"]) == ("gpu.sweep", "gpu.sm_120", "moe")


def test_an_unknown_component_is_refused_with_the_choices(alice_client, crash, sent):
    response = alice_client.post(reverse("front:sweep_new", args=[crash.pk]), {"component": "kv-cache"})
    assert response.status_code == 400 and "moe, attention, gemm, sampling" in response.content.decode()
    assert not SweepRun.objects.exists() and sent == []


def test_the_report_page_links_the_latest_sweeps_ranked_summary(alice_client, crash, sent):
    sweep = _done(crash)
    page = alice_client.get(reverse("front:report", args=[crash.pk])).content.decode()
    assert reverse("front:sweep", args=[sweep.pk]) in page
    # the ranked ones only, fastest first: the faster but wrong cutedsl is not in the summary
    assert _rows(page, "sweep-summary") == ["flashinfer_cutlass", "triton", "torch_grouped_mm"]
    assert "--moe-runner-backend flashinfer_cutlass" in _text(
        alice_client.get(reverse("front:report", args=[crash.pk]))
    )


def test_a_viewer_sees_the_latest_sweep_but_no_sweep_form(bob_client, crash, sent):
    _done(crash)
    page = bob_client.get(reverse("front:report", args=[crash.pk])).content.decode()
    assert 'id="sweep-summary"' in page and 'id="sweep-form"' not in page


# ---------------------------------------------------------------- the sweep page


def test_a_queued_sweep_says_it_waits_for_a_host_of_its_arch_and_polls(alice_client, crash, sent):
    sweep = sweep_create(report=crash, component="moe")
    page = _text(alice_client.get(reverse("front:sweep", args=[sweep.pk])))
    assert "Waiting in queue gpu.sm_120: no live host of sm_120" in page
    assert 'hx-trigger="every 2s"' in page and 'id="sweep-candidates"' not in page
    heartbeat("rtx-1")
    page = _text(alice_client.get(reverse("front:sweep", args=[sweep.pk])))
    assert "Queued in gpu.sm_120: a live host of sm_120 takes it" in page


def test_a_sweep_a_host_took_says_it_runs_there_keeps_polling_and_is_not_rewound_by_a_late_start(
    alice_client, crash, sent
):
    sweep = sweep_create(report=crash, component="moe")
    sweep_started(payload={"sweep_id": sweep.pk, "host": "rtx-1"})
    url = reverse("front:sweep_status", args=[sweep.pk])
    page = _text(alice_client.get(reverse("front:sweep", args=[sweep.pk])))
    assert "Running on rtx-1 since" in page and 'hx-trigger="every 2s"' in page
    assert "HX-Redirect" not in alice_client.get(url, headers={"HX-Request": "true"})
    api = alice_client.get(reverse("api:sweep", args=[sweep.pk])).json()
    assert api["status"] == "running" and api["host"] == "rtx-1" and api["started_at"]
    sweep_finished(payload={"sweep_id": sweep.pk, "host": "rtx-1", "result": worker_result()})
    late = sweep_started(payload={"sweep_id": sweep.pk, "host": "rtx-2"})
    assert late is not None and late.status == SweepRun.Status.DONE and late.host_name == "rtx-1"


def test_the_polled_status_sends_the_browser_to_the_page_once_the_sweep_is_done(alice_client, crash, sent):
    sweep = sweep_create(report=crash, component="moe")
    url = reverse("front:sweep_status", args=[sweep.pk])
    assert "HX-Redirect" not in alice_client.get(url, headers={"HX-Request": "true"})
    sweep_finished(payload={"sweep_id": sweep.pk, "host": "rtx-1", "result": worker_result()})
    response = alice_client.get(url, headers={"HX-Request": "true"})
    assert response["HX-Redirect"] == reverse("front:sweep", args=[sweep.pk])


def test_a_failed_sweep_says_why_it_did_not_run(alice_client, crash, sent):
    sweep = sweep_create(report=crash, component="moe")
    sweep_finished(payload={"sweep_id": sweep.pk, "host": "rtx-1", "error": "the worker could not run: OOM"})
    page = _text(alice_client.get(reverse("front:sweep", args=[sweep.pk])))
    assert "The sweep did not run: the worker could not run: OOM" in page and "hx-trigger" not in page


def test_the_table_ranks_correct_candidates_fastest_first_then_the_rest(alice_client, crash, sent):
    sweep = _done(crash)
    page = alice_client.get(reverse("front:sweep", args=[sweep.pk])).content.decode()
    assert _rows(page, "sweep-candidates") == [
        "flashinfer_cutlass", "triton", "torch_grouped_mm", "flashinfer_cutedsl", "flashinfer_trtllm"
    ]  # fmt: skip
    best = " ".join(_row(page, "flashinfer_cutlass").split())
    assert best.startswith("1 flashinfer_cutlass proposed fix")
    for cell in ("yes", "0.004", "atol 0.01, rtol 0.01, 95% of elements", "0.41", "512.3 TFLOP/s", "51.8%",
                 "64.0%", "built in 41 s"):  # fmt: skip
        assert cell in best, f"{cell!r} not in {best!r}"
    assert "cached" in _row(page, "triton")


def test_a_faster_candidate_with_wrong_numbers_is_shown_wrong_and_never_ranked(alice_client, crash, sent):
    sweep = _done(crash)
    wrong = " ".join(_row(html.unescape(alice_client.get(reverse("front:sweep", args=[sweep.pk])).content.decode()),
                          "flashinfer_cutedsl").split())  # fmt: skip
    assert wrong.startswith("— flashinfer_cutedsl") and "wrong numbers no 3.2" in wrong
    assert "proposed fix" not in wrong


def test_a_refused_candidate_shows_its_librarys_own_message(alice_client, crash, sent):
    sweep = _done(crash)
    page = html.unescape(alice_client.get(reverse("front:sweep", args=[sweep.pk])).content.decode())
    refused = " ".join(_row(page, "flashinfer_trtllm").split())
    assert "unsupported arch" in refused and REFUSAL in refused


def test_the_chart_is_one_bar_per_candidate_and_keeps_the_wrong_and_the_refused_apart():
    fig = sweep_figure(worker_result()["candidates"], proposed="flashinfer_cutlass", gpu_name="RTX PRO 6000")
    assert fig is not None
    assert fig["meta"]["labels"] == [
        "flashinfer_cutlass", "triton", "torch_grouped_mm", "flashinfer_cutedsl", "flashinfer_trtllm"
    ]  # fmt: skip
    assert fig["meta"]["verdicts"] == ["proposed", "correct", "correct", "wrong", "absent"]
    traces = {trace["name"]: trace for trace in fig["data"]}
    assert traces["proposed fix"]["x"] == ["flashinfer_cutlass"] and traces["proposed fix"]["y"] == [0.41]
    assert traces["ran, not correct or not checked"]["y"] == [0.3]
    assert traces["did not run here"]["y"] == [0] and traces["did not run here"]["text"] == [
        "unsupported arch"
    ]
    assert "51.8% of datasheet peak" in traces["proposed fix"]["customdata"][0]
    assert "64.0% of the achievable anchor" in traces["proposed fix"]["customdata"][0]
    assert "RTX PRO 6000" in fig["layout"]["yaxis"]["title"]["text"]
    assert sweep_figure([]) is None


def test_the_page_draws_the_chart_from_its_data(alice_client, crash, sent):
    sweep = _done(crash)
    page = alice_client.get(reverse("front:sweep", args=[sweep.pk])).content.decode()
    island = re.search(r'<script id="sweep-fig" type="application/json">(.*?)</script>', page, re.S)
    assert island and json.loads(island.group(1))["meta"]["verdicts"][0] == "proposed"
    assert 'data-figure="sweep-fig"' in page and "plotly-basic.min.js" in page


def test_the_shapes_say_where_each_value_came_from_in_words(alice_client, acme, make_report, sent):
    document = sample_document()
    document["server_args"] = {"dtype": "bfloat16", "tp_size": 4, "moe_runner_backend": "triton"}
    document["model_config"] = {"hidden_size": 4096, "n_routed_experts": 256, "num_experts_per_tok": 6,
                                "num_attention_heads": 32, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64}  # fmt: skip
    sweep = sweep_create(report=make_report(acme, document=document, arch="sm_90"), component="moe")
    page = alice_client.get(reverse("front:sweep", args=[sweep.pk])).content.decode()

    def shape(name: str) -> str:
        found = re.search(rf'<tr class="shape-(\w+)" data-shape="{name}">(.*?)</tr>', page, re.S)
        assert found, name
        return (
            found.group(1) + ": " + " ".join(re.sub(r"<[^>]+>", " ", html.unescape(found.group(2))).split())
        )

    assert shape("tp_size") == "args: tp_size 4 read from the launch's args dump, line 1"
    assert shape("hidden_size") == "config: hidden_size 4096 read from the model config in the log, line 2"
    assert shape("head_dim").startswith(
        "inferred: head_dim 192 inferred: MLA: qk_nope_head_dim + qk_rope_head_dim"
    )
    assert (
        shape("moe_intermediate_size")
        == "default: moe_intermediate_size 2048 default: the log does not say 512"
    )


# ---------------------------------------------------------------- one click: confirm with the proposed fix


def test_the_page_offers_one_button_that_confirms_the_full_launch_with_the_proposed_backend(
    alice_client, crash, sent
):
    sweep = _done(crash)
    page = alice_client.get(reverse("front:sweep", args=[sweep.pk])).content.decode()
    buttons = [b for b in re.findall(r'<button type="submit"[^>]*>(.*?)</button>', page) if b != "Log out"]
    assert buttons == ["Confirm the full launch with --moe-runner-backend flashinfer_cutlass"]
    command = re.search(r'<pre class="wrap" id="proposed-command">(.*?)</pre>', page, re.S)
    assert command and "--moe-runner-backend flashinfer_cutlass" in command.group(1)
    assert "--model-path /models/DeepSeek-V4-Flash-NVFP4" in command.group(1)


def test_one_click_queues_a_confirm_of_the_full_launch_with_the_proposed_patch(
    alice_client, crash, sent, django_capture_on_commit_callbacks
):
    sweep = _done(crash)
    with django_capture_on_commit_callbacks(execute=True):
        response = alice_client.post(reverse("front:sweep_confirm", args=[sweep.pk]))
    confirm = ConfirmRun.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("front:confirm", args=[confirm.pk])
    assert confirm.fix_args == {"moe_runner_backend": "flashinfer_cutlass"} and confirm.fix_env == {}
    args = confirm.args
    at = args.index("--moe-runner-backend")
    assert args[at + 1] == "flashinfer_cutlass" and args.count("--moe-runner-backend") == 1
    # the rest of the launch runs as the log shows it: the model, TP and the speculative decoding
    assert {"--model-path", "--tp", "--speculative-algorithm", "--context-length"} <= set(args)
    ((task, kwargs, queue),) = sent
    assert (task, queue) == ("gpu.confirm", "gpu.sm_120")
    assert "flashinfer_cutlass" in kwargs["job"]["launch"]["args"]


def test_a_sweep_without_a_proposed_fix_has_no_button_and_queues_no_confirm(alice_client, crash, sent):
    result = worker_result()
    result["proposed_fix"] = None
    sweep = _done(crash, result)
    page = alice_client.get(reverse("front:sweep", args=[sweep.pk])).content.decode()
    assert 'id="no-fix"' in page and "Confirm the full launch" not in page
    response = alice_client.post(reverse("front:sweep_confirm", args=[sweep.pk]))
    assert response.status_code == 400 and "proposes no fix" in response.content.decode()
    assert not ConfirmRun.objects.exists() and sent == []


def test_a_viewer_reads_the_sweep_but_cannot_confirm_its_fix(bob_client, crash, sent):
    sweep = _done(crash)
    page = bob_client.get(reverse("front:sweep", args=[sweep.pk])).content.decode()
    assert "Confirm the full launch" not in page and "Viewers cannot start runs" in page
    assert bob_client.post(reverse("front:sweep_confirm", args=[sweep.pk])).status_code == 403
    assert (
        bob_client.post(reverse("front:sweep_new", args=[crash.pk]), {"component": "moe"}).status_code == 403
    )
    assert not ConfirmRun.objects.exists() and SweepRun.objects.count() == 1


def test_it_hides_a_sweep_from_outsiders(charlie_client, crash, sent):
    sweep = _done(crash)
    for name in ("front:sweep", "front:sweep_status"):
        assert charlie_client.get(reverse(name, args=[sweep.pk])).status_code == 404
    assert charlie_client.post(reverse("front:sweep_confirm", args=[sweep.pk])).status_code == 404
    assert (
        charlie_client.post(reverse("front:sweep_new", args=[crash.pk]), {"component": "moe"}).status_code
        == 404
    )
    assert not ConfirmRun.objects.exists() and SweepRun.objects.count() == 1


# ---------------------------------------------------------------- the API


def test_the_api_queues_a_sweep_of_the_component_the_crash_names(
    client, document, alice, acme, crash, sent, django_capture_on_commit_callbacks
):
    _, key = apitoken_create(user=alice, project=acme)
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(f"/api/v1/reports/{crash.pk}/sweep", data="", content_type="application/json",
                             **bearer(key))  # fmt: skip
    body = conforms(document, "/api/v1/reports/{id}/sweep", "post", answer)
    assert answer.status_code == 201
    assert {k: body[k] for k in ("status", "arch", "queue", "component")} == {
        "status": "queued", "arch": "sm_120", "queue": "gpu.sm_120", "component": "moe"
    }  # fmt: skip
    assert [(task, queue) for task, _, queue in sent] == [("gpu.sweep", "gpu.sm_120")]
    sweep_finished(payload={"sweep_id": body["id"], "host": "rtx-1", "result": worker_result()})
    read = conforms(
        document, "/api/v1/sweeps/{id}", "get", client.get(f"/api/v1/sweeps/{body['id']}", **bearer(key))
    )
    assert read["status"] == "done" and read["proposed_fix"] == FIX and read["host"] == "rtx-1"
    assert read["result"]["candidates"][0]["name"] == "flashinfer_cutlass"
    assert read["shapes"]["facts"]["tp_size"]["source"] == "args"


def test_the_api_refuses_an_unknown_component_and_answers_as_documented(
    client, document, alice, acme, crash, sent
):
    _, key = apitoken_create(user=alice, project=acme)
    answer = client.post(f"/api/v1/reports/{crash.pk}/sweep", data=json.dumps({"component": "kv"}),
                         content_type="application/json", **bearer(key))  # fmt: skip
    assert (
        answer.status_code == 400
        and "unknown component" in conforms(document, "/api/v1/reports/{id}/sweep", "post", answer)["error"]
    )
    assert not SweepRun.objects.exists() and sent == []


def test_the_api_lets_viewers_read_and_hides_sweeps_from_outsiders(
    client, acme, umbrella, bob, charlie, crash, sent
):
    sweep = _done(crash)
    _, bob_key = apitoken_create(user=bob, project=acme)
    _, charlie_key = apitoken_create(user=charlie, project=umbrella)
    assert client.get(f"/api/v1/sweeps/{sweep.pk}", **bearer(bob_key)).status_code == 200
    refused = client.post(f"/api/v1/reports/{crash.pk}/sweep", data="{}", content_type="application/json",
                          **bearer(bob_key))  # fmt: skip
    assert refused.status_code == 403
    assert client.get(f"/api/v1/sweeps/{sweep.pk}", **bearer(charlie_key)).status_code == 404
    hidden = client.post(f"/api/v1/reports/{crash.pk}/sweep", data="{}", content_type="application/json",
                         **bearer(charlie_key))  # fmt: skip
    assert hidden.status_code == 404 and SweepRun.objects.count() == 1
