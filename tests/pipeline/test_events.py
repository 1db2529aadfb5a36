"""The apps hear of a parsed report through events (dispatchlab.events), on a real stack: a subscriber of
one's own (an extra app) that raises does not fail the upload, is retried until it works, and the
other subscribers (decisions, notifications) run regardless."""

from __future__ import annotations

import dataclasses
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.pipeline

PLUGINS = Path(__file__).resolve().parent / "plugins"


def _wait_for(check: Callable[[], object], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout} s")


def test_a_subscriber_that_raises_is_retried_and_neither_the_upload_nor_the_other_subscribers_suffer(
    stack_with, tmp_path, crash_log, monkeypatch
):
    monkeypatch.syspath_prepend(str(PLUGINS))
    from flaky_subscriber.apps import FAILURES_PER_REPORT, attempts_file

    python_path = os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")]))
    with stack_with(tmp_path, DISPATCHLAB_EXTRA_APPS="flaky_subscriber", PYTHONPATH=python_path) as stack:
        project = f"events-{secrets.token_hex(4)}"
        token = stack.manage("apitoken", "--user", "ci", "--project", project, "--create").split()[-1]
        # An endpoint nobody listens on: the stored event shows notify's subscriber ran.
        stack.manage(
            "notifyendpoint", "--project", project, "--url", "http://127.0.0.1:9/hook", "--event", "group.new"
        )
        record = stack.manage(
            "shell",
            "-c",
            "from dispatchlab.decisions.services import decision_create\n"
            "from dispatchlab.reports.models import Project\n"
            f"project = Project.objects.get(name={project!r})\n"
            "data = {'title': 'Lower the static memory fraction', 'status': 'accepted',\n"
            "        'links': {'signatures': ['cuda-out-of-memory']}}\n"
            "print(decision_create(project=project, user=None, data=data).id)",
        )
        record_id = int(record.split()[-1])
        mine = dataclasses.replace(stack, token=token)

        report = mine.wait_finished(mine.upload([("server.log", crash_log)])["id"])

        assert report["status"] == "done", report["error"]
        attempts = attempts_file(tmp_path, report["id"])
        _wait_for(lambda: "handled" in (attempts.read_text() if attempts.exists() else ""), "handled")
        assert attempts.read_text().count("attempt") == FAILURES_PER_REPORT + 1
        assert stack.worker_log_count(f"flaky subscriber fails on report {report['id']}") >= 1
        # decisions ran: the document lists the record linked to its signature
        _wait_for(lambda: mine.get(report["id"])["document"].get("decisions"), "decisions listed")
        assert [ref["id"] for ref in mine.get(report["id"])["document"]["decisions"]] == [record_id]
        # notify ran: the new group is an event for the project's endpoint
        group_id = stack.row(report["id"])["group_id"]
        events = stack.sql("SELECT kind, payload FROM notify_event WHERE group_id = %s", (group_id,))
        assert [kind for kind, _ in events] == ["group.new"]
        assert events[0][1]["report"]["id"] == report["id"]
