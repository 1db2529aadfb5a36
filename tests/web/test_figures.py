"""Plotly figures are plain dicts: test them as dicts."""

from __future__ import annotations

import copy
import datetime as dt
import json

from fixtures_docs import CRASH_DOC, FIXED_DOC, VLLM_OOM_DOC, hostile_doc

from dispatchlab.front.figures import (
    plot_text,
    sparkline_svg,
    throughput_figure,
    timeline_figure,
    timeline_positions,
)


def _trace(fig, name):
    return next(t for t in fig["data"] if t["name"] == name)


def test_it_draws_a_lane_per_rank_and_model_main_before_draft():
    fig = timeline_figure(CRASH_DOC)
    lanes = fig["meta"]["lanes"]
    assert lanes[:4] == ["main", "TP0 main", "TP0 draft", "TP1 main"]
    assert lanes[-1] == "TP3 draft"
    # Plotly draws the first category at the bottom, so the array is reversed to read top-down
    assert fig["layout"]["yaxis"]["categoryarray"] == list(reversed(lanes))


def test_it_uses_time_when_the_log_has_timestamps_and_lines_otherwise():
    assert timeline_figure(CRASH_DOC)["layout"]["xaxis"]["type"] == "date"
    fig = timeline_figure(VLLM_OOM_DOC)
    assert fig["layout"]["xaxis"]["type"] == "linear"
    assert fig["layout"]["xaxis"]["title"]["text"] == "log line"


def test_it_draws_phases_as_horizontal_bars_one_trace_per_phase():
    fig = timeline_figure(CRASH_DOC)
    bars = [t for t in fig["data"] if t["type"] == "bar"]
    assert {t["name"] for t in bars} == {
        "init",
        "weight loading",
        "KV cache",
        "CUDA graph capture",
    }
    capture = _trace(fig, "CUDA graph capture")
    assert capture["orientation"] == "h"
    assert "TP0 draft" in capture["y"] and "TP0 main" in capture["y"]
    # date axis: bars start at a timestamp and are as wide as the phase in milliseconds
    i = capture["y"].index("TP0 main")
    assert capture["base"][i].startswith("2025-11-20 09:15:50")
    assert capture["x"][i] == 20200.0


def test_an_unfinished_phase_runs_until_the_crash():
    fig = timeline_figure(VLLM_OOM_DOC)
    kv = _trace(fig, "KV cache")
    assert kv["base"] == [481]
    assert kv["x"] == [512 - 481]
    assert "did not finish" in kv["customdata"][0][0]


def test_backend_decisions_are_markers_whose_hover_is_the_log_message():
    fig = timeline_figure(CRASH_DOC)
    decisions = _trace(fig, "backend decision")
    assert decisions["mode"] == "markers"
    by_line = {
        line: (lane, hover)
        for lane, (hover, line) in zip(decisions["y"], decisions["customdata"], strict=True)
    }
    lane, hover = by_line[1388]
    assert lane == "TP0 draft"
    assert "Mxfp4MoEMethod: using flashinfer_trtllm_routed for MXFP4 experts" in hover
    assert _trace(fig, "warning")["customdata"][0][1] == 1296


def test_the_crash_is_a_red_x_on_every_crashed_rank_with_the_exception_on_hover():
    fig = timeline_figure(CRASH_DOC)
    crash = _trace(fig, "crash")
    assert crash["marker"]["symbol"] == "x"
    assert crash["marker"]["color"] == "#d62728"
    assert crash["y"] == ["TP0 draft", "TP1 draft", "TP2 draft", "TP3 draft"]
    hover, line = crash["customdata"][0]
    assert line == 1450
    assert "RuntimeError" in hover and "trtllm_fp4_block_scale_routed_moe" in hover
    assert "cuda_graph_capture" in hover


def test_every_point_carries_its_log_line_for_click_through():
    fig = timeline_figure(CRASH_DOC)
    for trace in fig["data"]:
        for hover, line in trace["customdata"]:
            assert isinstance(line, int) and line > 0
            assert hover


def test_log_text_in_a_figure_cannot_become_markup():
    fig = timeline_figure(hostile_doc())
    text = json.dumps(fig)
    assert "<script" not in text and "<img" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_plot_text_escapes_wraps_and_cuts():
    assert plot_text("<b>x</b> & y") == "&lt;b&gt;x&lt;/b&gt; &amp; y"
    wrapped = plot_text("word " * 50, width=20)
    assert wrapped.count("<br>") >= 10
    assert plot_text("x" * 5000, limit=100).endswith("…")
    assert plot_text(None) == ""


def test_a_document_with_nothing_to_draw_has_no_timeline():
    assert timeline_figure({"timeline": [], "phases": []}) is None


def test_throughput_chart_only_when_the_log_has_batch_metrics():
    assert throughput_figure(CRASH_DOC) is None
    fig = throughput_figure(FIXED_DOC)
    names = [t["name"] for t in fig["data"]]
    assert names == ["generation tok/s", "prefill tok/s", "running requests", "queued requests"]
    gen = fig["data"][0]
    assert len(gen["x"]) == 60 and gen["y"][0] == 180.0
    assert [t["yaxis"] for t in fig["data"]] == ["y", "y2", "y3", "y3"]
    assert fig["layout"]["xaxis"]["type"] == "date"


def test_throughput_follows_one_rank_and_says_when_points_were_sampled():
    doc = {
        "metrics": {
            "points": [
                {"line": n, "time": None, "rank": rank, "kind": "decode", "gen_throughput": 10.0 + n}
                for n in range(1, 50)
                for rank in (["TP0", "TP1"] if n % 2 else ["TP0"])
            ],
            "total": 5000,
            "sampled_every": 50,
        }
    }
    fig = throughput_figure(doc)
    assert fig["meta"]["rank"] == "TP0"
    assert len(fig["data"][0]["x"]) == 49
    assert "1 in 50 of 5000 points" in fig["layout"]["title"]["text"]
    assert fig["layout"]["xaxis"]["type"] == "linear"


def test_sparkline_is_inline_svg_with_a_bar_per_day():
    svg = str(sparkline_svg([0, 1, 4, 2]))
    assert svg.startswith("<svg") and svg.count("<rect") == 4
    assert 'height="24.0"' in svg  # the busiest day fills the height
    assert "7 in the last 4 days" in svg
    assert str(sparkline_svg([])).count("<rect") == 1


def test_throughput_draws_the_same_number_of_points_for_any_log_size():
    points = [
        {"line": n, "time": None, "rank": "TP0", "kind": "decode", "gen_throughput": 1.0}
        for n in range(1, 2001)
    ]
    fig = throughput_figure({"metrics": {"points": points, "total": 200_000, "sampled_every": 100}})
    assert len(fig["data"][0]["x"]) == 500
    assert "1 in 400 of 200000 points" in fig["layout"]["title"]["text"]


def test_a_rank_named_with_a_unicode_digit_still_gets_a_lane():
    doc = copy.deepcopy(VLLM_OOM_DOC)
    doc["timeline"] = [
        {"line": 1, "time": None, "rank": "²", "kind": "warning", "name": "slow", "detail": "slow"},
        {"line": 2, "time": None, "rank": "TP1", "kind": "error", "name": "exception", "detail": "boom"},
    ]
    lanes = timeline_figure(doc)["meta"]["lanes"]
    assert any(lane.startswith("²") for lane in lanes) and any(lane.startswith("TP1") for lane in lanes)


def test_a_sparkline_with_its_first_day_has_a_count_axis_and_a_date_axis():
    svg = str(sparkline_svg([0, 3, 0, 1], width=300, height=100, first_day=dt.date(2025, 12, 30)))
    labels = [text.split(">")[-1] for text in svg.split("</text>")[:-1]]
    assert labels[:2] == ["0", "3"]  # the count axis: zero and the busiest day
    assert labels[2] == "Dec 30" and labels[-1] == "Jan 2"  # dates below, across the year's end
    assert "<title>Dec 31: 3 reports</title>" in svg and "<title>Jan 1: 0 reports</title>" in svg
    assert "Dec 30 to Jan 2" in svg
    bars = [float(part.split('"')[0]) for part in svg.split('<rect x="')[1:]]
    assert min(bars) > 10  # bars start right of the count labels, not under them


def test_a_vllm_timeline_without_a_year_shows_day_and_time_not_1900():
    doc = copy.deepcopy(CRASH_DOC)
    for event in doc["timeline"]:
        if event.get("time"):
            event["time"] = "1900-" + event["time"][5:]
    for phase in doc["phases"]:
        for key in ("start", "end"):
            if phase.get(key):
                phase[key] = "1900-" + phase[key][5:]
    axis = timeline_figure(doc)["layout"]["xaxis"]
    assert axis["type"] == "date" and "%Y" not in axis["tickformat"] and "no year" in axis["title"]["text"]
    assert "tickformat" not in timeline_figure(CRASH_DOC)["layout"]["xaxis"]


def test_a_timeline_counts_its_distinct_places_on_the_axis():
    assert timeline_positions(CRASH_DOC) > 10
    short = {
        "timeline": [
            {"line": 1, "time": "2025-12-02T14:03:11", "kind": "backend", "name": "server_args"},
            {"line": 3, "time": None, "kind": "error", "name": "traceback"},
            {"line": 3, "time": None, "kind": "error", "name": "crash"},
        ],
        "phases": [],
        "crash": {"line": 3},
    }
    assert timeline_positions(short) == 2
