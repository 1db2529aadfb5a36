from __future__ import annotations

import copy

from fixtures_docs import CRASH_DOC, FIXED_DOC

from dispatchlab.front.compare import compare_documents


def test_the_first_differing_backend_decision_is_the_earliest_decided_one():
    c = compare_documents(CRASH_DOC, FIXED_DOC)
    first = c.first_difference
    assert (first.model, first.key) == ("draft", "quantization")
    assert first.a.value == "mxfp4" and first.a.line == 1376 and first.a.source == "message"
    assert first.b.value is None


def test_a_main_backend_chosen_by_flag_comes_before_later_draft_messages():
    b = copy.deepcopy(CRASH_DOC)
    b["backends"]["moe_runner_backend"] = "flashinfer_cutlass"
    b["backend_origins"]["moe_runner_backend"] = {
        "value": "flashinfer_cutlass",
        "source": "flag",
        "line": 1,
        "text": "--moe-runner-backend flashinfer_cutlass",
    }
    c = compare_documents(CRASH_DOC, b)
    assert (c.first_difference.model, c.first_difference.key) == ("main", "moe_runner_backend")
    assert (c.first_difference.a.value, c.first_difference.b.value) == ("triton", "flashinfer_cutlass")
    # draft rows exist in both and are equal
    assert not any(row.differs for row in c.backends if row.model == "draft")


def test_identical_reports_have_no_difference():
    c = compare_documents(CRASH_DOC, copy.deepcopy(CRASH_DOC))
    assert c.first_difference is None
    assert c.args == []
    assert c.args_same == len(CRASH_DOC["server_args"])
    assert not any(row.differs for row in c.versions)


def test_arguments_only_one_report_sets_are_listed_apart_from_those_that_differ():
    c = compare_documents(CRASH_DOC, FIXED_DOC)
    assert c.args == [] and c.args_only_b == []
    assert [row.key for row in c.args_only_a] == [
        "speculative_algorithm",
        "speculative_eagle_topk",
        "speculative_moe_runner_backend",
        "speculative_num_draft_tokens",
        "speculative_num_steps",
    ]
    assert c.args_only_a[0].a == "EAGLE" and c.args_only_a[0].b == "(absent)"
    assert "Only the first report runs a draft" in c.notes[0]


def test_an_argument_both_set_to_different_values_is_a_difference_not_a_one_sided_one():
    b = copy.deepcopy(FIXED_DOC)
    b["server_args"]["mem_fraction_static"] = 0.5
    b["server_args"]["enable_metrics"] = True
    c = compare_documents(CRASH_DOC, b)
    assert [(row.key, row.b) for row in c.args] == [("mem_fraction_static", "0.5")]
    assert [(row.key, row.b) for row in c.args_only_b] == [("enable_metrics", "true")]
    assert c.args_same == len(set(CRASH_DOC["server_args"]) & set(b["server_args"])) - 1


def test_a_log_without_an_args_dump_is_said_to_print_none_rather_than_to_unset_them_all():
    b = copy.deepcopy(FIXED_DOC)
    b["server_args"] = {}
    c = compare_documents(CRASH_DOC, b)
    assert len(c.args_only_a) == len(CRASH_DOC["server_args"]) and c.args == []
    assert c.args_note.startswith("Only the first report's log prints its server arguments")
    assert compare_documents(CRASH_DOC, FIXED_DOC).args_note == ""


def test_two_reports_that_resolved_no_backend_are_not_said_to_have_the_same_backends():
    a, b = copy.deepcopy(CRASH_DOC), copy.deepcopy(FIXED_DOC)
    for doc in (a, b):
        doc["backends"], doc["draft_backends"] = {}, {}
    c = compare_documents(a, b)
    assert not c.backends_resolved and not c.backends_same and c.first_difference is None
    assert compare_documents(CRASH_DOC, copy.deepcopy(CRASH_DOC)).backends_same


def test_versions_keep_their_canonical_order_and_mark_changes():
    b = copy.deepcopy(CRASH_DOC)
    b["versions"]["flashinfer"] = "0.5.4"
    c = compare_documents(CRASH_DOC, b)
    assert [row.key for row in c.versions][:3] == ["sglang", "vllm", "torch"]
    flashinfer = next(row for row in c.versions if row.key == "flashinfer")
    assert flashinfer.differs and (flashinfer.a, flashinfer.b) == ("0.5.3", "0.5.4")


def test_phase_durations_are_compared_per_model_using_the_slowest_rank():
    c = compare_documents(CRASH_DOC, FIXED_DOC)
    rows = {(row.model, row.name): row for row in c.phases}
    capture = rows[("main", "cuda_graph_capture")]
    assert capture.a == 20.2 and capture.b == 18.4 and capture.delta == -1.8
    assert rows[("main", "serving")].a is None and rows[("main", "serving")].differs
    assert rows[("draft", "cuda_graph_capture")].b is None
    # main phases come first, in launch order
    assert [row.name for row in c.phases if row.model == "main"][:3] == ["init", "weight_loading", "kv_cache"]
