"""Every crash pointer of the report page and the log viewer names the same line: "Jump to crash", the
diagnosis's crash line, the evidence marked as the crash, the timeline's crash marker (or the crash item
of the event list), and the log viewer's button and highlighted row."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from dispatchlab.core.api import analyze_paths
from dispatchlab.core.crashline import crash_line
from dispatchlab.reports.groups import report_columns
from dispatchlab.reports.models import Membership, Project, Report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# the crashing golden logs and terminal-exception logs, and short pastes of vLLM and SGLang crashes
SERVING = {"sglang_h100_serving.log", "vllm_request_error_keeps_serving.log"}
LOGS = [
    *sorted(p for p in (FIXTURES / "logs").glob("*.log") if p.name not in SERVING),
    *sorted(p for p in (FIXTURES / "terminal").glob("*.log") if p.name not in SERVING),
    FIXTURES / "cases" / "vllm-27508.log",
    FIXTURES / "cases" / "sglang-24972.log",
    FIXTURES / "cases" / "sglang-3582.log",
    FIXTURES / "cases-locked" / "unsloth-3366.log",
]


def report_from_log(project: Project, user: User, log: Path, folder: Path) -> Report:
    folder.mkdir()
    text, index = folder / "text.log", folder / "lines.idx"
    doc = json.loads(json.dumps(analyze_paths([log], line_index=(text, index))))
    return Report.objects.create(
        project=project,
        title=log.name,
        status="done",
        checksum=f"{Report.objects.count() + 1:064x}",
        created_by=user,
        document=doc,
        text_path=str(text),
        index_path=str(index),
        line_count=doc["line_count"],
        **report_columns(doc),
    )


def _page_pointers(html: str) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {
        "jump to crash": [int(n) for n in re.findall(r"Jump to crash · L(\d+)", html)],
        "diagnosis crash line": [
            int(n) for n in re.findall(r'<p class="crash-line">.*?href="[^"]*#L(\d+)"', html, re.S)
        ],
        "evidence marked crash": [
            int(n)
            for n in re.findall(
                r'<li class="evidence-crash"><a class="evidence-link" href="[^"]*#L(\d+)"', html
            )
        ],
        "event list crash": [
            int(n) for n in re.findall(r'<li class="event event-crash"><a href="[^"]*#L(\d+)"', html)
        ],
    }
    figure = re.search(r'<script id="timeline-fig" type="application/json">(.*?)</script>', html, re.S)
    if figure:
        traces = json.loads(figure.group(1))["data"]
        found["timeline crash marker"] = [
            point[1] for trace in traces if trace.get("name") == "crash" for point in trace["customdata"]
        ]
    return found


@pytest.mark.django_db
@pytest.mark.parametrize("log", LOGS, ids=[log.name for log in LOGS])
def test_every_crash_pointer_names_the_same_line(log: Path, tmp_path: Path):
    project = Project.objects.create(name="Lab", slug="lab")
    alice = User.objects.create_user("alice", password="password")
    Membership.objects.create(user=alice, project=project, role="member")
    report = report_from_log(project, alice, log, tmp_path / "r")
    at = crash_line(report.document)
    assert at is not None
    client = Client()
    client.force_login(alice)
    html = client.get(reverse("front:report", args=[report.pk])).content.decode()
    pointers = _page_pointers(html)
    assert pointers["jump to crash"] == [at]
    assert pointers["diagnosis crash line"] == [at]
    assert pointers.get("timeline crash marker") or pointers["event list crash"], (
        "the timeline shows the crash"
    )
    top = report.document["matches"][0]
    if any(item["line"] == at for item in top["evidence"]):
        assert pointers["evidence marked crash"] == [at], "the evidence says which of its lines is the crash"
    for name, lines in pointers.items():
        assert set(lines) <= {at}, f"{name} names {lines}, the crash is L{at}"

    viewer = client.get(reverse("front:log", args=[report.pk])).content.decode()
    assert re.findall(r"Jump to crash · L(\d+)", viewer) == [str(at)]
    centred = client.get(reverse("front:log", args=[report.pk]), {"line": at}).content.decode()
    assert re.findall(r'<tr id="L(\d+)" class="[^"]*\bcrash\b', centred) == [str(at)]
