"""The messages between the dashboard and GPU workers: task names, queues and their JSON payloads.

The dashboard sends `gpu.*` tasks to a GPU queue; a GPU worker answers with dashboard tasks on the
dashboard's queue (DISPATCHLAB_QUEUE). Payloads are JSON objects of primitives (ids, argument lists,
figures), never model instances or file bytes.

    gpu.confirm      dashboard -> worker   ConfirmJob: run a (fixed) launch, smoke-test it, probe
    gpu.probe        dashboard -> worker   ProbeJob: run kernel probes on this host
    hosts.heartbeat  worker -> dashboard   Heartbeat: inventory, queues, allowed launchers
    confirms.started worker -> dashboard   {"confirm_id", "host", "argv"}
    confirms.output  worker -> dashboard   {"confirm_id", "seq", "text"}: the launch's output, in order
    confirms.finished worker -> dashboard  ConfirmOutcome
    probes.finished  worker -> dashboard   {"probe_run_id" or null, "host", "probes": [...], "inventory"}

A cancel is not a task (a worker runs one job at a time and would only read it afterwards): the
dashboard puts {"confirm_id"} on the plain queue `cancel_queue(confirm_id)`, which the worker running
(or about to run) that confirm reads before it starts and every second while the launch runs.
"""

from __future__ import annotations

import os
from typing import Any, TypedDict

CONFIRM_TASK = "gpu.confirm"
PROBE_TASK = "gpu.probe"
HEARTBEAT_TASK = "hosts.heartbeat"
CONFIRM_STARTED_TASK = "confirms.started"
CONFIRM_OUTPUT_TASK = "confirms.output"
CONFIRM_FINISHED_TASK = "confirms.finished"
PROBES_FINISHED_TASK = "probes.finished"

# A host sends a heartbeat this often; one not heard from for HOST_ALIVE_FACTOR periods is gone.
HEARTBEAT_SECONDS = 15.0
HOST_ALIVE_FACTOR = 4


def dashboard_queue() -> str:
    return os.environ.get("DISPATCHLAB_QUEUE", "dispatchlab")


def gpu_queue() -> str:
    """The queue any GPU host consumes; the arch and host queues are named after it. One broker can
    serve several dashboards when each sets its own DISPATCHLAB_GPU_QUEUE."""
    return os.environ.get("DISPATCHLAB_GPU_QUEUE", "gpu")


def arch_queue(arch: str | None) -> str:
    """The queue a job for this arch waits in: only hosts of that arch consume it."""
    return f"{gpu_queue()}.{arch}" if arch else gpu_queue()


def host_queue(host: str) -> str:
    """Every worker also consumes a queue of its own, so a host can be asked directly."""
    return f"{gpu_queue()}.host.{host}"


def cancel_queue(confirm_id: int) -> str:
    """The queue a cancel of one confirm run is put on (kombu SimpleQueue, JSON)."""
    return f"{gpu_queue()}.cancel.{int(confirm_id)}"


class LaunchSpec(TypedDict):
    launcher: str  # "sglang", "sglang-serve", "vllm", or "repro:<name>"
    args: list[str]  # the arguments after the launcher, one list item each, never a shell string
    env: dict[str, str]


class ConfirmJob(TypedDict):
    confirm_id: int
    report_id: int
    launch: LaunchSpec
    server: str  # "sglang" | "vllm" | "unknown": whose flag catalog validates the arguments
    arch: str | None
    time_limit_s: int
    ready_timeout_s: int
    smoke_prompt: str
    concurrency: int  # the N of the throughput measurement at 1 and N concurrent requests
    probes: list[str]  # kernel probes of the failing component to run after the launch
    model_shapes: dict[str, Any]


class ProbeJob(TypedDict):
    probe_run_id: int | None
    probes: list[str]
    model_shapes: dict[str, Any]


class Heartbeat(TypedDict):
    host: str
    queues: list[str]
    inventory: dict[str, Any]
    launchers: list[str]
    model_roots: list[str]
    busy: bool
    stopping: bool


class ConfirmOutcome(TypedDict, total=False):
    confirm_id: int
    host: str
    status: str  # "finished" (the launch ran; the dashboard judges it), "refused" or "cancelled"
    error: str
    missing_artifacts: bool  # refused at once: it needs FlashInfer's downloaded kernels, absent here
    argv: list[str]
    exit_code: int | None
    ready: bool
    ready_by: str  # "log line" / "health URL /health" / ""
    ready_seconds: float | None
    stopped_by: str  # "time limit", "died", "dispatchlab after the checks"
    smoke: dict[str, Any] | None
    throughput: list[dict[str, Any]]
    probes: list[dict[str, Any]]
    inventory: dict[str, Any]
    duration_s: float
    output_pieces: int  # how many confirms.output pieces were sent, so none is missed
    # What ran, as it identified itself: {"kind": "server" | "stand-in", "name", "label", "version",
    # "how", "inferred"}; a stand-in (repro:<name>) is kernel-level evidence.
    launcher_identity: dict[str, Any]
    weights: dict[str, Any]  # {"kind": "real" | "dummy" | "reference", "how", "inferred"}
    host_identity: dict[str, Any]  # {"name", "gpu", "arch", "gpu_count"}
    throughput_unit: str  # "tokens/s" for a server, "kernel steps/s" for a stand-in
