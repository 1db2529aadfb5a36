"""The backend sweep's messages between the dashboard and a GPU worker (like the confirm's: the job waits
in `gpu.<arch>`, the worker answers on the dashboard's queue). JSON only."""

from __future__ import annotations

from typing import Any, TypedDict

SWEEP_TASK = "gpu.sweep"
SWEEP_STARTED_TASK = "sweeps.started"
SWEEP_FINISHED_TASK = "sweeps.finished"
COMPONENTS = ("moe", "attention", "gemm", "sampling")


class SweepJob(TypedDict):
    sweep_id: int
    component: str
    shapes: dict[str, Any]  # dispatchlab.core.shapes.ModelShapesRead.to_dict()
    tokens: int | None


class SweepStarted(TypedDict):
    sweep_id: int
    host: str


class SweepFinished(TypedDict, total=False):
    sweep_id: int
    host: str
    result: dict[str, Any]  # worker.sweep.SweepReport.to_dict()
    error: str
