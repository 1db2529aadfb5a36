"""Files that hold several runs: a supervisor restarting a crashing server into one file, attempts concatenated."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import pytest

from dispatchlab.core import analyze_paths
from dispatchlab.core.parse import parse_sources
from dispatchlab.core.summary import render_summary

from .helpers import LOGS, log_text, text_source

KB_FAILING = LOGS.parent / "kb" / "failing"
SGLANG_OOM = LOGS / "sglang_docker_capture_oom.log"
SGLANG_ARCH = LOGS / "sglang_dsv4_eagle_sm120.log"
SGLANG_SERVING = LOGS / "sglang_h100_serving.log"
VLLM_OOM = LOGS / "vllm_engine_core_oom.log"


_text = log_text


def _analyze(tmp_path: Path, *parts: Path, name: str = "runs.log") -> dict:
    target = tmp_path / name
    target.write_text("".join(_text(p) for p in parts))
    return analyze_paths([target])


@pytest.mark.parametrize(
    "log",
    [SGLANG_OOM, SGLANG_ARCH, VLLM_OOM, KB_FAILING / "oom__sglang_weight_load_kubectl.log"],
    ids=lambda p: p.stem,
)
def test_three_copies_of_a_crash_have_the_fingerprint_class_and_crash_of_one_copy(tmp_path, log):
    one = analyze_paths([log])
    three = _analyze(tmp_path, log, log, log)
    assert three["fingerprint"] == one["fingerprint"]
    assert three["failure_class"] == one["failure_class"] != "none"
    assert [r["index"] for r in three["runs"]] == [1, 2, 3]
    assert len({r["fingerprint"] for r in three["runs"]}) == 1
    last = three["runs"][-1]
    # the crash is the last copy's, at the same place within it
    assert three["crash"]["line"] == one["crash"]["line"] + 2 * one["line_count"]
    assert three["crash"]["exception"] == one["crash"]["exception"]
    assert last["last_line"] == three["line_count"]
    assert "runs" not in one


def test_a_crash_then_a_successful_start_is_a_serving_log_with_no_failure(tmp_path):
    doc = _analyze(tmp_path, SGLANG_OOM, SGLANG_SERVING)
    assert doc["outcome"] == "serving" and doc["crash"] is None
    assert doc["failure_class"] == "none"
    assert not [m for m in doc["matches"] if m["level"] == "failure"]
    assert [(r["outcome"], r["exception"]) for r in doc["runs"]] == [
        ("crashed", "torch.OutOfMemoryError"),
        ("serving", None),
    ]
    # the serving run's launch, not the crashed one's: Qwen3-8B on fa3, no mxfp4 announced by run 1
    assert doc["model"] == "Qwen/Qwen3-8B" and "quantization" not in doc["backends"]


def test_an_earlier_runs_crash_stays_out_of_the_last_runs_crash_and_evidence_but_on_the_timeline(tmp_path):
    doc = _analyze(tmp_path, SGLANG_ARCH, SGLANG_OOM)
    second = doc["runs"][1]["first_line"]
    assert doc["failure_class"] == "oom" and doc["crash"]["line"] >= second
    assert all(line >= second for match in doc["matches"] for line in match["lines"])
    assert all(error["line"] >= second for error in doc["errors"])
    assert all(tb["line"] >= second for tb in doc["tracebacks"])
    assert "kernels" not in doc or not any("bmm_" in k for k in doc["kernels"])
    first_run = [e for e in doc["timeline"] if e["line"] < second and e["kind"] == "error"]
    assert any(e["name"] == "crash" for e in first_run)
    assert any(e["name"] == "server_start" and e["line"] == second for e in doc["timeline"])
    # and the other way round: the arch crash of the last run decides, the OOM of the first does not
    other = _analyze(tmp_path, SGLANG_OOM, SGLANG_ARCH, name="other.log")
    assert other["failure_class"] == "arch_unsupported_kernel"
    assert other["fingerprint"] == analyze_paths([SGLANG_ARCH])["fingerprint"]


def test_several_ranks_printing_the_start_banner_at_once_are_one_run():
    # vLLM with two data-parallel engines: each prints its engine banner, one after the other's progress
    vllm = "\n".join(
        [
            "(APIServer pid=10) INFO 09-14 10:21:07 [api_server.py:1839] vLLM API server version 0.10.2",
            "(APIServer pid=10) INFO 09-14 10:21:07 [utils.py:328] non-default args: {'model': 'm', 'data_parallel_size': 2}",
            "(EngineCore_DP0 pid=20) INFO 09-14 10:21:22 [core.py:76] Initializing a V1 LLM engine (v0.10.2) with config: model='m'",
            "(EngineCore_DP0 pid=20) INFO 09-14 10:21:30 [gpu_model_runner.py:1953] Starting to load model m...",
            "(EngineCore_DP1 pid=21) INFO 09-14 10:21:22 [core.py:76] Initializing a V1 LLM engine (v0.10.2) with config: model='m'",
            "(EngineCore_DP1 pid=21) INFO 09-14 10:21:31 [gpu_model_runner.py:1953] Starting to load model m...",
            "(EngineCore_DP0 pid=20) ERROR 09-14 10:22:00 [core.py:700] EngineCore failed to start.",
        ]
    )
    assert parse_sources([text_source(vllm + "\n")]).runs == []
    # SGLang on two nodes, both dumps before any progress
    dump = "server_args=ServerArgs(model_path='m', tp_size=16, nnodes=2)"
    sglang = "\n".join(
        [
            f"[2026-01-01 10:00:00] {dump}",
            f"[2026-01-01 10:00:01] {dump}",
            "[2026-01-01 10:00:05 TP0] Load weight begin. avail mem=70.00 GB",
            "[2026-01-01 10:00:09 TP0] Scheduler hit an exception: Traceback (most recent call last):",
            '  File "/sglang/srt/managers/scheduler.py", line 10, in run_scheduler_process',
            "RuntimeError: boom",
        ]
    )
    assert parse_sources([text_source(sglang + "\n")]).runs == []


def test_an_error_pasted_above_its_launch_command_is_not_a_second_run():
    paste = "\n".join(
        [
            "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory",
            "",
            "python -m sglang.launch_server --model-path Qwen/Qwen3-8B --tp 2",
            "Traceback (most recent call last):",
            '  File "/sglang/launch_server.py", line 3, in <module>',
            "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory",
        ]
    )
    assert parse_sources([text_source(paste + "\n")]).runs == []


def test_the_summary_says_the_runs_crashed_the_same_way_or_which_run_differed(tmp_path):
    same = render_summary(_analyze(tmp_path, VLLM_OOM, VLLM_OOM, VLLM_OOM, name="same.log"))
    assert "3 runs, all crashed the same way; the diagnosis is run 3's" in same
    differed = render_summary(_analyze(tmp_path, SGLANG_OOM, SGLANG_OOM, SGLANG_ARCH, name="differed.log"))
    assert "3 runs ended 2 different ways; the diagnosis is run 3's" in differed
    assert "runs 1-2: crashed in cuda_graph_capture: torch.OutOfMemoryError" in differed
    assert "run 3: crashed" in differed
    assert "runs" not in render_summary(analyze_paths([VLLM_OOM])).split("backend")[0]


def _retained_bytes(text: str) -> int:
    """What a parse keeps once it is done (its ParsedLog alive), scan buffers gone."""
    gc.collect()
    tracemalloc.start()
    parsed = parse_sources([text_source(text)])
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert parsed.runs
    return retained


def test_a_crash_loop_keeps_one_small_record_per_run_not_its_tracebacks_and_errors():
    copy = _text(VLLM_OOM)
    _retained_bytes(copy * 2)  # warm the compiled rules and caches
    few, many = _retained_bytes(copy * 100), _retained_bytes(copy * 400)
    # one run's tracebacks, frames and error lines take several KB; its record a few hundred bytes
    assert (many - few) / 300 < 2500


def test_a_crash_loop_keeps_its_first_and_last_runs_on_the_timeline():
    parsed = parse_sources([text_source(_text(SGLANG_ARCH) * 150)])
    assert len(parsed.runs) == 150
    last = parsed.runs[-1]
    assert parsed.crash is not None and parsed.crash.line >= last.first_line
    lines = [e.line for e in parsed.timeline]
    assert any(n <= parsed.runs[0].last_line for n in lines)
    assert any(e.name == "crash" and e.line >= last.first_line for e in parsed.timeline)
    assert parsed.truncated_events > 0


def test_a_crash_loop_past_the_cap_lists_its_first_and_last_runs_and_counts_the_rest(tmp_path, monkeypatch):
    monkeypatch.setattr("dispatchlab.core.parse.observations.MAX_RUNS_LISTED", 10)
    doc = _analyze(tmp_path, *[VLLM_OOM] * 25)
    assert [r["index"] for r in doc["runs"]] == [*range(1, 6), *range(20, 26)]
    assert doc["runs_omitted"] == 14
    assert list(doc["runs_omitted_by_fingerprint"].values()) == [14]
    assert doc["runs"][-1]["last_line"] == doc["line_count"]
    assert "25 runs, all crashed the same way; the diagnosis is run 25's" in render_summary(doc)


def test_a_crash_loop_under_the_cap_has_no_omitted_runs(tmp_path):
    doc = _analyze(tmp_path, VLLM_OOM, VLLM_OOM)
    assert len(doc["runs"]) == 2 and "runs_omitted" not in doc


def _attempts(log: Path, count: int) -> str:
    """`count` restarts of one crash, each with its own clock and attempt number (digits differ run to run)."""
    copy = _text(log)
    return "".join(
        f"supervisor: attempt {n} of the crash loop\n" + copy.replace(":5", f":{n % 6}") for n in range(count)
    )


@pytest.mark.parametrize("log", [SGLANG_ARCH, VLLM_OOM], ids=lambda p: p.stem)
def test_a_crash_loop_of_5000_runs_has_the_diagnosis_of_three_and_counts_every_run(tmp_path, log):
    three = _analyze(tmp_path, log, log, log, name="three.log")
    target = tmp_path / "loop.log"
    target.write_text(_attempts(log, 5000))
    loop = analyze_paths([target])
    assert loop["fingerprint"] == three["fingerprint"]
    assert loop["failure_class"] == three["failure_class"] != "none"
    assert loop["crash"]["exception"] == three["crash"]["exception"]
    assert len(loop["runs"]) + loop["runs_omitted"] == 5000
    assert loop["runs"][-1]["index"] == 5000 and loop["runs"][-1]["last_line"] == loop["line_count"]
    assert len({r["fingerprint"] for r in loop["runs"]}) == 1
    # the crash is the last run's, at the same place within it as in the second (the first holds the lines
    # before the server's first start)
    second, last = loop["runs"][1], loop["runs"][-1]
    assert last["crash_line"] - last["first_line"] == second["crash_line"] - second["first_line"]
    assert loop["crash"]["line"] >= last["first_line"]


def test_the_runs_of_a_crash_loop_replayed_from_the_one_before_read_as_if_each_was_read_whole(
    tmp_path, monkeypatch
):
    target = tmp_path / "loop.log"
    target.write_text(_attempts(SGLANG_ARCH, 300))
    replayed = analyze_paths([target])
    monkeypatch.setattr("dispatchlab.core.parse.scan._LOOP_RUNS", 10**9)  # every run read line by line
    read = analyze_paths([target])
    for key in ("runs", "runs_omitted", "crash", "fingerprint", "line_count", "warnings_count", "tracebacks"):
        assert replayed[key] == read[key], key
    # past the first few runs, a run's events are counted, not kept: the timeline ends with the last run's
    runs = replayed["runs"]
    before_last = [e["line"] for e in replayed["timeline"] if e["line"] < runs[-1]["first_line"]]
    assert max(before_last) <= runs[25]["first_line"] < runs[-1]["first_line"]
    assert replayed["truncated_events"] > 0


def test_a_flood_of_different_tracebacks_and_error_lines_keeps_the_first_and_counts_the_rest():
    from dispatchlab.core.parse.vocabulary import MAX_ERRORS, MAX_TRACEBACKS

    count = MAX_ERRORS + 100

    def word(n: int) -> str:  # error lines are told apart without their numbers
        return "".join(chr(ord("a") + int(digit)) for digit in str(n))

    blocks = [
        f'Traceback (most recent call last):\n  File "/srv/app/step.py", line {n}, in handler_{word(n)}\n'
        f"ValueError: state {n} is wrong\nERROR job {word(n)} failed\n"
        for n in range(count)
    ]
    doc = parse_sources([text_source("".join(blocks))]).to_dict()
    assert len(doc["tracebacks"]) == MAX_TRACEBACKS and doc["tracebacks_omitted"] == count - MAX_TRACEBACKS
    assert doc["tracebacks"][0]["message"] == "state 0 is wrong"
    assert len(doc["errors"]) == MAX_ERRORS and doc["errors_omitted"] == count - MAX_ERRORS
    assert doc["errors"][0]["text"] == "ERROR job a failed"


def test_a_log_under_the_caps_has_no_omitted_counts(tmp_path):
    doc = _analyze(tmp_path, VLLM_OOM)
    assert "tracebacks_omitted" not in doc and "errors_omitted" not in doc


@pytest.mark.parametrize("log", [SGLANG_ARCH, VLLM_OOM, SGLANG_OOM], ids=lambda p: p.stem)
def test_a_crash_loops_repeated_blocks_taken_from_the_block_before_give_the_document_of_reading_every_line(
    tmp_path, monkeypatch, log
):
    target = tmp_path / "loop.log"
    target.write_text(_attempts(log, max(3, 2_000_000 // len(_text(log)))))
    inferred = analyze_paths([target])
    monkeypatch.setattr("dispatchlab.core.parse.chunkscan.INFER_REPEATS", False)
    assert analyze_paths([target]) == inferred


def test_every_line_of_a_crash_loops_repeated_blocks_is_rebuilt_from_one_block_and_their_digits():
    """The scan sends a repeated stretch as one block's text and every block's digits: each hit's line and
    the line before it come back as the log has them, clocks and attempt numbers included."""
    from dispatchlab.core.parse.chunkscan import scan_chunk
    from dispatchlab.core.parse.extra import NO_EXTRA_PATTERNS
    from dispatchlab.core.parse.rules import compiled_rules

    chunk = _attempts(VLLM_OOM, max(3, 600_000 // len(_text(VLLM_OOM)))).encode()
    lines = chunk.split(b"\n")
    scan = scan_chunk(compiled_rules(NO_EXTRA_PATTERNS).scanner, chunk, 10**9, 0)
    assert scan.repeats is not None and scan.repeats.count > 1000
    repeated = range(scan.repeats.first_hit, scan.repeats.first_hit + scan.repeats.count)
    for number in repeated:
        hit = scan.hit(number)
        assert hit.raw == lines[hit.index]
        assert hit.previous in (b"", lines[hit.index - 1])


def test_a_big_chunk_of_a_crash_loop_is_found_repeating_and_a_traceback_flood_is_not():
    """The middle megabyte is searched first: a loop's 4 MB chunk still has its repeats taken from one block,
    a chunk of different tracebacks (digits aside, no block repeats) has none."""
    from dispatchlab.core.parse.chunkscan import scan_chunk
    from dispatchlab.core.parse.extra import NO_EXTRA_PATTERNS
    from dispatchlab.core.parse.rules import compiled_rules

    scanner = compiled_rules(NO_EXTRA_PATTERNS).scanner
    loop = _attempts(VLLM_OOM, 4_000_000 // len(_text(VLLM_OOM))).encode()
    assert scan_chunk(scanner, loop, 10**9, 0).repeats is not None

    def word(n: int) -> str:  # digits aside, every traceback differs
        return "".join(chr(ord("a") + int(digit)) for digit in str(n))

    flood = "".join(
        f'Traceback (most recent call last):\n  File "/srv/app/step_{word(n)}.py", line 3, in handler_{word(n)}\n'
        f"ValueError: state {word(n)} is wrong\nERROR job failed\n"
        for n in range(30_000)
    ).encode()
    assert len(flood) > 2 * 1024 * 1024
    assert scan_chunk(scanner, flood, 10**9, 0).repeats is None
