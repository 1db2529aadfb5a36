"""A crash loop through the dashboard: an upload of a 134 MB crash loop to a finished report, then its page.

    python bench/dashboard_crash_loop.py [--size 134MB] [--runs 20] [--json bench/out/dashboard_crash_loop.json]

The log is bench/shapes.py's crash loop (one real-shaped SGLang crash restarted by a supervisor, ~4,000
times in 134 MB). It goes through the real pipeline in this process, as bench/report_pages.py does:
`report_submit`, then `report_analyze` (parse, match, the text copy and line index the log viewer pages
through) into a throw-away SQLite database under bench/out/; "parse alone" is `analyze_paths` on the same
file. The report page and the log viewer at the crash are then requested through Django's test client as a
logged-in member (server time: URL resolution, middleware, queries, rendering).

Targets (issue #19): the upload is a finished report in under 3 s of analysis; its page answers in under
0.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import OUT, parse_size
from report_pages import _setup_django, _time_pair
from shapes import crash_loop

TARGET_ANALYZE_S = 3.0
TARGET_PAGE_S = 0.5


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=parse_size, default=134 * 1000 * 1000, help="bytes: 134MB, 1GiB")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", type=Path, default=OUT / "dashboard_crash_loop.json")
    args = parser.parse_args()

    OUT.mkdir(parents=True, exist_ok=True)
    log = OUT / "shapes" / f"crash_loop-{int(args.size)}.log"
    if not log.exists():
        log.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {log.name} ...", file=sys.stderr)
        crash_loop(log.with_suffix(".tmp"), int(args.size))
        log.with_suffix(".tmp").rename(log)
    workdir = Path(tempfile.mkdtemp(prefix="dashboard-crash-loop-", dir=OUT))
    _setup_django(workdir)

    from django.contrib.auth.models import User
    from django.core.files import File
    from django.test import Client

    from dispatchlab.core import analyze_paths
    from dispatchlab.reports.analysis import report_analyze
    from dispatchlab.reports.models import Membership, Project, Report
    from dispatchlab.reports.submit import report_submit

    analyze_paths([log])  # warm: compiled rules, knowledge base, the file in the OS cache
    started = time.perf_counter()
    alone = analyze_paths([log])
    parse_alone = time.perf_counter() - started

    project = Project.objects.create(name="bench", slug="bench")
    user = User.objects.create_user("alice", password="x")
    Membership.objects.create(user=user, project=project, role="member")
    with log.open("rb") as handle:
        report, _ = report_submit(
            project=project, user=user, files=[File(handle, name=log.name)], title=log.name
        )
    started = time.perf_counter()
    outcome = report_analyze(report_id=report.pk)
    analyzed = time.perf_counter() - started
    report.refresh_from_db()
    assert report.status == Report.Status.DONE, (outcome, report.error)
    document = report.document or {}
    runs = len(document.get("runs") or []) + int(document.get("runs_omitted") or 0)

    client = Client()
    client.force_login(user)
    crash = (document.get("crash") or {}).get("line") or report.line_count
    urls = {"report": f"/reports/{report.pk}/", "log at the crash": f"/reports/{report.pk}/log/?line={crash}"}
    pages = _time_pair(client, urls, args.runs)

    page_ok = pages["report"]["median_ms"] / 1000 < TARGET_PAGE_S
    analyze_ok = analyzed < TARGET_ANALYZE_S
    print(
        f"cores: {os.cpu_count()}, log: {log.stat().st_size / 1e6:,.0f} MB, {report.line_count:,} lines, {runs:,} runs"
    )
    print(f"diagnosis: {document.get('failure_class')} ({alone.get('failure_class')} by analyze_paths alone)")
    print(f"parse alone (analyze_paths):          {parse_alone:6.2f} s")
    print(
        f"upload to finished report (analyze):  {analyzed:6.2f} s   target < {TARGET_ANALYZE_S:g} s  "
        f"{'ok' if analyze_ok else 'MISSED'}"
    )
    for name, numbers in pages.items():
        judged = ("ok" if page_ok else "MISSED") if name == "report" else "info"
        print(
            f"{name + ' page':<38}{numbers['median_ms'] / 1000:6.3f} s   (p90 {numbers['p90_ms'] / 1000:.3f} s, "
            f"{numbers['bytes'] / 1024:.0f} KiB)  {'target < 0.5 s  ' if name == 'report' else ''}{judged}"
        )
    result = {
        "log_bytes": log.stat().st_size,
        "lines": report.line_count,
        "runs": runs,
        "parse_alone_s": round(parse_alone, 2),
        "analyze_s": round(analyzed, 2),
        "pages": pages,
        "targets_met": analyze_ok and page_ok,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if analyze_ok and page_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
