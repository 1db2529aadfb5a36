"""schemathesis against the running app: gunicorn serves /api/schema/ (generated from the code), and
every operation in it is fuzzed over real HTTP as four callers (bench/api_fuzz.py holds the fuzzer, and
prints the same run for people). No request may fail the server, every answer must be one the document
describes, and no caller may get what its role does not allow."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from typing import Any

import pytest

from tests.pipeline.conftest import ROOT, Stack

pytestmark = pytest.mark.pipeline

EXAMPLES = 12  # valid requests per operation and caller (and half as many invalid ones): ~1,100 in all


def _fuzzer() -> Any:
    spec = importlib.util.spec_from_file_location("api_fuzz", ROOT / "bench" / "api_fuzz.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["api_fuzz"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _token(stack: Stack, *args: str) -> str:
    return stack.manage("apitoken", *args).strip().splitlines()[-1]


def test_the_running_api_answers_fuzzed_requests_as_its_document_says(stack: Stack):
    fuzz = _fuzzer()
    # A project of its own, so the pipeline's other tests never see the fuzzer's records.
    member = {"Authorization": "Bearer " + _token(stack, "--user", "fuzzer", "--project", "fuzz", "--create")}
    read_only = {
        "Authorization": "Bearer " + _token(stack, "--user", "fuzzer", "--project", "fuzz", "--read-only")
    }
    other = {
        "Authorization": "Bearer " + _token(stack, "--user", "outsider", "--project", "elsewhere", "--create")
    }
    seeds = fuzz.seed_objects(stack.base_url, member, confirm=False)
    # Confirm runs of the seeded report wait in a queue no GPU worker of these tests reads (removed with
    # the run's other keys), not in the plain GPU queue that test_gpu_confirm's worker takes from.
    report = seeds["/api/v1/reports/{id}"]
    stack.sql("UPDATE reports_report SET arch = 'sm_1' WHERE id = %s", (report,))
    seeds["/api/v1/confirms/{id}"] = fuzz.seed_confirm(stack.base_url, member, report)
    callers = [
        fuzz.Caller("member", member, may_write=True),
        fuzz.Caller("read-only", read_only),
        fuzz.Caller("other project", other, may_write=True, outsider=True),
        fuzz.Caller("no token", {}),
    ]

    run = fuzz.fuzz(stack.base_url, callers, seeds=seeds, victim="fuzz", examples=EXAMPLES)

    fuzz.print_run(run, callers)  # shown by pytest when the test fails
    statuses: Counter[int] = Counter()
    for tally in run.tallies.values():
        statuses.update(tally.statuses)
    operations = {op for op, _ in run.tallies}
    assert len(operations) >= 17 and run.cases >= len(operations) * len(callers) * EXAMPLES
    assert not [code for code in statuses if code >= 500], statuses
    assert {200, 201, 400, 401, 403, 404} <= set(statuses)  # the fuzzer reached every kind of answer
    assert not run.problems, "\n\n".join(
        f"{p.operation} as {p.caller}: {p.what}\n  {p.curl}" for p in run.problems[:10]
    )
