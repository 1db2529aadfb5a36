"""A chart page's cold load in headless Chromium: bytes sent and seconds, static files served as before
(plain names, uncompressed, 60 s cache) and as now (DISPATCHLAB_STATIC_MANIFEST: hashed names, Brotli or
gzip, a year's cache).

    python bench/chart_page_cold.py [--runs 5] [--log-mb 1] [--json bench/out/chart_page_cold.json]

A serving log that crashes at the end (bench/report_pages.py's generator) goes through the real
pipeline (report_submit, report_analyze) into a throw-away SQLite database under bench/out/; then, for
each way of serving static files, uvicorn serves the dashboard as the devserver does (loopback only)
and Debian's Chromium, through Playwright, opens the report page in a fresh browser context (an empty
cache) every run: the time until the load event and until the timeline chart is drawn, and the bytes
that came over the wire (headers and bodies as sent, compressed where they were).

Target (issue 21): the chart page's cold load under 0.5 s on this machine, as now.

The reference row serves, in place of the partial bundle, the full plotly.min.js that the `plotly`
Python package ships (4.8 MB, what the pages loaded before) through the same browser, uncompressed. The
pages now fetch Plotly after their own load event (static/js/report.js), in every row: compare the rows'
"chart drawn" for what the bundle and the compression buy; "load" is when the page itself is there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
CHROMIUM = "/usr/bin/chromium"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def _prepare(workdir: Path, log_mb: float) -> tuple[int, str]:
    """The database with one analysed report; (its id, a logged-in session id)."""
    os.environ["DISPATCHLAB_DATA_DIR"] = str(workdir)
    os.environ["DISPATCHLAB_EAGER_TASKS"] = "false"
    os.environ["DISPATCHLAB_ALLOWED_HOSTS"] = "127.0.0.1,testserver"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatchlab.config.settings")
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.files import File
    from django.core.management import call_command
    from django.test import Client
    from report_pages import write_log

    from dispatchlab.reports.analysis import report_analyze
    from dispatchlab.reports.models import Membership, Project, Report
    from dispatchlab.reports.submit import report_submit

    call_command("migrate", verbosity=0)
    project = Project.objects.create(name="bench", slug="bench")
    user = User.objects.create_user("alice", password="x")
    Membership.objects.create(user=user, project=project, role="member")
    log = workdir / "serving.log"
    write_log(log, int(log_mb * 1024 * 1024))
    with log.open("rb") as handle:
        report, _ = report_submit(project=project, user=user, files=[File(handle, name=log.name)])
    report_analyze(report_id=report.pk)
    report.refresh_from_db()
    assert report.status == Report.Status.DONE, report.error
    client = Client()
    client.force_login(user)
    return report.pk, client.cookies["sessionid"].value


def _serve(env: dict[str, str], log: Path) -> tuple[Any, str]:
    from dispatchlab.stack import answers, free_port, start_process, wait_until, web_command

    port = free_port()
    process = start_process(web_command(host="127.0.0.1", port=port, workers=1), env=env, log=log)
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: answers(base + "/api/schema/"), "the web server", timeout=60, log=log)
    return process, base


def _full_plotly() -> bytes:
    import plotly

    return (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()


def _serving(body: bytes) -> Any:
    """A route handler of one parameter (Playwright passes the request too to one of two)."""

    def fulfill(route: Any) -> None:
        route.fulfill(status=200, body=body, content_type="application/javascript")

    return fulfill


def _cold_loads(
    browser: Any,
    base: str,
    path: str,
    session: str,
    runs: int,
    *,
    chart: bool = True,
    full_plotly: bytes | None = None,
) -> dict[str, float]:
    loads, drawn, sent = [], [], []
    for _ in range(runs):
        context = browser.new_context(base_url=base)  # a fresh profile: nothing cached
        context.add_cookies([{"name": "sessionid", "value": session, "domain": "127.0.0.1", "path": "/"}])
        page = context.new_page()
        if full_plotly is not None:
            page.route("**/vendor/plotly-basic.min*.js", _serving(full_plotly))
        responses: list[Any] = []
        page.on("requestfinished", lambda request, seen=responses: seen.append(request))
        started = time.perf_counter()
        page.goto(path, wait_until="load")
        loads.append(time.perf_counter() - started)
        if chart:
            page.wait_for_selector("[data-drawn='1']", timeout=30_000)
        drawn.append(time.perf_counter() - started)
        total = 0
        for request in responses:
            sizes = request.sizes()
            total += sizes["responseHeadersSize"] + sizes["responseBodySize"]
        sent.append(total)
        context.close()
    return {
        "load_s": statistics.median(loads),
        "chart_drawn_s": statistics.median(drawn),
        "bytes": statistics.median(sent),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--log-mb", type=float, default=1.0)
    parser.add_argument("--json", type=Path, default=OUT / "chart_page_cold.json")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        print(f"needs Debian's chromium at {CHROMIUM} (apt-get install -y chromium)", file=sys.stderr)
        return 2

    OUT.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="chart-page-", dir=OUT))
    report_id, session = _prepare(workdir, args.log_mb)

    from playwright.sync_api import sync_playwright

    from dispatchlab.stack import manage, stack_env, stop_process

    base_env = stack_env(data_dir=workdir, DISPATCHLAB_ALLOWED_HOSTS="127.0.0.1")
    modes = {
        "before (plain names, uncompressed, 60 s cache)": {
            **base_env,
            "DISPATCHLAB_STATIC_MANIFEST": "false",
        },
        "now (hashed, Brotli/gzip, a year's cache)": {**base_env, "DISPATCHLAB_STATIC_MANIFEST": "true"},
    }
    started = time.perf_counter()
    manage(modes["now (hashed, Brotli/gzip, a year's cache)"], "collectstatic", "--noinput", "-v0")
    collect_s = time.perf_counter() - started

    results: dict[str, dict[str, float]] = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        for label, env in modes.items():
            process, base = _serve(env, workdir / "web.log")
            try:
                _cold_loads(
                    browser, base, f"/reports/{report_id}/", session, 1
                )  # warm the server, not the browser
                if label.startswith("before"):
                    results["reference: the full Plotly bundle (4.8 MB), plain"] = _cold_loads(
                        browser,
                        base,
                        f"/reports/{report_id}/",
                        session,
                        args.runs,
                        full_plotly=_full_plotly(),
                    )
                results[label] = _cold_loads(browser, base, f"/reports/{report_id}/", session, args.runs)
                if label.startswith("now"):  # the floor: a page of the same site without Plotly
                    floor = _cold_loads(browser, base, "/upload/", session, args.runs, chart=False)
            finally:
                stop_process(process)
        browser.close()

    print(f"report page {report_id} with its Plotly charts, cold browser cache, median of {args.runs} runs:")
    for label, figures in results.items():
        print(
            f"  {label:48s} {figures['bytes'] / 1e6:6.2f} MB sent  load {figures['load_s']:.3f} s  "
            f"chart drawn {figures['chart_drawn_s']:.3f} s"
        )
    print(
        f"  {'floor: the upload page (no Plotly), now':48s} {floor['bytes'] / 1e6:6.2f} MB sent  "
        f"load {floor['load_s']:.3f} s"
    )
    reference, before, now = results.values()
    print(
        f"  now / reference: bytes {now['bytes'] / reference['bytes']:.2f}x, load {now['load_s'] / reference['load_s']:.2f}x,"
        f" chart drawn {now['chart_drawn_s'] / reference['chart_drawn_s']:.2f}x;"
        f" now / before: bytes {now['bytes'] / before['bytes']:.2f}x, load {now['load_s'] / before['load_s']:.2f}x;"
        f" target: load < 0.5 s ({'met' if now['load_s'] < 0.5 else 'NOT met'});"
        f" collectstatic took {collect_s:.1f} s"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps({"report": report_id, "runs": args.runs, "results": results, "floor": floor}, indent=2)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
