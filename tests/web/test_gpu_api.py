"""The GPU side of the JSON API: hosts, queueing a confirm run of a report's fixed launch, reading it."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from dispatchlab.gpu import confirm_outcomes, services
from dispatchlab.gpu.models import ConfirmRun
from dispatchlab.gpu.services import host_heartbeat
from dispatchlab.messaging.contract import CONFIRM_TASK
from dispatchlab.reports.accounts import apitoken_create
from tests.web.test_gpu_pages import _canonical_document


def bearer(key: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


@pytest.fixture
def alice_key(alice, acme) -> str:
    return apitoken_create(user=alice, project=acme)[1]


@pytest.fixture
def charlie_key(charlie, umbrella) -> str:
    return apitoken_create(user=charlie, project=umbrella)[1]


@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, dict[str, Any], str]]:
    """What would have gone to the broker: (task, kwargs, queue)."""
    messages: list[tuple[str, dict[str, Any], str]] = []
    monkeypatch.setattr(services, "_send", lambda task, kwargs, queue: messages.append((task, kwargs, queue)))
    return messages


@pytest.fixture
def crash(acme, make_report):
    return make_report(acme, document=copy.deepcopy(_canonical_document()), title="DSv4 EAGLE TP4")


def confirm(client: Any, report_id: int, key: str, body: Any) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body)
    return client.post(
        f"/api/v1/reports/{report_id}/confirm", data=data, content_type="application/json", **bearer(key)
    )


def test_the_hosts_need_credentials_and_list_alive_hosts_with_their_gpus(client, alice_key):
    assert client.get("/api/v1/hosts").status_code == 401
    host_heartbeat(payload={
        "host": "rtx-box", "queues": ["gpu", "gpu.sm_120"], "launchers": ["sglang"], "model_roots": ["/models"],
        "inventory": {"gpus": [{"name": "NVIDIA RTX PRO 6000", "arch": "sm_120", "memory_mib": 97887}],
                      "versions": {"sglang": "0.5.23", "vllm": None}},
    })  # fmt: skip
    (host,) = client.get("/api/v1/hosts", **bearer(alice_key)).json()["results"]
    assert host["name"] == "rtx-box" and host["alive"] is True
    assert host["gpus"] == [{"name": "NVIDIA RTX PRO 6000", "arch": "sm_120", "memory_mib": 97887}]
    assert host["versions"]["vllm"] is None


def test_a_confirm_waits_for_a_host_of_the_reports_arch_with_the_fixed_launch(
    client, crash, alice_key, sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):  # the job is sent once the row is committed
        answer = confirm(client, crash.id, alice_key, {})
    assert answer.status_code == 201
    created = answer.json()
    assert created["status"] == "waiting_for_host" and created["arch"] == "sm_120"
    assert created["queue"] == "gpu.sm_120"
    args = created["launch"]["args"]
    assert args[args.index("--moe-runner-backend") + 1] == "flashinfer_cutlass"
    assert "--speculative-algorithm" not in args
    ((task, kwargs, queue),) = sent
    assert task == CONFIRM_TASK and queue == "gpu.sm_120" and kwargs["job"]["launch"]["args"] == args
    detail = client.get(f"/api/v1/confirms/{created['id']}", **bearer(alice_key)).json()
    assert detail["status"] == "waiting_for_host" and detail["launch"]["args"] == args
    assert detail["new_report"] is None and detail["probes"] == []


def test_the_body_may_replace_the_fix_patch(client, crash, alice_key, sent):
    answer = confirm(
        client,
        crash.id,
        alice_key,
        {"args": {"--moe-runner-backend": "triton"}, "env": {"NCCL_DEBUG": "INFO"}},
    )
    launch = answer.json()["launch"]
    assert launch["args"][launch["args"].index("--moe-runner-backend") + 1] == "triton"
    assert "--speculative-algorithm" in launch["args"]  # the fix's other half was not asked for
    # The log's own environment prefix stays; the body's variables are added to it.
    assert launch["env"] == {"SGLANG_SM120_MMA_FLASHMLA": "1", "NCCL_DEBUG": "INFO"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "the body is not JSON"),
        ([], "the body must be a JSON object"),
        ({"args": "--tp 2"}, "'args' must be an object"),
        ({"command": "bash -c 'sglang serve'"}, "is not a launcher dispatchlab runs"),
        ({"args": {"--model-path": "/m && reboot"}}, "shell metacharacter '&'"),
        ({"probes": "moe"}, "'probes' must be a list"),
    ],
)
def test_a_bad_request_is_a_json_error_and_queues_nothing(client, crash, alice_key, sent, body, message):
    answer = confirm(client, crash.id, alice_key, body)
    assert answer.status_code == 400 and message in answer.json()["error"]
    assert sent == [] and not ConfirmRun.objects.exists()


def test_an_outsider_cannot_confirm_or_read_anothers_report(client, crash, alice_key, charlie_key, sent):
    assert confirm(client, crash.id, charlie_key, {}).status_code == 404
    created = confirm(client, crash.id, alice_key, {}).json()
    assert client.get(f"/api/v1/confirms/{created['id']}", **bearer(charlie_key)).status_code == 404


def test_a_read_only_token_cannot_start_a_run(client, crash, alice, acme, sent):
    key = apitoken_create(user=alice, project=acme, read_only=True)[1]
    assert confirm(client, crash.id, key, {}).status_code == 403
    assert sent == []


def nested(depth: int, leaf: str = '"x"') -> str:
    return "[" * depth + leaf + "]" * depth


@pytest.mark.parametrize("depth", [2, 920, 955])
@pytest.mark.parametrize(
    ("template", "message"),
    [
        ('{{"args": {{"--moe-runner-backend": {}}}}}', "'args' must be a flat object of flag to value"),
        ('{{"args": {{"--speculative-config": {{"model": {}}}}}}}', "'args' must be a flat object of flag to value"),
        ('{{"env": {{"NCCL_DEBUG": {}}}}}', "'env' must be a flat map of variable names to strings"),
    ],
)  # fmt: skip
def test_nested_args_or_env_are_refused_naming_the_problem(
    client, crash, alice_key, sent, depth, template, message
):
    answer = confirm(client, crash.id, alice_key, template.format(nested(depth)).encode())
    assert answer.status_code == 400, answer.content[:200]
    assert message in answer.json()["error"]
    assert sent == [] and not ConfirmRun.objects.exists()


# ---------------------------------------------------------------- evidence says what ran (issue 18)

H200 = {"gpus": [{"name": "NVIDIA H200", "arch": "sm_90"}], "versions": {"sglang": "0.5.23"}}


def _finished_confirm(
    crash: Any, make_report: Any, make_document: Any, *, launcher: str, result: dict[str, Any]
):
    """A confirm of `crash` whose output report has just parsed healthy, its smoke answered sensibly."""
    from dispatchlab.gpu.confirm_outcomes import confirm_report_parsed
    from dispatchlab.reports.models import FailureGroup

    crash.group = FailureGroup.objects.create(project=crash.project, fingerprint="f" * 16, title="crash")
    crash.save(update_fields=["group"])
    output = make_report(
        crash.project, document=make_document(matches=[], failure_class="none", crash=None, outcome="serving")
    )
    ConfirmRun.objects.create(
        project=crash.project,
        report=crash,
        status=ConfirmRun.Status.PARSING,
        queue="gpu.sm_90",
        arch="sm_90",
        launcher=launcher,
        signature_id="trtllm-gen-moe-module-refused-on-hopper",
        result={
            "ready": True,
            "smoke": {"text": "Paris", "garbage": {"garbage": False}},
            "inventory": H200,
            "throughput": [{"concurrency": 1, "tokens_per_s": 40.0}],
            **result,
        },
        result_report=output,
    )
    return confirm_report_parsed(report_id=output.id)


STAND_IN = {
    "launcher_identity": {"kind": "stand-in", "name": "repro:moe-serve", "label": "the moe-serve stand-in",
                          "version": None, "how": "it identified itself in its log", "inferred": False},
    "weights": {"kind": "reference", "how": "the repro's own seeded reference weights", "inferred": False},
}  # fmt: skip


def test_a_stand_in_confirm_is_labelled_kernel_evidence_in_the_api_and_never_closes_the_group(
    client, crash, alice_key, make_report, make_document
):
    from dispatchlab.notify.models import GroupClosure

    run = _finished_confirm(crash, make_report, make_document, launcher="repro:moe-serve", result=STAND_IN)
    assert run.status == ConfirmRun.Status.FIXED
    assert not GroupClosure.objects.filter(group=crash.group, closed_at__isnull=False).exists()
    detail = client.get(f"/api/v1/confirms/{run.id}", **bearer(alice_key)).json()
    assert detail["evidence"] == "kernel" and detail["throughput_unit"] == "kernel steps/s"
    assert detail["evidence_label"] == (
        "kernel-level confirm with the moe-serve stand-in on NVIDIA H200 sm_90 (reference weights)"
    )
    assert detail["launcher"]["kind"] == "stand-in" and detail["weights"]["kind"] == "reference"
    assert detail["cancel_url"] is None  # finished
    (confirmation,) = client.get(
        "/api/v1/signatures/trtllm-gen-moe-module-refused-on-hopper", **bearer(alice_key)
    ).json()["confirmations"]
    assert confirmation["evidence"] == "kernel" and confirmation["server"] == ""
    assert confirmation["label"].startswith(
        "kernel path works: kernel-level confirm with the moe-serve stand-in on NVIDIA H200 sm_90"
    )
    assert "confirmed on" not in confirmation["label"]


def test_a_server_confirm_names_the_server_as_it_identified_itself_and_closes_the_group(
    client, crash, alice_key, make_report, make_document
):
    from dispatchlab.notify.models import GroupClosure

    identity = {"kind": "server", "name": "sglang", "label": "sglang 0.5.24", "version": "0.5.24",
                "how": "reported by the server at /get_server_info", "inferred": False}  # fmt: skip
    weights = {"kind": "real", "how": "inferred: no --load-format dummy", "inferred": True}
    run = _finished_confirm(
        crash,
        make_report,
        make_document,
        launcher="sglang",
        result={"launcher_identity": identity, "weights": weights},
    )
    assert GroupClosure.objects.get(group=crash.group).closed_kind == "fix_confirmed"
    detail = client.get(f"/api/v1/confirms/{run.id}", **bearer(alice_key)).json()
    assert detail["evidence"] == "server" and detail["throughput_unit"] == "tokens/s"
    assert (
        detail["evidence_label"]
        == "server confirm with sglang 0.5.24 on NVIDIA H200 sm_90 (real weights, inferred)"
    )
    (confirmation,) = client.get(
        "/api/v1/signatures/trtllm-gen-moe-module-refused-on-hopper", **bearer(alice_key)
    ).json()["confirmations"]
    assert confirmation["label"].startswith("confirmed on NVIDIA H200 sm_90, sglang 0.5.24")


def test_a_confirm_of_a_diagnosis_without_a_fix_is_refused_with_the_reason(
    client, acme, alice_key, make_report, sent
):
    document = copy.deepcopy(_canonical_document())
    for match in document["matches"]:
        match["fix"] = {}
    report = make_report(acme, document=document)
    answer = confirm(client, report.id, alice_key, {})
    assert answer.status_code == 400
    reason = answer.json()["error"]
    assert reason.startswith("nothing to confirm:") and "has no fix" in reason
    assert "python -m worker sweep" in reason and "edit the launch" in reason
    assert sent == [] and not ConfirmRun.objects.exists()
    # an edited launch is a different question: it is queued
    edited = confirm(client, report.id, alice_key, {"args": {"--moe-runner-backend": "flashinfer_cutlass"}})
    assert edited.status_code == 201


def test_a_second_confirm_of_the_same_launch_while_one_waits_joins_it(client, crash, alice_key, sent):
    first = confirm(client, crash.id, alice_key, {})
    second = confirm(client, crash.id, alice_key, {})
    assert first.status_code == 201 and first.json()["joined"] is False
    assert second.status_code == 201 and second.json()["joined"] is True
    assert second.json()["id"] == first.json()["id"] and ConfirmRun.objects.count() == 1
    other = confirm(client, crash.id, alice_key, {"args": {"--moe-runner-backend": "triton"}})
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]


def test_a_waiting_confirm_can_be_cancelled_and_the_worker_is_told(
    client, crash, alice_key, monkeypatch, sent, django_capture_on_commit_callbacks
):
    told: list[int] = []
    monkeypatch.setattr(services, "_send_cancel", told.append)
    created = confirm(client, crash.id, alice_key, {}).json()
    detail = client.get(f"/api/v1/confirms/{created['id']}", **bearer(alice_key)).json()
    assert detail["cancel_url"].endswith(f"/api/v1/confirms/{created['id']}/cancel")
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(f"/api/v1/confirms/{created['id']}/cancel", **bearer(alice_key))
    assert answer.status_code == 200 and answer.json()["status"] == "cancelled"
    assert "cancelled while waiting for a host" in answer.json()["error"]
    assert told == [created["id"]]
    again = client.post(f"/api/v1/confirms/{created['id']}/cancel", **bearer(alice_key))
    assert again.status_code == 400 and "only a waiting, queued or running confirm" in again.json()["error"]
    # the worker's late answer does not undo the cancel
    confirm_outcomes.confirm_finished(
        payload={"confirm_id": created["id"], "status": "cancelled", "host": "h"}
    )
    assert ConfirmRun.objects.get(id=created["id"]).status == "cancelled"


def test_an_outsider_cannot_cancel_anothers_confirm(client, crash, alice_key, charlie_key, sent):
    created = confirm(client, crash.id, alice_key, {}).json()
    answer = client.post(f"/api/v1/confirms/{created['id']}/cancel", **bearer(charlie_key))
    assert answer.status_code == 404 and ConfirmRun.objects.get(id=created["id"]).status == "waiting_for_host"
