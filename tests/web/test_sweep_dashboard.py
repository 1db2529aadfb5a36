"""The backend sweep on the dashboard's side: what is queued where, and how the worker's answer is kept."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.files.base import ContentFile

from dispatchlab.gpu import sweep_services
from dispatchlab.gpu.models import SweepRun
from dispatchlab.gpu.sweep_services import SweepRejected, sweep_create, sweep_finished
from dispatchlab.reports.models import ReportFile
from tests.web.conftest import sample_document


@pytest.fixture
def sent(monkeypatch: Any) -> list[tuple[str, dict[str, Any], str]]:
    messages: list[tuple[str, dict[str, Any], str]] = []
    monkeypatch.setattr(
        sweep_services, "_send", lambda task, kwargs, queue: messages.append((task, kwargs, queue))
    )
    return messages


def _crash(acme: Any, make_report: Any) -> Any:
    document = sample_document()
    document["server_args"] = {
        "dtype": "bfloat16",
        "tp_size": 4,
        "quantization": None,
        "moe_runner_backend": "triton",
    }
    return make_report(acme, document=document, arch="sm_90")


def test_a_sweep_is_queued_to_hosts_of_the_reports_arch_with_the_shapes_it_read(
    acme, alice, make_report, sent, django_capture_on_commit_callbacks
):
    report = _crash(acme, make_report)
    with django_capture_on_commit_callbacks(execute=True):
        sweep = sweep_create(report=report, component="moe", user=alice)
    ((task, kwargs, queue),) = sent
    assert (task, queue) == ("gpu.sweep", "gpu.sm_90")
    job = kwargs["job"]
    assert job["sweep_id"] == sweep.id and job["component"] == "moe"
    facts = job["shapes"]["facts"]
    assert facts["tp_size"] == {"value": 4, "source": "args", "line": 1, "note": ""}
    # the document holds no model config: the sizes are defaults, and say so
    assert facts["hidden_size"]["source"] == "default"
    assert "hidden_size" in sweep.shapes["defaulted"]


def test_an_unknown_component_is_refused_before_anything_is_queued(acme, make_report, sent):
    with pytest.raises(SweepRejected, match="unknown component"):
        sweep_create(report=_crash(acme, make_report), component="kv-cache")
    assert sent == [] and not SweepRun.objects.exists()


def test_the_workers_answer_is_stored_once_with_its_proposed_fix(acme, make_report, sent):
    sweep = sweep_create(report=_crash(acme, make_report), component="attention")
    fix = {"flag": "--attention-backend", "value": "fa3", "candidate": "x"}
    sweep_finished(
        payload={"sweep_id": sweep.id, "host": "h200-1", "result": {"proposed_fix": fix, "candidates": []}}
    )
    again = sweep_finished(payload={"sweep_id": sweep.id, "host": "other", "error": "late duplicate"})
    assert again is not None
    assert again.status == SweepRun.Status.DONE and again.host_name == "h200-1"
    assert again.proposed_fix == fix and again.error == ""


def test_a_sweep_the_worker_could_not_run_is_failed_with_its_reason(acme, make_report, sent):
    sweep = sweep_create(report=_crash(acme, make_report), component="moe")
    done = sweep_finished(
        payload={"sweep_id": sweep.id, "host": "h", "error": "the worker could not run the sweep: X"}
    )
    assert done is not None and done.status == SweepRun.Status.FAILED and "could not run" in done.error


def test_the_sweep_runs_at_the_sizes_the_logs_model_config_prints_with_the_line_it_read(
    acme, make_report, sent
):
    report = _crash(acme, make_report)
    log = (
        "[2026-12-01 19:02:10] server_args=ServerArgs(model_path='/models/toy-moe', tp_size=1, "
        "moe_runner_backend='flashinfer_trtllm', dtype='float32')\n"
        "[2026-12-01 19:02:11] Load weight begin. avail mem=0.00 GB\n"
        '[2026-12-01 19:02:11] Model config: {"hidden_size": 1024, "moe_intermediate_size": 512, '
        '"num_experts": 8, "num_experts_per_tok": 2}\n'
    )
    stored = ReportFile(report=report, original_name="crash.log", size=len(log), position=0)
    stored.file.save("crash.log", ContentFile(log.encode()), save=True)
    sweep = sweep_create(report=report, component="moe")
    facts = sweep.shapes["facts"]
    assert facts["hidden_size"] == {"value": 1024, "source": "config", "line": 3, "note": ""}
    assert facts["num_experts"]["value"] == 8 and facts["top_k"]["value"] == 2
    assert facts["dtype"] == {"value": "float32", "source": "args", "line": 1, "note": ""}
    assert "hidden_size" not in sweep.shapes["defaulted"]
