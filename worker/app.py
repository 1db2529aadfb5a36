"""The GPU worker's Celery app: no Django, the same broker as the dashboard.

`python -m worker serve` takes inventory, subscribes to `gpu`, `gpu.<arch>` for each arch it has and
`gpu.host.<name>`, and runs one job at a time (a GPU is not shared between two launches). A thread sends
a heartbeat with the inventory every HEARTBEAT_SECONDS, busy or not, and a last one saying it stops.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery import Celery

from dispatchlab.messaging.broker import DEFAULT_BROKER_URL, broker_config, data_dir_from_env
from dispatchlab.messaging.contract import (
    CONFIRM_FINISHED_TASK,
    CONFIRM_TASK,
    HEARTBEAT_SECONDS,
    HEARTBEAT_TASK,
    PROBE_TASK,
    PROBES_FINISHED_TASK,
    ConfirmJob,
    Heartbeat,
    ProbeJob,
    arch_queue,
    cancel_queue,
    dashboard_queue,
    gpu_queue,
    host_queue,
)
from worker.config import WorkerConfig, load_config

logger = logging.getLogger("dispatchlab.worker")


def make_app() -> Celery:
    url = os.environ.get("DISPATCHLAB_BROKER_URL") or DEFAULT_BROKER_URL
    broker = broker_config(url=url, data_dir=data_dir_from_env(), visibility_timeout=4 * 3600)
    app = Celery("dispatchlab-gpu", broker=url, set_as_current=False)
    app.conf.update(
        broker_transport=broker.transport,
        broker_transport_options=broker.transport_options,
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_default_queue=gpu_queue(),
        # A launch is not repeated behind a person's back: a job is taken once, even if we die.
        task_acks_late=False,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )
    if broker.transport is None:
        app.conf.broker_transport = None
    return app


app = make_app()
state: dict[str, Any] = {"config": None, "inventory": {}, "busy": threading.Event()}


def _config() -> WorkerConfig:
    config = state["config"]
    if config is None:
        config = state["config"] = load_config()
    assert isinstance(config, WorkerConfig)
    return config


def send_to_dashboard(task: str, payload: dict[str, Any]) -> None:
    app.send_task(task, args=[payload], queue=dashboard_queue())


def queues_for(config: WorkerConfig, inventory: dict[str, Any]) -> list[str]:
    arches = sorted({g["arch"] for g in inventory.get("gpus") or [] if g.get("arch")})
    if config.arch_override:
        arches = sorted({*arches, config.arch_override})
    return [gpu_queue(), *(arch_queue(a) for a in arches), host_queue(config.host), *config.extra_queues]


def heartbeat_payload(*, stopping: bool = False) -> Heartbeat:
    config = _config()
    inventory = state["inventory"]
    return {
        "host": config.host,
        "queues": queues_for(config, inventory),
        "inventory": inventory,
        "launchers": sorted(config.launchers),
        "model_roots": [str(root) for root in config.model_roots],
        "busy": state["busy"].is_set(),
        "stopping": stopping,
    }


class HeartbeatThread(threading.Thread):
    def __init__(self, every: float = HEARTBEAT_SECONDS) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self.every = every
        self.stopped = threading.Event()

    def run(self) -> None:
        while True:
            try:
                send_to_dashboard(HEARTBEAT_TASK, dict(heartbeat_payload()))
            except Exception as error:  # the broker is down: say so and try again next period
                logger.warning("heartbeat not sent: %s", error)
            if self.stopped.wait(self.every):
                return


def cancel_asked(confirm_id: int) -> bool:
    """Whether the dashboard put a cancel of this confirm on its cancel queue (consumed if so)."""
    with app.connection_for_read() as connection:
        queue = connection.SimpleQueue(cancel_queue(confirm_id), serializer="json")
        try:
            message = queue.get_nowait()
        except queue.Empty:
            return False
        else:
            message.ack()
            return True
        finally:
            queue.close()


@app.task(name=CONFIRM_TASK)
def confirm_task(job: ConfirmJob) -> None:
    from worker.runner import run_confirm

    state["busy"].set()
    try:
        confirm_id = int(job["confirm_id"]) if isinstance(job, dict) else 0
        run_confirm(
            job,
            _config(),
            send_to_dashboard,
            inventory=state["inventory"],
            cancelled=lambda: cancel_asked(confirm_id),
        )
    except Exception as error:
        # Whatever broke, the dashboard hears a terminal status, or the run would stay `running`.
        if isinstance(job, dict) and isinstance(job.get("confirm_id"), int):
            reason = f"the worker could not run the job: {type(error).__name__}: {str(error)[:300]}"
            send_to_dashboard(
                CONFIRM_FINISHED_TASK,
                {
                    "confirm_id": job["confirm_id"],
                    "host": _config().host,
                    "status": "refused",
                    "error": reason,
                },
            )
        raise
    finally:
        state["busy"].clear()


@app.task(name=PROBE_TASK)
def probe_task(job: ProbeJob) -> None:
    from worker.runner import run_probes_subprocess

    names = list(job.get("probes") or []) or None  # none named: every probe
    state["busy"].set()
    try:
        results = run_probes_subprocess(names, dict(job.get("model_shapes") or {}), _config().probe_timeout_s)
    finally:
        state["busy"].clear()
    send_to_dashboard(
        PROBES_FINISHED_TASK,
        {
            "probe_run_id": job.get("probe_run_id"),
            "host": _config().host,
            "probes": results,
            "inventory": state["inventory"],
        },
    )


def serve(*, inventory: dict[str, Any], concurrency: int = 1, loglevel: str = "INFO") -> int:
    config = _config()
    state["inventory"] = inventory
    queues = queues_for(config, inventory)
    print(
        f"dispatchlab GPU worker {config.host}: queues {', '.join(queues)}; "
        f"launchers {', '.join(sorted(config.launchers)) or 'none'}; "
        f"model roots {', '.join(str(r) for r in config.model_roots) or 'none'}",
        flush=True,
    )
    beat = HeartbeatThread()
    beat.start()
    try:
        app.worker_main(
            [
                "worker",
                "--queues",
                ",".join(queues),
                "--pool",
                "solo",
                "--concurrency",
                str(concurrency),
                "--loglevel",
                loglevel,
                "--hostname",
                f"gpu@{config.host}",
                "--without-gossip",
                "--without-mingle",
            ]
        )
    finally:
        beat.stopped.set()
        try:
            send_to_dashboard(HEARTBEAT_TASK, dict(heartbeat_payload(stopping=True)))
        except Exception as error:
            logger.warning("goodbye heartbeat not sent: %s", error)
    return 0


@app.task(name="gpu.sweep")
def sweep_task(job: dict[str, Any]) -> None:
    """Run the backend sweep a dashboard asked for and answer with its report (or why it did not run)."""
    from dispatchlab.core.shapes import shapes_from_dict
    from dispatchlab.messaging.sweep import SWEEP_FINISHED_TASK, SWEEP_STARTED_TASK
    from worker.sweep import run_sweep

    answer: dict[str, Any] = {"sweep_id": job.get("sweep_id"), "host": _config().host}
    state["busy"].set()
    send_to_dashboard(SWEEP_STARTED_TASK, {"sweep_id": job.get("sweep_id"), "host": _config().host})
    try:
        report = run_sweep(
            str(job.get("component")),
            shapes_from_dict(dict(job.get("shapes") or {})),
            tokens=job.get("tokens") or None,
            source=f"sweep {job.get('sweep_id')}",
        )
        answer["result"] = report.to_dict()
    except Exception as error:  # the dashboard hears a terminal status whatever broke
        answer["error"] = f"the worker could not run the sweep: {type(error).__name__}: {str(error)[:300]}"
    finally:
        state["busy"].clear()
    send_to_dashboard(SWEEP_FINISHED_TASK, answer)
