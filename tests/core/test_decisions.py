"""Decision records in the core: reading an export, attaching records to a match document, staleness from
the log's versions, and `dispatchlab match LOG --decisions FILE` saying what the report page says."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import pytest

from dispatchlab.core import analyze_paths
from dispatchlab.core.decisions import (
    DecisionRecord,
    DecisionsReadError,
    DecisionStatus,
    alternatives_from_tried,
    attach_decisions,
    decision_sentence,
    document_versions,
    draft_from_document,
    load_decisions,
    revisit_hit,
)
from tests.core.helpers import LOGS, run_cli

CANONICAL = LOGS / "sglang_dsv4_eagle_sm120.log"
TOP = "spec-draft-mxfp4-trtllm-moe-non-sm100"
SECOND = "trtllm-gen-moe-on-non-sm100"


@functools.cache
def _canonical() -> dict[str, Any]:
    return analyze_paths([CANONICAL])


def canonical() -> dict[str, Any]:
    return copy.deepcopy(_canonical())


def exported(**overrides: Any) -> dict[str, Any]:
    """A record as GET /api/v1/decisions?format=export gives it."""
    record: dict[str, Any] = {
        "id": 31,
        "number": 7,
        "label": "DR-7",
        "project": "acme",
        "title": "MTP off on sm_120 until flashinfer ships SM120 trtllm-gen kernels",
        "status": "accepted",
        "context": "The draft's MXFP4 MoE picks an SM100-only kernel.",
        "decision": "Launch without `--speculative-algorithm` on sm_120.",
        "consequences": "Lower decode throughput.",
        "alternatives": [{"what": "--speculative-moe-runner-backend triton", "outcome": "same crash"}],
        "links": {"groups": [], "signatures": [TOP], "reports": [], "upstream": []},
        "revisit_when": {"flashinfer": ">=0.7"},
        "superseded_by": None,
        "stale": False,
        "stale_reason": None,
        "status_since": "2026-11-02",
        "author": "alice",
        "created": "2026-11-01T10:00:00+00:00",
        "updated": "2026-11-02T10:00:00+00:00",
    }
    record.update(overrides)
    return record


def write_export(tmp_path: Path, *records: dict[str, Any]) -> Path:
    path = tmp_path / "export.json"
    path.write_text(json.dumps({"decisions": list(records)}))
    return path


def test_an_export_reads_as_records(tmp_path):
    (record,) = load_decisions(write_export(tmp_path, exported()))
    assert record.number == 7 and record.label == "DR-7" and record.status == DecisionStatus.ACCEPTED
    assert record.signatures == (TOP,) and record.revisit_when == {"flashinfer": ">=0.7"}


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("not json", "is not JSON"),
        ('{"results": 3}', 'expected {"decisions": [...]}'),
        (
            json.dumps({"decisions": [exported(number="seven")]}),
            "decisions[0]: 'number' must be a positive integer",
        ),
        (json.dumps({"decisions": [exported(status="done")]}), "decisions[0]: 'status' must be one of"),
        (
            json.dumps({"decisions": [exported(revisit_when={"flashinfer": "newer"})]}),
            "revisit_when.flashinfer",
        ),
    ],
)
def test_a_bad_export_names_the_file_and_the_record(tmp_path, content, says):
    path = tmp_path / "export.json"
    path.write_text(content)
    with pytest.raises(DecisionsReadError) as raised:
        load_decisions(path)
    assert str(path) in str(raised.value) and says in str(raised.value)


def test_a_record_linked_to_the_top_signature_lands_on_the_document_and_on_its_match():
    document = canonical()
    records = [DecisionRecord.from_dict(exported(revisit_when={}))]
    attach_decisions(document, records)
    expected = {
        "id": 31,
        "number": 7,
        "title": exported()["title"],
        "status": "accepted",
        "stale": False,
        "stale_reason": None,
        "status_since": "2026-11-02",
    }
    assert document["decisions"] == [expected]
    assert document["matches"][0]["id"] == TOP and document["matches"][0]["decisions"] == [expected]
    assert all(m["decisions"] == [] for m in document["matches"][1:])


def test_a_record_linked_to_a_lower_match_is_listed_on_that_match_only():
    document = canonical()
    records = [DecisionRecord.from_dict(exported(links={"signatures": [SECOND]}))]
    attach_decisions(document, records)
    assert document["decisions"] == []
    (second,) = [m for m in document["matches"] if m["id"] == SECOND]
    assert [ref["number"] for ref in second["decisions"]] == [7]


def test_a_record_linked_to_the_fingerprint_or_the_report_concerns_the_document():
    document = canonical()
    by_group = DecisionRecord.from_dict(exported(id=1, number=1, links={"groups": [document["fingerprint"]]}))
    by_report = DecisionRecord.from_dict(exported(id=2, number=2, links={"reports": [55]}))
    elsewhere = DecisionRecord.from_dict(exported(id=3, number=3, links={"groups": ["0123456789abcdef"]}))
    attach_decisions(document, [by_group, by_report, elsewhere], report_id=55)
    assert [ref["number"] for ref in document["decisions"]] == [2, 1]  # newest first


def test_accepted_records_come_before_proposed_rejected_and_superseded_ones():
    document = canonical()
    records = [
        DecisionRecord.from_dict(exported(id=n, number=n, status=status))
        for n, status in enumerate(["superseded", "rejected", "proposed", "accepted"], start=1)
    ]
    attach_decisions(document, records)
    assert [ref["status"] for ref in document["decisions"]] == [
        "accepted",
        "proposed",
        "rejected",
        "superseded",
    ]


def test_a_log_that_shows_a_version_past_revisit_when_makes_the_record_stale_and_says_why():
    document = canonical()
    assert document["versions"]["flashinfer"] == "0.6.3"
    record = DecisionRecord.from_dict(exported(revisit_when={"sglang": ">0.5.23", "flashinfer": ">=0.6"}))
    attach_decisions(document, [record])
    (ref,) = document["decisions"]
    assert ref["stale"] is True
    assert ref["stale_reason"] == "this log shows flashinfer 0.6.3, which matches flashinfer>=0.6"


def test_a_version_before_revisit_when_leaves_the_record_as_it_is():
    document = canonical()
    attach_decisions(document, [DecisionRecord.from_dict(exported(revisit_when={"flashinfer": ">=0.7"}))])
    assert document["decisions"][0]["stale"] is False


def test_a_record_the_dashboard_marked_stale_keeps_its_reason():
    document = canonical()
    reason = "report 12 shows flashinfer 0.7.1, which matches flashinfer>=0.7"
    attach_decisions(document, [DecisionRecord.from_dict(exported(stale=True, stale_reason=reason))])
    assert document["decisions"][0]["stale_reason"] == reason


def test_a_superseded_record_never_turns_stale():
    document = canonical()
    record = DecisionRecord.from_dict(exported(status="superseded", revisit_when={"flashinfer": ">=0.1"}))
    attach_decisions(document, [record])
    assert document["decisions"][0]["stale"] is False


def test_the_servers_own_version_comes_from_server_version_and_local_builds_still_match():
    versions = document_versions(
        {"server": "vllm", "server_version": "0.11.2", "versions": {"torch": "2.9.1+cu129"}}
    )
    assert versions == {"vllm": "0.11.2", "torch": "2.9.1+cu129"}
    assert revisit_hit({"vllm": ">=0.11"}, versions) is not None
    assert revisit_hit({"torch": "==2.9.1"}, versions) is not None
    assert revisit_hit({"Flashinfer-Python": ">=0.1"}, {"flashinfer": "0.6.3"}) is not None
    assert revisit_hit({"torch": ">=2.10"}, versions) is None
    assert revisit_hit({"cuda": ">=13"}, versions) is None  # the log does not show it: nothing to say


def test_tried_and_failed_strings_become_alternatives_with_their_outcome():
    tried = [
        "--speculative-moe-runner-backend triton: same crash: the draft's MXFP4 quant method ignores it",
        "a bare note",
    ]
    assert alternatives_from_tried(tried) == [
        {
            "what": "--speculative-moe-runner-backend triton",
            "outcome": "same crash: the draft's MXFP4 quant method ignores it",
        },
        {"what": "a bare note", "outcome": ""},
    ]


def test_a_draft_from_a_diagnosis_has_its_title_alternatives_and_links():
    document = canonical()
    draft = draft_from_document(document)
    assert draft["title"] == document["matches"][0]["title"]
    assert draft["alternatives"][0]["what"] == "--speculative-moe-runner-backend triton"
    assert draft["groups"] == [document["fingerprint"]] and draft["signatures"] == [TOP]


def test_the_sentence_names_status_date_title_and_number():
    ref = {"status": "accepted", "status_since": "2026-11-02", "title": "MTP off on sm_120", "number": 7}
    assert decision_sentence(ref) == "Accepted 2026-11-02: MTP off on sm_120, DR-7"


def test_dispatchlab_match_with_decisions_prints_the_linked_record(tmp_path):
    path = write_export(
        tmp_path, exported(), exported(id=32, number=8, title="Unrelated", links={"signatures": ["x"]})
    )
    result = run_cli("match", str(CANONICAL), "--decisions", str(path))
    assert result.returncode == 0, result.stderr
    assert (
        "Accepted 2026-11-02: MTP off on sm_120 until flashinfer ships SM120 trtllm-gen kernels, DR-7"
        in result.stdout
    )
    part = result.stdout.split("decisions where this failure recurs")[1]
    assert "DR-8" not in part and "stale" not in part


def test_dispatchlab_match_with_decisions_says_when_the_log_makes_a_record_stale(tmp_path):
    path = write_export(tmp_path, exported(revisit_when={"flashinfer": ">=0.6"}))
    result = run_cli("match", str(CANONICAL), "--decisions", str(path), "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    (ref,) = document["decisions"]
    assert ref["stale"] is True and "this log shows flashinfer 0.6.3" in ref["stale_reason"]
    assert document["matches"][0]["decisions"] == [ref]
    text = run_cli("match", str(CANONICAL), "--decisions", str(path)).stdout
    assert "stale: this log shows flashinfer 0.6.3, which matches flashinfer>=0.6" in text


def test_dispatchlab_match_says_when_no_record_concerns_the_failure(tmp_path):
    path = write_export(tmp_path, exported(links={"signatures": ["other"]}))
    result = run_cli("match", str(CANONICAL), "--decisions", str(path))
    assert "decisions  none recorded for this failure (of 1 in the file)" in result.stdout


def test_an_unreadable_decisions_file_exits_1_with_one_line(tmp_path):
    result = run_cli("match", str(CANONICAL), "--decisions", str(tmp_path / "missing.json"))
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and "missing.json" in result.stderr


def test_parse_has_no_decisions_option():
    assert run_cli("parse", str(CANONICAL), "--decisions", "x.json").returncode == 2
