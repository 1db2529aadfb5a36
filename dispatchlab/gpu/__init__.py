"""GPU hosts, confirm runs and kernel probes: the dashboard's side of the GPU worker.

GPU workers (`python -m worker`) are Celery workers without Django: they announce themselves with
heartbeats, take `gpu.confirm` / `gpu.probe` jobs from their arch's queue and answer with messages
(dispatchlab.messaging.contract) that the tasks here store.
"""
