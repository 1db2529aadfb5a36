"""Run one confirm job: the approved launch as an argument list in a process group of its own, its
output streamed back as it comes, readiness by log line and health URL, a smoke request checked for
garbage, a short throughput measurement, the whole group stopped at the end, then kernel probes of the
failing component in a separate process (so this worker never holds GPU memory itself)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import IO, Any

from dispatchlab.core.launch import REPRO_PREFIX, Launch, flag_key
from dispatchlab.messaging.contract import (
    CONFIRM_FINISHED_TASK,
    CONFIRM_OUTPUT_TASK,
    CONFIRM_STARTED_TASK,
    ConfirmJob,
    ConfirmOutcome,
)
from worker.config import WORKER_SELECTED_ENV, WorkerConfig
from worker.policy import ApprovedLaunch, Refused, approve, bind

Send = Callable[[str, dict[str, Any]], None]

READY_LINE = re.compile(
    r"The server is fired up and ready to roll|Application startup complete|Uvicorn running on|"
    r"Starting vLLM API server"
)
HEALTH_PATHS = ("/health", "/v1/models")
# Where a server says which release it is: vLLM's /version, SGLang's /get_server_info (and /version).
VERSION_PATHS = ("/version", "/get_server_info", "/server_info")
CANCEL_POLL_SECONDS = 1.0
PIECE_BYTES = 256 * 1024
STOP_GRACE_SECONDS = 15.0
# What the child inherits besides the launch's own variables: enough to find programs and a home.
BASE_ENV_NAMES = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "USER",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "HF_HOME",
    *WORKER_SELECTED_ENV,  # the worker's own GPU selection; a launch cannot set it
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class OutputPump:
    """Reads the child's output on a thread; `flush` sends what arrived as numbered pieces."""

    def __init__(self, stream: IO[bytes], send: Send, confirm_id: int, limit: int) -> None:
        self.stream = stream
        self.send = send
        self.confirm_id = confirm_id
        self.limit = limit
        self.pending: list[str] = []
        self.lock = threading.Lock()
        self.seq = 0
        self.sent_bytes = 0
        self.dropped_bytes = 0
        self.ready_line: str | None = None
        self.tail: list[str] = []
        self.head: list[str] = []  # the first lines, where a program says what it is
        self.thread = threading.Thread(target=self._read, name="confirm-output", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for raw in iter(self.stream.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            if self.ready_line is None and READY_LINE.search(line):
                self.ready_line = line.strip()
            with self.lock:
                self.pending.append(line)
                self.tail = [*self.tail[-40:], line]
                if len(self.head) < 60:
                    self.head.append(line)

    def flush(self, *, final: bool = False) -> None:
        if final:
            self.thread.join(timeout=5)
        with self.lock:
            text, self.pending = "".join(self.pending), []
        while text:
            piece, text = text[:PIECE_BYTES], text[PIECE_BYTES:]
            if self.sent_bytes + len(piece) > self.limit:
                self.dropped_bytes += len(piece)
                continue
            self.send(CONFIRM_OUTPUT_TASK, {"confirm_id": self.confirm_id, "seq": self.seq, "text": piece})
            self.seq += 1
            self.sent_bytes += len(piece)
        if final and self.dropped_bytes:
            note = (
                f"\n[dispatchlab worker] {self.dropped_bytes} bytes of output over the limit were dropped\n"
            )
            self.send(CONFIRM_OUTPUT_TASK, {"confirm_id": self.confirm_id, "seq": self.seq, "text": note})
            self.seq += 1


def _health(base_url: str) -> str | None:
    """The health path that answers 200. /v1/models counts only on a server without /health: SGLang's
    /health answers 503 until its warm-up request is done while /v1/models already answers."""
    for path in HEALTH_PATHS:
        try:
            with urllib.request.urlopen(base_url + path, timeout=5) as response:
                if response.status == 200:
                    return path
        except urllib.error.HTTPError as error:
            if error.code != 404:
                return None
        except (urllib.error.URLError, OSError, ValueError):
            return None
    return None


def _served_model(base_url: str) -> str | None:
    try:
        with urllib.request.urlopen(base_url + "/v1/models", timeout=5) as response:
            data = json.load(response)
        return str(data["data"][0]["id"])
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the whole group, then SIGKILL to whatever is left of it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STOP_GRACE_SECONDS)
    # Children of the server (scheduler, detokenizer) may outlive its main process.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


def _version_from_server(base_url: str) -> tuple[str, str] | None:
    """(version, path) as the running server reports it, or None."""
    for path in VERSION_PATHS:
        try:
            with urllib.request.urlopen(base_url + path, timeout=5) as response:
                data = json.load(response)
        except (urllib.error.URLError, OSError, ValueError):
            continue
        version = data.get("version") if isinstance(data, dict) else None
        if isinstance(version, str) and version.strip():
            return version.strip()[:100], path
    return None


def launcher_identity(
    approved: ApprovedLaunch, *, base_url: str | None, log_lines: list[str]
) -> dict[str, Any]:
    """What ran, as it identified itself: a server's name and the version it reported (else the
    installed package's, marked inferred), or a repro stand-in by name. `kind` is "server" or
    "stand-in"; a stand-in's evidence is kernel-level."""
    launch = approved.launch
    if launch.launcher.startswith(REPRO_PREFIX):
        name = launch.launcher[len(REPRO_PREFIX) :]
        said = next((line.strip() for line in log_lines if f"dispatchlab repro {name}" in line), "")
        return {
            "kind": "stand-in",
            "name": launch.launcher,
            "label": f"the {name} stand-in",
            "version": None,
            "how": f"it identified itself in its log: {said[-200:]}" if said else "named by its launcher",
            "inferred": not said,
        }
    server = launch.server if launch.server != "unknown" else launch.launcher
    reported = _version_from_server(base_url) if base_url else None
    if reported is not None:
        version, path = reported
        how, inferred = f"reported by the server at {path}", False
    elif approved.server_version:
        version = approved.server_version
        how, inferred = "inferred: the version installed for the launcher's Python", True
    else:
        version, how, inferred = None, "unknown: the server reported no version", True
    label = f"{server} {version}" if version else server
    return {
        "kind": "server",
        "name": server,
        "label": label,
        "version": version,
        "how": how,
        "inferred": inferred,
    }


def weights_kind(launch: Launch) -> dict[str, Any]:
    """Real, dummy or reference weights, and how we know."""
    option = launch.option("--load-format")
    load_format = option.values[0] if option is not None and option.values else None
    if launch.launcher.startswith(REPRO_PREFIX):
        if load_format == "dummy":
            return {"kind": "dummy", "how": "--load-format dummy (random weights)", "inferred": False}
        how = "--load-format reference" if load_format else "the repro's default --load-format reference"
        return {
            "kind": "reference",
            "how": f"{how}: the repro's own seeded reference weights, not a model's",
            "inferred": False,
        }
    if load_format == "dummy":
        return {"kind": "dummy", "how": "--load-format dummy (random weights)", "inferred": False}
    model = launch.option("--model-path") or launch.option("--model")
    where = (model.values[0] if model and model.values else "") or " ".join(launch.positional)
    return {
        "kind": "real",
        "how": f"inferred: no --load-format dummy, weights read from {where or 'the model path'}",
        "inferred": True,
    }


def host_identity(host: str, inventory: dict[str, Any]) -> dict[str, Any]:
    gpus = [g for g in inventory.get("gpus") or [] if isinstance(g, dict)]
    return {
        "name": host,
        "gpu": str(gpus[0].get("name") or "") if gpus else "",
        "arch": str(gpus[0].get("arch") or "") if gpus else "",
        "gpu_count": len(gpus),
    }


class CancelWatch(threading.Thread):
    """Asks `cancelled` every CANCEL_POLL_SECONDS; once it says yes, stops the launch's process group."""

    def __init__(self, cancelled: Callable[[], bool], process: subprocess.Popen[bytes]) -> None:
        super().__init__(name="confirm-cancel", daemon=True)
        self.cancelled = cancelled
        self.process = process
        self.done = threading.Event()
        self.fired = threading.Event()

    def run(self) -> None:
        while not self.done.wait(CANCEL_POLL_SECONDS):
            try:
                asked = self.cancelled()
            except Exception:  # the broker is away for a moment: ask again next time
                asked = False
            if asked:
                self.fired.set()
                _stop_group(self.process)
                return


ALLREDUCE = "allreduce"  # the multi-process NCCL probe, run on its own (worker/allreduce.py)


def _probe_command(argv: list[str], env: dict[str, str], timeout: int) -> list[dict[str, Any]]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False)
        data = json.loads(done.stdout or "{}")
    except subprocess.TimeoutExpired:
        return [{"name": argv[5] if len(argv) > 5 else "probes", "runs": False, "status": "TIMEOUT",
                 "error": f"probes ran over {timeout} s"}]  # fmt: skip
    except json.JSONDecodeError:
        return [{"name": "probes", "runs": False, "status": "RUNTIME_ERROR", "error": done.stderr[-500:]}]
    probes = data.get("probes") if isinstance(data, dict) else None
    return [p for p in probes or [] if isinstance(p, dict)]


def _asked(cancelled: Callable[[], bool]) -> bool:
    try:
        return bool(cancelled())
    except Exception:  # the broker is away: the run goes ahead (it can still be cancelled later)
        return False


def run_probes_subprocess(
    names: list[str] | None, model_shapes: dict[str, Any], timeout: int
) -> list[dict[str, Any]]:
    """`python -m worker probe --json` for the named probes (or `component:NAME`, or `allreduce`);
    None runs every single-GPU probe."""
    if names is not None and not names:
        return []
    from worker.probes import probe_names, probes_for_component

    base = [sys.executable, "-m", "worker", "probe", "--json"]
    argv = list(base)
    known = set(probe_names())
    for name in names or []:
        if name.startswith("component:"):
            with contextlib.suppress(ValueError):  # a component this worker has no probes for
                argv += [p for p in probes_for_component(name.split(":", 1)[1]) if p not in argv]
        elif name in known and name not in argv:
            argv.append(name)
    env = dict(os.environ)
    if model_shapes:
        env["DISPATCHLAB_PROBE_MODEL_SHAPES"] = json.dumps(model_shapes)
    results: list[dict[str, Any]] = []
    if names is None or len(argv) > len(base):
        results += _probe_command(argv, env, timeout)
    if names and ALLREDUCE in names:
        results += _probe_command([*base, ALLREDUCE], env, timeout)
    return results


# Backends whose kernels FlashInfer downloads at first use (the TensorRT-LLM-gen cubins), by flag.
DOWNLOADED_KERNEL_VALUES = {
    "moe_runner_backend": ("flashinfer_trtllm",),
    "speculative_moe_runner_backend": ("flashinfer_trtllm",),
    "attention_backend": ("trtllm_mha", "trtllm_mla"),
    "prefill_attention_backend": ("trtllm_mha", "trtllm_mla"),
    "decode_attention_backend": ("trtllm_mha", "trtllm_mla"),
    "fp4_gemm_backend": ("flashinfer_trtllm",),
}
DOWNLOADED_KERNEL_ENV = {"VLLM_FLASHINFER_MOE_BACKEND": ("latency",)}


def missing_downloaded_kernels(launch: Launch, inventory: dict[str, Any]) -> str:
    """Why this launch cannot run here (empty when it can): it picks a backend whose kernels FlashInfer
    downloads at first use, and the inventory found them neither installed nor downloadable."""
    artifacts = inventory.get("flashinfer_artifacts")
    if not isinstance(artifacts, dict) or artifacts.get("state") != "missing_artifacts":
        return ""
    uses = [
        f"{option.flag} {value}"
        for option in launch.options
        for value in option.values
        if value in DOWNLOADED_KERNEL_VALUES.get(flag_key(option.flag, launch.server), ())
    ]
    uses += [
        f"{name}={value}"
        for name, value in launch.env.items()
        if value in DOWNLOADED_KERNEL_ENV.get(name, ())
    ]
    if not uses:
        return ""
    return (
        f"missing_artifacts: {', '.join(uses)} needs FlashInfer's downloaded TensorRT-LLM-gen kernels, "
        f"which this host has neither installed nor can download ({artifacts.get('reason') or 'no reason given'}). "
        f"Fix on the host: {artifacts.get('fix') or 'install flashinfer-cubin of the same version'}; "
        "or sweep the backends and confirm with one that needs no download."
    )


def run_confirm(
    job: ConfirmJob,
    config: WorkerConfig,
    send: Send,
    *,
    inventory: dict[str, Any],
    cancelled: Callable[[], bool] | None = None,
) -> ConfirmOutcome:
    """`cancelled` says whether the dashboard cancelled this confirm: asked before the launch starts
    and every second while it runs (the whole process group is stopped then)."""
    started = time.monotonic()
    confirm_id = int(job["confirm_id"])
    outcome: ConfirmOutcome = {
        "confirm_id": confirm_id,
        "host": config.host,
        "inventory": inventory,
        "host_identity": host_identity(config.host, inventory),
    }
    try:
        launch = job["launch"]
        if not isinstance(launch, dict):
            raise Refused("the job's launch is not an object of launcher, args and env")
        approved = approve(dict(launch), config, gpu_count=len(inventory.get("gpus") or []))
        time_limit = max(10, min(int(job.get("time_limit_s") or config.time_limit_s), config.time_limit_s))
        ready_timeout = min(int(job.get("ready_timeout_s") or time_limit), time_limit)
        concurrency = max(1, int(job.get("concurrency") or 4))
    except Refused as refusal:
        error = str(refusal)
    # A job this worker cannot read is answered all the same: the run must not stay `running`.
    except (KeyError, TypeError, ValueError, RecursionError) as failure:
        error = f"the job cannot be read: {type(failure).__name__}: {str(failure)[:300]}"
    else:
        error = ""
    if error:
        outcome.update({"status": "refused", "error": error, "ready": False, "argv": [], "duration_s": 0.0})
        send(CONFIRM_FINISHED_TASK, dict(outcome))
        return outcome
    outcome["weights"] = weights_kind(approved.launch)
    outcome["launcher_identity"] = launcher_identity(approved, base_url=None, log_lines=[])
    missing = missing_downloaded_kernels(approved.launch, inventory)
    if missing:
        # FlashInfer would retry its download for half a minute, then fail: say so now, with the fix.
        outcome.update({"status": "refused", "error": missing, "ready": False, "argv": [], "duration_s": 0.0})
        outcome["missing_artifacts"] = True
        send(CONFIRM_FINISHED_TASK, dict(outcome))
        return outcome
    stand_in = outcome["launcher_identity"]["kind"] == "stand-in"
    outcome["throughput_unit"] = "kernel steps/s" if stand_in else "tokens/s"
    if cancelled is not None and _asked(cancelled):
        outcome.update(
            {"status": "cancelled", "error": "cancelled before it started", "ready": False, "argv": []}
        )
        outcome["duration_s"] = 0.0
        send(CONFIRM_FINISHED_TASK, dict(outcome))
        return outcome

    port = free_port()
    approved = bind(approved, host="127.0.0.1", port=port)
    argv = approved.argv()
    base_env = {name: os.environ[name] for name in BASE_ENV_NAMES if name in os.environ}
    send(CONFIRM_STARTED_TASK, {"confirm_id": confirm_id, "host": config.host, "argv": argv})
    base_url = f"http://127.0.0.1:{port}"
    outcome.update(
        {
            "status": "finished",
            "argv": argv,
            "ready": False,
            "ready_by": "",
            "ready_seconds": None,
            "smoke": None,
            "throughput": [],
        }
    )

    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=approved.env(base_env),
            start_new_session=True,  # its own process group: stopped as a whole at the end
        )
    except OSError as error:
        outcome.update(
            {"status": "refused", "error": f"{argv[0]} could not be started: {error}", "duration_s": 0.0}
        )
        send(CONFIRM_FINISHED_TASK, dict(outcome))
        return outcome
    assert process.stdout is not None
    pump = OutputPump(process.stdout, send, confirm_id, config.max_output_bytes)
    watch = CancelWatch(cancelled, process) if cancelled is not None else None
    if watch is not None:
        watch.start()
    last_health = 0.0
    try:
        while True:
            pump.flush()
            elapsed = time.monotonic() - started
            if process.poll() is not None:
                outcome["stopped_by"] = f"exited with status {process.returncode} before it was ready"
                break
            if elapsed > ready_timeout:
                outcome["stopped_by"] = f"was not ready after {ready_timeout} s and was stopped"
                break
            now = time.monotonic()
            if pump.ready_line is not None or now - last_health > 2.0:
                last_health = now
                path = _health(base_url)
                if path is not None:
                    outcome["ready"] = True
                    outcome["ready_seconds"] = round(elapsed, 2)
                    outcome["ready_by"] = f"health URL {path}" + (
                        f" after log line {pump.ready_line!r}" if pump.ready_line else ""
                    )
                    break
            time.sleep(0.2)

        if outcome["ready"]:
            from worker.smoke import measure_throughput, smoke_request

            model = _served_model(base_url)
            smoke = smoke_request(
                base_url, model=model, prompt=job.get("smoke_prompt") or "The capital of France is"
            )
            outcome["smoke"] = smoke.to_dict()
            pump.flush()
            if not smoke.error and process.poll() is None:
                remaining = time_limit - (time.monotonic() - started)
                points = measure_throughput(
                    base_url,
                    model=model,
                    concurrency_levels=(1, concurrency),
                    timeout=max(10.0, min(300.0, remaining / 2)),
                )
                outcome["throughput"] = [p.to_dict() for p in points]
            outcome["stopped_by"] = (
                "dispatchlab after the checks"
                if process.poll() is None
                else f"exited with status {process.returncode}"
            )
    finally:
        if watch is not None:
            watch.done.set()
        _stop_group(process)
        pump.flush(final=True)
    outcome["exit_code"] = process.returncode
    outcome["output_pieces"] = pump.seq
    outcome["launcher_identity"] = launcher_identity(
        approved, base_url=base_url if outcome["ready"] else None, log_lines=pump.head
    )
    if watch is not None and watch.fired.is_set():
        outcome.update(
            {"status": "cancelled", "error": "cancelled while it ran; its process group was stopped"}
        )
        outcome["duration_s"] = round(time.monotonic() - started, 2)
        send(CONFIRM_FINISHED_TASK, dict(outcome))
        return outcome
    outcome["probes"] = run_probes_subprocess(
        list(job.get("probes") or []), dict(job.get("model_shapes") or {}), config.probe_timeout_s
    )
    outcome["duration_s"] = round(time.monotonic() - started, 2)
    send(CONFIRM_FINISHED_TASK, dict(outcome))
    return outcome
