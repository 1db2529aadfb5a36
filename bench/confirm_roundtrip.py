"""A confirm round trip through the dashboard's real message path, on whatever host this runs on.

The dashboard on embedded defaults (SQLite, the filesystem broker) with its Celery worker, and a GPU
worker (`python -m worker serve`) beside it: a failing launch runs, its log is uploaded and diagnosed,
"Confirm on GPU" queues the fix, the GPU worker re-runs it, streams the output back into a new report
and the dashboard decides the outcome; then a probe run of the host. Prints each step with timings.

    python bench/confirm_roundtrip.py                      # the repro on this host's GPU (sm_90: trtllm-gen refused)
    python bench/confirm_roundtrip.py --device cpu         # the same on a CPU
    python bench/confirm_roundtrip.py --crash "python -m sglang.launch_server ..." --launcher-python /venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FINISHED = {"fixed", "still_fails", "garbage", "refused"}


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--crash", help="the failing launch command line (default: the repro with flashinfer_trtllm)"
    )
    parser.add_argument(
        "--launchers", help="DISPATCHLAB_WORKER_LAUNCHERS for the GPU worker (JSON), e.g. a venv's SGLang"
    )
    parser.add_argument("--model-roots", help="DISPATCHLAB_WORKER_MODEL_ROOTS for the GPU worker")
    parser.add_argument("--probes", default="", help="probe names or component:NAME for the probe run")
    parser.add_argument(
        "--confirm-probes",
        help="probes run after the confirm (default: the failing component's, as the page does)",
    )
    parser.add_argument(
        "--also-confirm",
        action="append",
        default=[],
        metavar="JSON",
        help='another confirm of the same report with this args patch, e.g. \'{"--tp-size": "4"}\'',
    )
    parser.add_argument("--crash-timeout", type=float, default=600)
    parser.add_argument("--sweep-timeout", type=float, default=400, help="seconds to wait for the sweep")
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for each confirm")
    parser.add_argument("--json", type=Path, help="write every result here too")
    return parser.parse_args()


def _wait(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise SystemExit(f"{what} did not happen within {timeout:.0f} s")


def _sweep_then_confirm(report: Any, timeout: float) -> dict[str, Any]:
    """Sweep the component the crash names on the host, print the ranked table, and queue the confirm
    of the full launch with the fastest correct backend, as the sweep page's one button does."""
    from dispatchlab.gpu.models import SweepRun
    from dispatchlab.gpu.sweep_services import SweepRejected, sweep_component_for, sweep_confirm, sweep_create

    component = sweep_component_for(dict(report.document or {})).component or "moe"
    sweep = sweep_create(report=report, component=component)
    print(f"2b. {component} sweep {sweep.id} queued on {sweep.queue}", flush=True)
    started = time.monotonic()
    running = _wait(
        lambda: SweepRun.objects.filter(id=sweep.id).exclude(status=SweepRun.Status.QUEUED).first(),
        timeout,
        "the sweep to start",
    )
    print(f"   {running.status} on {running.host_name} after {time.monotonic() - started:.1f} s", flush=True)
    sweep = _wait(
        lambda: SweepRun.objects.filter(id=sweep.id, status__in=["done", "failed"]).first(),
        timeout,
        "the sweep",
    )
    result = sweep.result or {}
    print(f"   {sweep.status} after {time.monotonic() - started:.1f} s {sweep.error}", flush=True)
    for candidate in sorted(result.get("candidates") or [], key=lambda c: c.get("rank") or 99):
        ms = candidate.get("ms")
        peak = candidate.get("peak_fraction")
        print(
            f"   {candidate.get('rank') or '-'!s:>2} {candidate.get('name', '?'):28} "
            f"{candidate.get('status', '')!s:20} correct={candidate.get('correct')} "
            f"{f'{ms:.3f} ms' if isinstance(ms, (int, float)) else '':>12}"
            f"{f'  {peak:.1%} of peak' if isinstance(peak, (int, float)) else ''}  "
            f"{str(candidate.get('error') or '')[:100]}",
            flush=True,
        )
    fix = sweep.proposed_fix or {}
    print(f"   proposed: {fix.get('flag')} {fix.get('value')} ({fix.get('why', '')})", flush=True)
    try:
        confirm = sweep_confirm(sweep=sweep, user=None)
    except SweepRejected as rejected:
        print(f"   no confirm: {rejected}", flush=True)
        confirm = None
    return {"id": sweep.id, "status": sweep.status, "result": result, "proposed_fix": fix, "confirm": confirm}


def main() -> int:
    args = _parse()
    data = Path(tempfile.mkdtemp(prefix="dispatchlab-roundtrip-"))
    env = {
        **os.environ,
        "DISPATCHLAB_DATA_DIR": str(data),
        "DJANGO_SETTINGS_MODULE": "dispatchlab.config.settings",
        "DISPATCHLAB_SECRET_KEY": "roundtrip-" + os.urandom(8).hex(),
        "DISPATCHLAB_WORKER_NAME": os.environ.get("DISPATCHLAB_WORKER_NAME", os.uname().nodename),
        "PYTHONUNBUFFERED": "1",
    }
    if args.launchers:
        env["DISPATCHLAB_WORKER_LAUNCHERS"] = args.launchers
    if args.model_roots:
        env["DISPATCHLAB_WORKER_MODEL_ROOTS"] = args.model_roots
    os.environ.update(env)
    import django

    django.setup()
    from django.core.files.base import ContentFile
    from django.core.management import call_command

    from dispatchlab.gpu.models import ConfirmRun, GpuHost, ProbeRun
    from dispatchlab.gpu.services import confirm_create, confirm_plan, probe_request
    from dispatchlab.reports.accounts import user_bootstrap
    from dispatchlab.reports.models import Report
    from dispatchlab.reports.submit import report_submit

    results: dict[str, Any] = {}
    call_command("migrate", verbosity=0)
    boot = user_bootstrap(username="bench")
    assert boot is not None
    logs = data / "logs"
    logs.mkdir()
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "dispatchlab.config",
                "worker",
                "--concurrency",
                "2",
                "--loglevel",
                "INFO",
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=ROOT,
            env=env,
            stdout=(logs / "dashboard-worker.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        ),
        subprocess.Popen(
            [sys.executable, "-m", "worker", "serve"],
            cwd=ROOT,
            env=env,
            stdout=(logs / "gpu-worker.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        ),
    ]
    try:
        host = _wait(
            lambda: GpuHost.objects.filter(name=env["DISPATCHLAB_WORKER_NAME"]).first(),
            120,
            "the GPU worker's first heartbeat",
        )
        gpus = host.inventory.get("gpus") or []
        print(
            f"host {host.name}: {', '.join(g.get('name', '?') + ' ' + str(g.get('arch')) for g in gpus) or 'no GPU'}; "
            f"queues {', '.join(host.queues)}",
            flush=True,
        )
        results["host"] = {"name": host.name, "queues": host.queues, "inventory": host.inventory}

        toy = ROOT / "worker" / "repro" / "models" / "toy-moe"
        crash = args.crash or (
            f"python -m worker.repro moe-serve --model-path {toy} --device {args.device} "
            "--moe-runner-backend flashinfer_trtllm"
        )
        print(f"\n1. the failing launch: {crash}", flush=True)
        started = time.monotonic()
        from dispatchlab.core.launch import launch_from_command
        from worker.config import load_config

        # The failing launch runs through the same launcher mapping the GPU worker uses.
        launch = launch_from_command(crash)
        argv = [*load_config().launchers[launch.launcher], *launch.args()]
        done = subprocess.run(
            argv,
            cwd=ROOT,
            capture_output=True,
            timeout=args.crash_timeout,
            env={**env, **launch.env},
            check=False,
        )
        log = done.stdout + done.stderr
        print(
            f"   exit {done.returncode} after {time.monotonic() - started:.1f} s, {len(log):,} bytes of log",
            flush=True,
        )

        report, _ = report_submit(
            project=boot.project,
            user=None,
            files=[ContentFile(log, name="crash.log")],
            title="round trip: crash",
            launch_command=crash,
        )
        report = _wait(
            lambda: Report.objects.filter(id=report.id, status__in=["done", "failed"]).first(),
            300,
            "the crash report's parse",
        )
        print(
            f"2. diagnosis: {report.failure_class} / {report.top_match_id or '-'}: {report.top_match_title}",
            flush=True,
        )
        plan = confirm_plan(report=report)
        for line in plan.diff:
            if line.kind != "same":
                print(
                    f"   {line.kind:8} {line.text}" + (f"   (was {line.before})" if line.before else ""),
                    flush=True,
                )
        results["crash"] = {
            "exit": done.returncode,
            "failure_class": report.failure_class,
            "signature": report.top_match_id,
            "fix": plan.fix_args,
        }

        confirm_probes = [p for p in args.confirm_probes.split(",") if p] if args.confirm_probes else None
        if plan.nothing_to_confirm or not (plan.fix_args or plan.fix_env):
            # What the confirm form offers then: the sweep, and one click on its proposed backend.
            print(f"   {plan.reason or 'nothing to confirm: the diagnosis has no fix'}", flush=True)
            results["sweep"] = _sweep_then_confirm(report, args.sweep_timeout)
            confirm = results["sweep"].pop("confirm")
            if confirm is None:
                return 1
        else:
            confirm = confirm_create(report=report, user=None, probes=confirm_probes)
        print(f"3. confirm {confirm.id} queued on {confirm.queue} ({confirm.status})", flush=True)
        started = time.monotonic()
        confirm = _wait(
            lambda: ConfirmRun.objects.filter(id=confirm.id, status__in=FINISHED).first(),
            args.timeout,
            "the confirm run",
        )
        result = confirm.result or {}
        print(
            f"   {confirm.status} after {time.monotonic() - started:.1f} s{': ' + confirm.error if confirm.error else ''}",
            flush=True,
        )
        print(f"   evidence: {confirm.evidence_label}", flush=True)
        print(f"   ready by {result.get('ready_by')} in {result.get('ready_seconds')} s", flush=True)
        smoke = result.get("smoke") or {}
        print(
            f"   smoke answer: {str(smoke.get('text'))[:120]!r}; garbage: {(smoke.get('garbage') or {}).get('garbage')}",
            flush=True,
        )
        for point in result.get("throughput") or []:
            print(
                f"   throughput at {point['concurrency']} concurrent: {point['tokens_per_s']:.1f} {confirm.throughput_unit}",
                flush=True,
            )
        new = confirm.result_report
        if new is not None:
            print(
                f"   new report {new.id}: outcome {new.outcome}, moe backend "
                f"{(new.backend_values or {}).get('moe_runner_backend')}, class {new.failure_class}",
                flush=True,
            )
        results["confirm"] = {
            "evidence": confirm.evidence_label,
            "status": confirm.status,
            "error": confirm.error,
            "argv": confirm.argv,
            **result,
        }

        for patch in args.also_confirm:
            extra = confirm_create(
                report=report, user=None, args_patch={**plan.fix_args, **json.loads(patch)}, probes=[]
            )
            extra = _wait(
                lambda extra=extra: ConfirmRun.objects.filter(id=extra.id, status__in=FINISHED).first(),
                args.timeout,
                "the extra confirm run",
            )
            print(f"   confirm {extra.id} with {patch}: {extra.status}: {extra.error}", flush=True)
            results.setdefault("also", []).append(
                {"patch": patch, "status": extra.status, "error": extra.error}
            )
        if new is not None and new.document:
            for transport in new.document.get("nccl_transports") or []:
                print(
                    f"   NCCL in the new report: {transport['a']} -> {transport['b']} via {transport['via']}"
                )

        run = probe_request(
            project=boot.project, host=host, probes=[p for p in args.probes.split(",") if p] or None
        )
        print(f"\n4. probe run {run.id} on {run.queue}", flush=True)
        run = _wait(lambda: ProbeRun.objects.filter(id=run.id, status="done").first(), 900, "the probe run")
        for probe in run.results:
            figure = (
                (probe.get("tflops") and f"{probe['tflops']:.0f} TFLOP/s")
                or (probe.get("gbps") and f"{probe['gbps']:.0f} GB/s")
                or ""
            )
            peak = probe.get("peak_fraction")
            print(
                f"   {probe.get('name'):28} {probe.get('status', ''):20} {probe.get('ms') or '':>10} ms {figure:>16}"
                f"{f'  {peak:.0%} of peak' if peak else ''}  {str(probe.get('error') or '')[:90]}",
                flush=True,
            )
        results["probes"] = run.results
    finally:
        for process in processes:
            try:
                os.killpg(process.pid, 15)
                process.wait(timeout=20)
            except Exception:
                os.killpg(process.pid, 9)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1, default=str))
        print(f"\nlogs and data in {data}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
