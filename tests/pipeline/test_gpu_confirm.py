"""Confirm runs through the real message path: gunicorn + the dashboard's Celery worker + a GPU worker
(`python -m worker serve`, here on the CPU) on this machine's Redis and PostgreSQL. A crash from the
repro server is uploaded, confirmed with a fix, and the outcome (fixed / garbage / still fails /
refused) comes back through the broker into a new report parsed by the same core."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.needs import require_torch
from tests.pipeline.conftest import REDIS_URL, ROOT, Stack, _stop, _wait_until
from worker.repro import REPRO_MODELS_DIR

pytestmark = pytest.mark.pipeline


@pytest.fixture(autouse=True)
def _torch() -> None:
    require_torch()


TOY = str(REPRO_MODELS_DIR / "toy-moe")
CRASH_COMMAND = [
    sys.executable,
    "-m",
    "worker.repro",
    "moe-serve",
    "--model-path",
    TOY,
    "--device",
    "cpu",
    "--dtype",
    "float32",
    "--moe-runner-backend",
    "flashinfer_trtllm",
]
FINISHED = {"fixed", "still_fails", "garbage", "refused", "cancelled"}


@pytest.fixture(scope="module")
def gpu_worker(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("gpu-worker")
    log = folder / "gpu-worker.log"
    name = "cpu-" + stack.queue.rsplit("-", 1)[-1]
    env = {
        **stack.env,
        "DISPATCHLAB_WORKER_NAME": name,
        "DISPATCHLAB_WORKER_LAUNCHERS": json.dumps(
            {"repro:moe-serve": [sys.executable, "-m", "worker.repro", "moe-serve"]}
        ),
        "DISPATCHLAB_WORKER_TIME_LIMIT": "180",
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


def api(
    stack: Stack, method: str, path: str, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {stack.token}", "Content-Type": "application/json"}
    return stack.request(method, path, json.dumps(body).encode() if body is not None else None, headers)


def wait_confirm(stack: Stack, confirm_id: int, timeout: float = 150) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    answer: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status, answer = api(stack, "GET", f"/api/v1/confirms/{confirm_id}")
        assert status == 200, answer
        if answer["status"] in FINISHED:
            return answer
        time.sleep(0.3)
    raise AssertionError(
        f"confirm {confirm_id} not finished after {timeout}s: {answer}\n{stack.worker_tail()}"
    )


@pytest.fixture(scope="module")
def crash_report(stack: Stack, gpu_worker: str) -> dict[str, Any]:
    done = subprocess.run(CRASH_COMMAND, cwd=ROOT, capture_output=True, timeout=120, check=False)
    assert done.returncode == 1, done.stdout[-2000:]
    command = " ".join(["python", *CRASH_COMMAND[1:]])
    created = stack.upload([("repro-crash.log", done.stdout + done.stderr)], launch_command=command)
    return stack.wait_finished(created["id"])


def test_the_gpu_worker_announces_itself_with_its_queues(stack: Stack, gpu_worker: str):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        _status, answer = api(stack, "GET", "/api/v1/hosts")
        hosts = {h["name"]: h for h in answer.get("results", [])}
        if gpu_worker in hosts:
            break
        time.sleep(0.3)
    host = hosts[gpu_worker]
    assert host["alive"] is True
    assert stack.env["DISPATCHLAB_GPU_QUEUE"] in host["queues"]
    assert "repro:moe-serve" in host["launchers"]
    assert set(host["versions"]) >= {"sglang", "vllm", "flashinfer", "torch"}


def test_a_crash_confirmed_with_a_working_backend_is_fixed_with_a_report_of_its_own(
    stack: Stack, crash_report
):
    assert crash_report["document"]["outcome"] == "crashed"
    status, created = api(
        stack,
        "POST",
        f"/api/v1/reports/{crash_report['id']}/confirm",
        {"args": {"--moe-runner-backend": "torch"}},
    )
    assert status == 201, created
    assert created["queue"] == stack.env["DISPATCHLAB_GPU_QUEUE"]  # the log names no arch: any host
    confirm = wait_confirm(stack, created["id"])
    assert confirm["status"] == "fixed", confirm
    assert confirm["smoke"]["text"].strip().startswith("Paris.")
    assert {p["concurrency"] for p in confirm["throughput"]} == {1, 4}
    assert all(p["tokens_per_s"] > 0 for p in confirm["throughput"])
    # The stand-in is labelled as one: kernel evidence, kernel steps per second, reference weights.
    assert confirm["evidence"] == "kernel" and confirm["throughput_unit"] == "kernel steps/s"
    assert confirm["evidence_label"].startswith("kernel-level confirm with the moe-serve stand-in")
    assert confirm["launcher"]["how"].startswith("it identified itself in its log")
    assert confirm["weights"]["kind"] == "reference"
    argv = confirm["argv"]
    assert argv[argv.index("--moe-runner-backend") + 1] == "torch"
    new = stack.get(confirm["new_report"])
    assert new["status"] == "done"
    assert new["document"]["outcome"] in ("ready", "serving")
    assert new["document"]["backends"].get("moe_runner_backend") == "torch"


def test_dummy_weights_are_confirmed_as_garbage_with_the_reason(stack: Stack, crash_report):
    status, created = api(
        stack,
        "POST",
        f"/api/v1/reports/{crash_report['id']}/confirm",
        {"args": {"--moe-runner-backend": "torch", "--load-format": "dummy"}},
    )
    assert status == 201, created
    confirm = wait_confirm(stack, created["id"])
    assert confirm["status"] == "garbage", confirm
    assert confirm["error"].startswith("the server answers garbage")


def test_the_unchanged_launch_of_a_diagnosis_without_a_fix_is_refused_with_the_reason(
    stack: Stack, crash_report
):
    status, answer = api(stack, "POST", f"/api/v1/reports/{crash_report['id']}/confirm", {"args": {}})
    assert status == 400, answer
    assert answer["error"].startswith("nothing to confirm: the diagnosis") and "has no fix" in answer["error"]
    assert "backend sweep" in answer["error"] and "edit the launch" in answer["error"]


def test_an_edited_launch_that_keeps_the_crashing_backend_still_fails_and_names_the_new_diagnosis(
    stack: Stack, crash_report
):
    body = {"args": {"--cuda-graph-max-bs": "4"}}
    status, created = api(stack, "POST", f"/api/v1/reports/{crash_report['id']}/confirm", body)
    assert status == 201, created
    confirm = wait_confirm(stack, created["id"])
    assert confirm["status"] == "still_fails", confirm
    assert "exited with status 1 before it was ready" in confirm["error"]
    new = stack.get(confirm["new_report"])
    assert new["document"]["crash"] is not None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"args": {"--turbo": "1"}}, "unknown flag --turbo for repro:moe-serve"),
        ({"args": {"--model-path": "/etc"}}, "model '/etc' is not under this host's model roots"),
        (
            {"args": {"--moe-runner-backend": "torch"}, "env": {"LD_PRELOAD": "/tmp/x.so"}},
            "environment variable LD_PRELOAD is not in this host's allowlist",
        ),
    ],
)
def test_the_worker_refuses_what_its_policy_forbids_and_runs_nothing(
    stack: Stack, crash_report, body, message
):
    status, created = api(stack, "POST", f"/api/v1/reports/{crash_report['id']}/confirm", body)
    assert status == 201, created
    confirm = wait_confirm(stack, created["id"], timeout=60)
    assert confirm["status"] == "refused" and message in confirm["error"]
    assert confirm["new_report"] is None and confirm["argv"] == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"command": "bash -c 'python -m worker.repro moe-serve'"}, "is not a launcher dispatchlab runs"),
        ({"args": {"--model-path": TOY + ";reboot"}}, "shell metacharacter ';'"),
    ],
)
def test_the_dashboard_refuses_a_program_or_shell_syntax_before_queueing(
    stack: Stack, crash_report, body, message
):
    status, answer = api(stack, "POST", f"/api/v1/reports/{crash_report['id']}/confirm", body)
    assert status == 400 and message in answer["error"]


def test_a_job_for_an_arch_without_a_live_host_waits_in_its_queue(stack: Stack, gpu_worker: str):
    import redis

    seed = (ROOT / "tests" / "fixtures" / "logs" / "sglang_dsv4_eagle_sm120.log").read_bytes()
    report = stack.wait_finished(stack.upload([("sm120.log", seed)])["id"])
    assert report["document"]["gpu"]["arch"] == "sm_120"
    status, created = api(stack, "POST", f"/api/v1/reports/{report['id']}/confirm", {})
    assert status == 201 and created["status"] == "waiting_for_host"
    queue = f"{stack.env['DISPATCHLAB_GPU_QUEUE']}.sm_120"
    assert created["queue"] == queue
    client = redis.Redis.from_url(REDIS_URL)
    deadline = time.monotonic() + 10
    while client.llen(queue) < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2)  # a CPU worker on the plain gpu queue must not take it
    assert client.llen(queue) == 1
    _, again = api(stack, "GET", f"/api/v1/confirms/{created['id']}")
    assert again["status"] == "waiting_for_host"


def test_a_running_confirm_cancelled_through_the_api_stops_on_the_worker(stack: Stack, crash_report):
    status, created = api(
        stack,
        "POST",
        f"/api/v1/reports/{crash_report['id']}/confirm",
        {"args": {"--moe-runner-backend": "torch", "--random-seed": "8675309"}},
    )
    assert status == 201, created
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        _, answer = api(stack, "GET", f"/api/v1/confirms/{created['id']}")
        if answer["status"] != "queued" and answer["status"] != "waiting_for_host":
            break
        time.sleep(0.2)
    assert answer["status"] == "running", answer
    status, cancelled = api(stack, "POST", f"/api/v1/confirms/{created['id']}/cancel")
    assert status == 200 and cancelled["status"] == "cancelled", cancelled

    def gone() -> bool:
        for path in _cmdlines():
            try:
                if b"8675309" in path.read_bytes():
                    return False
            except OSError:
                continue
        return True

    deadline = time.monotonic() + 30
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert gone(), "the cancelled launch's processes are still running"


def _cmdlines() -> list[Any]:
    from pathlib import Path

    return [entry / "cmdline" for entry in Path("/proc").iterdir() if entry.name.isdigit()]
