"""Hostile confirms through the real stack (uvicorn + the dashboard's Celery worker + a GPU worker on
this machine's Redis and PostgreSQL): the GPU worker refuses what its policy forbids and the reason
shows on the confirm run; the dashboard refuses a nested patch with a 400 instead of queueing a run
that could never finish."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.pipeline.conftest import ROOT, Stack, _stop, _wait_until
from worker.repro import REPRO_MODELS_DIR

pytestmark = pytest.mark.pipeline

TOY = str(REPRO_MODELS_DIR / "toy-moe")
FINISHED = {"fixed", "still_fails", "garbage", "refused"}
# Stands in for `vllm serve`: had the policy let a launch through, the run would end `still_fails`.
FAKE_VLLM = [sys.executable, "-c", "import sys; print('started', sys.argv[1:]); sys.exit(1)"]


@pytest.fixture(scope="module")
def policy_worker(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("gpu-policy-worker")
    log = folder / "gpu-worker.log"
    name = "policy-" + stack.queue.rsplit("-", 1)[-1]
    env = {
        **stack.env,
        "DISPATCHLAB_WORKER_NAME": name,
        "DISPATCHLAB_WORKER_LAUNCHERS": json.dumps({"vllm": FAKE_VLLM}),
        "DISPATCHLAB_WORKER_TIME_LIMIT": "60",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "worker", "serve"],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_until(lambda: b"ready." in log.read_bytes(), "the GPU worker", 60, log)
        yield name
    finally:
        _stop(process)


@pytest.fixture(scope="module")
def report(stack: Stack) -> dict[str, Any]:
    # A log that names no GPU arch: its confirms go to the plain gpu queue this worker serves.
    created = stack.upload([("plain.log", b"INFO starting\nINFO nothing else happened\n")])
    return stack.wait_finished(created["id"])


def api(stack: Stack, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {stack.token}", "Content-Type": "application/json"}
    return stack.request(method, path, body, headers)


def wait_confirm(stack: Stack, confirm_id: int, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    answer: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status, answer = api(stack, "GET", f"/api/v1/confirms/{confirm_id}")
        assert status == 200, answer
        if answer["status"] in FINISHED:
            return answer
        time.sleep(0.3)
    raise AssertionError(f"confirm {confirm_id} not finished after {timeout}s: {answer}")


@pytest.mark.parametrize(
    ("body", "reasons"),
    [
        (
            {"command": "vllm serve --trust-remote-code attacker/evil-model"},
            ["--trust-remote-code loads code", "model 'attacker/evil-model' is not under"],
        ),
        ({"command": f"vllm serve {TOY} --max-model-len 4096 /etc"}, ["'/etc' is not the value of any flag"]),
        (
            {"command": f"vllm serve {TOY} --worker-extension-cls evil.Ext"},
            ["--worker-extension-cls loads code"],
        ),
        (
            {"command": f"vllm serve {TOY}", "env": {"NCCL_DEBUG_FILE": "/tmp/overwritten"}},
            ["environment variable NCCL_DEBUG_FILE is not in this host's allowlist"],
        ),
    ],
)
def test_the_gpu_worker_refuses_a_hostile_launch_and_the_run_shows_why(
    stack: Stack, policy_worker: str, report: dict[str, Any], body: dict[str, Any], reasons: list[str]
):
    status, created = api(stack, "POST", f"/api/v1/reports/{report['id']}/confirm", json.dumps(body).encode())
    assert status == 201, created
    confirm = wait_confirm(stack, created["id"])
    assert confirm["status"] == "refused", confirm
    assert all(reason in confirm["error"] for reason in reasons), confirm["error"]
    assert confirm["argv"] == [] and confirm["new_report"] is None


def test_an_allowed_launch_through_the_same_worker_runs(
    stack: Stack, policy_worker: str, report: dict[str, Any]
):
    body = json.dumps({"command": f"vllm serve {TOY} --max-model-len 4096"}).encode()
    status, created = api(stack, "POST", f"/api/v1/reports/{report['id']}/confirm", body)
    assert status == 201, created
    confirm = wait_confirm(stack, created["id"], timeout=120)
    assert confirm["status"] == "still_fails", confirm  # the stand-in exits 1 after it started
    assert confirm["argv"][: len(FAKE_VLLM)] == FAKE_VLLM and TOY in confirm["argv"]


@pytest.mark.parametrize("depth", [920, 955])
def test_a_confirm_with_a_deeply_nested_patch_is_refused_with_a_400_and_queues_nothing(
    stack: Stack, report: dict[str, Any], depth: int
):
    before = stack.sql("select count(*) from gpu_confirmrun")[0][0]
    nested = "[" * depth + '"x"' + "]" * depth
    command = json.dumps(f"vllm serve {TOY}")
    body = f'{{"command": {command}, "args": {{"--max-model-len": {nested}}}}}'.encode()
    status, answer = api(stack, "POST", f"/api/v1/reports/{report['id']}/confirm", body)
    assert status == 400, answer
    assert "'args' must be a flat object of flag to value" in answer["error"]
    assert stack.sql("select count(*) from gpu_confirmrun")[0][0] == before
