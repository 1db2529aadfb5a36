"""The GPU side of the JSON API: hosts, queueing a confirm run of a report's fixed launch, reading it."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from dispatchlab.gpu import services
from dispatchlab.gpu.models import ConfirmRun
from dispatchlab.gpu.services import host_heartbeat
from dispatchlab.messaging.contract import CONFIRM_TASK
from dispatchlab.reports.services import apitoken_create
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
    assert launch["env"] == {"NCCL_DEBUG": "INFO"}


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
