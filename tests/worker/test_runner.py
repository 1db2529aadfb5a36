"""A confirm job run for real on this CPU: the repro server started as an argument list in its own
process group, its output streamed in numbered pieces, readiness, the smoke answer judged, throughput,
and the whole group gone afterwards. The messages it sends are captured instead of going to a broker."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import pytest

from dispatchlab.messaging.contract import (
    CONFIRM_FINISHED_TASK,
    CONFIRM_OUTPUT_TASK,
    CONFIRM_STARTED_TASK,
)
from tests.needs import require_torch
from worker.config import WorkerConfig
from worker.repro import REPRO_MODELS_DIR
from worker.runner import run_confirm


@pytest.fixture(autouse=True)
def _torch() -> None:
    require_torch()


TOY = str(REPRO_MODELS_DIR / "toy-moe")


@pytest.fixture
def config() -> WorkerConfig:
    return WorkerConfig(
        host="cpu-test",
        launchers={"repro:moe-serve": [sys.executable, "-m", "worker.repro", "moe-serve"]},
        model_roots=(REPRO_MODELS_DIR.resolve(),),
        time_limit_s=120,
    )


def job(*args: str, probes: list[str] | None = None) -> dict[str, Any]:
    return {
        "confirm_id": 7,
        "report_id": 3,
        "launch": {"launcher": "repro:moe-serve", "args": list(args), "env": {"OMP_NUM_THREADS": "1"}},
        "server": "unknown",
        "arch": None,
        "time_limit_s": 120,
        "ready_timeout_s": 90,
        "smoke_prompt": "The capital of France is",
        "concurrency": 2,
        "probes": probes or [],
        "model_shapes": {},
    }


def run(config: WorkerConfig, *args: str) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    sent: list[tuple[str, dict[str, Any]]] = []
    outcome = run_confirm(
        job(*args), config, lambda task, payload: sent.append((task, payload)), inventory={}
    )
    return dict(outcome), sent


def output(sent: list[tuple[str, dict[str, Any]]]) -> str:
    pieces = [p for task, p in sent if task == CONFIRM_OUTPUT_TASK]
    assert [p["seq"] for p in pieces] == list(range(len(pieces)))
    return "".join(p["text"] for p in pieces)


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if marker.encode() in handle.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_a_working_backend_comes_up_answers_sensibly_and_is_measured(config):
    outcome, sent = run(
        config,
        "--model-path",
        TOY,
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--moe-runner-backend",
        "torch",
        "--port",
        "1",
        "--random-seed",
        "987123",
    )
    assert sent[0][0] == CONFIRM_STARTED_TASK and sent[-1][0] == CONFIRM_FINISHED_TASK
    assert outcome["ready"] is True and "health URL /health" in outcome["ready_by"]
    assert "after log line" in outcome["ready_by"]
    # The worker binds the server to a port of its own choosing, not the one in the launch.
    argv = outcome["argv"]
    assert argv[argv.index("--port") + 1] != "1" and argv[argv.index("--host") + 1] == "127.0.0.1"
    smoke = outcome["smoke"]
    assert smoke["text"].strip().startswith("Paris.") and not smoke["garbage"]["garbage"]
    levels = {point["concurrency"]: point for point in outcome["throughput"]}
    assert set(levels) == {1, 2} and all(p["tokens_per_s"] > 0 and not p["errors"] for p in levels.values())
    log = output(sent)
    assert "Use torch as MoE runner backend." in log and "Decode batch." in log
    assert outcome["output_pieces"] == len([1 for task, _ in sent if task == CONFIRM_OUTPUT_TASK])
    assert outcome["stopped_by"] == "dispatchlab after the checks"
    assert processes_with("987123") == []  # the server's whole process group is gone
    # What ran, said plainly: the stand-in as its log named itself, its own reference weights.
    identity = outcome["launcher_identity"]
    assert identity["kind"] == "stand-in" and identity["label"] == "the moe-serve stand-in"
    assert identity["how"].startswith("it identified itself in its log: ") and not identity["inferred"]
    assert outcome["weights"]["kind"] == "reference" and outcome["throughput_unit"] == "kernel steps/s"
    assert outcome["host_identity"]["name"] == "cpu-test"


def test_dummy_weights_serve_noise_that_the_garbage_check_names(config):
    outcome, _ = run(
        config,
        "--model-path",
        TOY,
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--moe-runner-backend",
        "torch",
        "--load-format",
        "dummy",
    )
    assert outcome["ready"] is True
    verdict = outcome["smoke"]["garbage"]
    assert verdict["garbage"] is True and verdict["reason"]
    assert outcome["weights"] == {
        "kind": "dummy",
        "how": "--load-format dummy (random weights)",
        "inferred": False,
    }


def test_a_backend_that_cannot_load_crashes_before_ready_with_its_traceback_in_the_output(config):
    outcome, sent = run(
        config, "--model-path", TOY, "--device", "cpu", "--moe-runner-backend", "flashinfer_trtllm"
    )
    assert outcome["ready"] is False and outcome["exit_code"] == 1
    assert outcome["stopped_by"] == "exited with status 1 before it was ready"
    log = output(sent)
    assert "Traceback (most recent call last)" in log and "Capture cuda graph begin" in log
    assert outcome["smoke"] is None and outcome["throughput"] == []


def test_a_refused_launch_runs_nothing_and_says_why(config):
    outcome, sent = run(config, "--model-path", "/etc", "--device", "cpu")
    assert outcome["status"] == "refused" and "not under this host's model roots" in outcome["error"]
    assert [task for task, _ in sent] == [CONFIRM_FINISHED_TASK]


def test_a_launch_that_never_becomes_ready_is_stopped_with_its_whole_process_group(config):
    # A server that never opens its port, with a child of its own: both must be gone afterwards.
    never_ready = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', *sys.argv[1:]]); "
        "time.sleep(120)"
    )
    slow = WorkerConfig(
        **{
            **config.__dict__,
            "time_limit_s": 10,
            "launchers": {"repro:moe-serve": [sys.executable, "-c", never_ready]},
        }
    )
    started = time.monotonic()
    sent: list[tuple[str, dict[str, Any]]] = []
    spec = job("--model-path", TOY, "--device", "cpu", "--moe-runner-backend", "torch")
    spec["ready_timeout_s"] = 1
    outcome = run_confirm(spec, slow, lambda task, payload: sent.append((task, payload)), inventory={})
    assert outcome["ready"] is False and "was not ready after 1 s" in outcome["stopped_by"]
    assert time.monotonic() - started < 30
    assert processes_with(TOY) == []


OFFLINE_WITHOUT_CUBINS = {
    "flashinfer_artifacts": {
        "state": "missing_artifacts",
        "available": False,
        "reason": "no flashinfer-cubin package; edge.urm.nvidia.com:443 unreachable",
        "fix": "pip install flashinfer-cubin==0.6.1",
    }
}


def test_a_confirm_needing_downloaded_kernels_on_a_host_without_them_answers_at_once_with_the_fix(config):
    sent: list[tuple[str, dict[str, Any]]] = []
    spec = job("--model-path", TOY, "--device", "cpu", "--moe-runner-backend", "flashinfer_trtllm")
    started = time.monotonic()
    outcome = run_confirm(
        spec, config, lambda task, payload: sent.append((task, payload)), inventory=OFFLINE_WITHOUT_CUBINS
    )
    assert time.monotonic() - started < 5
    assert outcome["status"] == "refused" and outcome["missing_artifacts"] is True
    assert outcome["error"].startswith("missing_artifacts: --moe-runner-backend flashinfer_trtllm needs")
    assert "pip install flashinfer-cubin==0.6.1" in outcome["error"]
    assert [task for task, _ in sent] == [CONFIRM_FINISHED_TASK]  # nothing was started


def test_a_backend_that_downloads_nothing_runs_on_that_same_offline_host(config):
    outcome = run_confirm(
        job("--model-path", TOY, "--device", "cpu", "--moe-runner-backend", "torch"),
        config,
        lambda task, payload: None,
        inventory=OFFLINE_WITHOUT_CUBINS,
    )
    assert outcome["ready"] is True and "missing_artifacts" not in outcome


def test_the_server_sees_the_workers_own_gpu_selection_and_nothing_a_launch_chose(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    show_env = "import os, sys; print('GPUS=' + os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')); sys.exit(3)"
    config = WorkerConfig(
        host="cpu-test",
        launchers={"repro:moe-serve": [sys.executable, "-c", show_env]},
        model_roots=(REPRO_MODELS_DIR.resolve(),),
        time_limit_s=30,
    )
    outcome, sent = run(config, "--model-path", TOY)
    assert "GPUS=5" in output(sent)
    assert outcome["exit_code"] == 3


@pytest.mark.parametrize(
    "broken",
    [
        {"launch": None},
        {"launch": ["repro:moe-serve"]},
        {"launch": {"launcher": "repro:moe-serve", "args": [["--model-path"]], "env": {}}},
        {"time_limit_s": "half an hour"},
        {"concurrency": {"deep": [[[]]]}},
    ],
)
def test_a_job_the_worker_cannot_read_is_answered_refused_and_nothing_runs(config, broken):
    sent: list[tuple[str, dict[str, Any]]] = []
    outcome = run_confirm(
        {**job("--model-path", TOY), **broken}, config, lambda t, p: sent.append((t, p)), inventory={}
    )
    assert outcome["status"] == "refused"
    assert [task for task, _ in sent] == [CONFIRM_FINISHED_TASK]
    assert sent[0][1]["status"] == "refused" and sent[0][1]["error"]


def test_a_job_that_breaks_the_worker_still_ends_with_a_terminal_status(monkeypatch):
    import worker.app
    import worker.runner

    sent: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(worker.app, "send_to_dashboard", lambda task, payload: sent.append((task, payload)))
    monkeypatch.setitem(
        worker.app.state, "config", WorkerConfig(host="cpu-test", launchers={}, model_roots=())
    )

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(worker.runner, "run_confirm", broken)
    with pytest.raises(RecursionError):
        worker.app.confirm_task.run({"confirm_id": 11})
    ((task, payload),) = sent
    assert task == CONFIRM_FINISHED_TASK and payload["confirm_id"] == 11 and payload["status"] == "refused"
    assert "RecursionError" in payload["error"]


def test_a_cancel_while_the_launch_runs_stops_its_whole_process_group(config):
    asked: list[float] = []

    def cancelled() -> bool:
        asked.append(time.monotonic())
        return len(asked) >= 2  # the second look (a second in) finds the cancel

    sent: list[tuple[str, dict[str, Any]]] = []
    started = time.monotonic()
    outcome = run_confirm(
        job("--model-path", TOY, "--device", "cpu", "--dtype", "float32", "--moe-runner-backend", "torch",
            "--random-seed", "456789"),
        config,
        lambda task, payload: sent.append((task, payload)),
        inventory={},
        cancelled=cancelled,
    )  # fmt: skip
    assert outcome["status"] == "cancelled" and "process group was stopped" in outcome["error"]
    assert time.monotonic() - started < 30
    assert sent[-1][0] == CONFIRM_FINISHED_TASK and sent[-1][1]["status"] == "cancelled"
    assert processes_with("456789") == []


def test_a_job_cancelled_before_it_starts_runs_nothing(config):
    sent: list[tuple[str, dict[str, Any]]] = []
    result = run_confirm(
        job("--model-path", TOY, "--device", "cpu"),
        config,
        lambda task, payload: sent.append((task, payload)),
        inventory={},
        cancelled=lambda: True,
    )
    assert result["status"] == "cancelled" and result["error"] == "cancelled before it started"
    assert [task for task, _ in sent] == [CONFIRM_FINISHED_TASK]


@pytest.mark.parametrize(
    ("launcher", "args", "kind", "how"),
    [
        ("sglang", ["--model-path", "/models/m", "--load-format", "dummy"], "dummy", "--load-format dummy"),
        ("sglang", ["--model-path", "/models/m"], "real", "inferred: no --load-format dummy, weights read from /models/m"),
        ("vllm", ["/models/m"], "real", "inferred: no --load-format dummy, weights read from /models/m"),
        ("repro:moe-serve", ["--model-path", "/x"], "reference", "the repro's default --load-format reference"),
    ],
)  # fmt: skip
def test_the_weights_say_how_we_know_and_say_inferred_when_inferred(launcher, args, kind, how):
    from dispatchlab.core.launch import launch_from_spec
    from worker.runner import weights_kind

    weights = weights_kind(launch_from_spec({"launcher": launcher, "args": args, "env": {}}))
    assert weights["kind"] == kind and weights["how"].startswith(how)
    assert weights["inferred"] is (kind == "real")


def test_a_server_that_reports_no_version_is_named_with_the_installed_one_marked_inferred():
    from dispatchlab.core.launch import launch_from_spec
    from worker.policy import ApprovedLaunch
    from worker.runner import launcher_identity

    launch = launch_from_spec({"launcher": "sglang", "args": ["--model-path", "/m"], "env": {}})
    approved = ApprovedLaunch(
        launch=launch, program=["python", "-m", "sglang.launch_server"], server_version="0.5.23"
    )
    identity = launcher_identity(approved, base_url="http://127.0.0.1:9", log_lines=[])
    assert identity == {
        "kind": "server",
        "name": "sglang",
        "label": "sglang 0.5.23",
        "version": "0.5.23",
        "how": "inferred: the version installed for the launcher's Python",
        "inferred": True,
    }
