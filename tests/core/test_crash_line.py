"""One line for the crash everywhere: the document's crash line, the summary, the runs and the diagnosis's
crash evidence name the same line, on every fixture log the project ships."""

from __future__ import annotations

import re

from dispatchlab.core import summary
from dispatchlab.core.api import analyze_paths
from dispatchlab.core.crashline import crash_line

from .helpers import ROOT

FIXTURE_LOGS = sorted((ROOT / "tests" / "fixtures").rglob("*.log"))
PASTED_TRACEBACK = """\
Traceback (most recent call last):
  File "/usr/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py", line 2410, in run_scheduler_process
    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)
  File "/usr/lib/python3.12/site-packages/sglang/srt/model_executor/model_runner.py", line 312, in initialize
    self.init_memory_pool()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB
"""


def _disagreements(doc: dict) -> list[str]:
    crash = doc["crash"]
    at = crash_line(doc)
    wrong = []
    if at != crash.get("exception_line"):
        wrong.append(f"crash line {at} is not exception_line {crash.get('exception_line')}")
    said = re.search(r"^CRASH +line (\d+)", summary.render_summary(doc), re.M)
    if said is None or int(said.group(1)) != at:
        wrong.append(f"the summary names {said and said.group(1)}")
    runs = doc.get("runs") or []
    if runs and runs[-1]["crash_line"] != at:
        wrong.append(f"the last run names {runs[-1]['crash_line']}")
    for match in doc.get("matches") or []:
        if match["source"] == "exception" and match["evidence"][0]["line"] != at:
            wrong.append(f"the terminal card's crash evidence names {match['evidence'][0]['line']}")
    tb = next((t for t in doc["tracebacks"] if t["line"] == crash["line"]), None)
    if tb is not None and not crash["line"] <= at <= (tb["end_line"] or crash["line"]):
        wrong.append(f"{at} is outside the fatal traceback {crash['line']}-{tb['end_line']}")
    return wrong


def test_every_fixture_log_names_one_line_for_its_crash():
    assert len(FIXTURE_LOGS) > 500
    crashed, problems = 0, {}
    for log in FIXTURE_LOGS:
        doc = analyze_paths([log])
        if doc["crash"] is None:
            continue
        crashed += 1
        wrong = _disagreements(doc)
        if wrong:
            problems[str(log.relative_to(ROOT))] = wrong
    assert crashed > 300
    assert problems == {}


def test_a_pasted_traceback_points_at_its_exception_not_its_first_line(tmp_path):
    log = tmp_path / "paste.txt"
    log.write_text(PASTED_TRACEBACK)
    doc = analyze_paths([log])
    assert doc["crash"]["line"] == 1 and crash_line(doc) == 6
    assert doc["matches"][0]["evidence"][0]["line"] == 6
    assert "CRASH    line 6 " in summary.render_summary(doc)


def test_an_older_document_finds_its_exception_line_in_the_log_text():
    doc = {"crash": {"line": 3, "exception": "torch.OutOfMemoryError", "message": "CUDA out of memory"}}
    text = ["Traceback (most recent call last):", '  File "x.py", line 1, in f', "OutOfMemoryError: CUDA"]
    lines = ["INFO start", "INFO more", *text]

    def read_lines(first: int, count: int) -> list[tuple[str, int]]:
        return [(line, len(line)) for line in lines[first - 1 : first - 1 + count]]

    assert crash_line(doc) == 3, "without the text the traceback head is the answer"
    assert crash_line(doc, read_lines) == 5
    assert crash_line({"crash": None}) is None
