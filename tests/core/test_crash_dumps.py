"""SGLang's `--crash-dump-folder` pickles fill the report's facts, alone or beside a log, and are read without
ever being unpickled: a hostile pickle runs nothing and ends in a clean refusal or a harmless placeholder."""

from __future__ import annotations

import json
import os
import pickle
import sys
import zipfile
from pathlib import Path

import pytest

from dispatchlab.core.api import analyze_paths
from dispatchlab.core.crashdump import NotACrashDump, crash_dump_lines, read_crash_dump, read_pickle
from dispatchlab.core.reading import LogReadError, iter_lines

from .crashdump_standins import crash_dump, dumps, write_crash_dump
from .helpers import ROOT, run_cli

FIXTURE = ROOT / "tests" / "fixtures" / "crashdump" / "gpu-node-07" / "crash_dump_2026-03-14_09-26-53.pkl"
LOG_WITH_ARGS = ROOT / "tests" / "fixtures" / "logs" / "sglang_docker_capture_oom.log"
LOG_WITHOUT_ARGS = ROOT / "tests" / "fixtures" / "toolout" / "cuda_coredump.log"


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_a_dump_of_any_protocol_gives_the_servers_arguments_and_its_requests(protocol):
    dump = read_crash_dump(
        dumps(crash_dump(), protocol), "crash/gpu-node-07/crash_dump_2026-03-14_09-26-53.pkl"
    )
    assert dump.server_args is not None and dump.server_args_class == "sglang.srt.server_args.ServerArgs"
    assert {
        k: dump.server_args[k] for k in ("model_path", "tp_size", "ep_size", "quantization", "dtype")
    } == {
        "model_path": "deepseek-ai/DeepSeek-V3.2-Exp",
        "tp_size": 8,
        "ep_size": 8,
        "quantization": "fp8",
        "dtype": "auto",
    }
    assert dump.server_args["load_format"] == "<sglang.srt.server_args.LoadFormat: 'auto'>"
    assert (dump.hostname, dump.written, dump.request_count, dump.unfinished) == (
        "gpu-node-07",
        "2026-03-14 09:26:53",
        37,
        5,
    )
    first, last = dump.requests[0], dump.requests[-1]
    assert (first.rid, first.finished, first.finish_reason, first.prompt_tokens) == (
        "req-0000",
        True,
        "length",
        900,
    )
    assert first.preview is not None and first.preview.startswith("Summarise report 0:")
    assert (last.rid, last.finished, last.prompt_tokens) == ("live-004", False, 1238)
    assert last.sampling == {"max_new_tokens": 2048, "temperature": 0.0}
    assert dump.launch_command is not None and "--tp 8" in dump.launch_command


def test_a_dump_uploaded_alone_fills_the_facts_and_diagnoses_nothing():
    doc = analyze_paths([FIXTURE])
    assert (doc["server"], doc["model"]) == ("sglang", "deepseek-ai/DeepSeek-V3.2-Exp")
    assert doc["server_args"]["tp_size"] == 8 and doc["server_args"]["crash_dump_folder"] == "/data/crash"
    assert doc["backends"]["attention_backend"] == "nsa" and doc["backends"]["moe_a2a_backend"] == "deepep"
    assert doc["backends"]["kv_cache_dtype"] == "fp8_e4m3" and doc["backends"]["quantization"] == "fp8"
    assert doc["launch_command"].startswith("python -m sglang.launch_server --model-path")
    in_flight = [e["detail"] for e in doc["timeline"] if e["name"] == "crash_dump"]
    assert in_flight and in_flight[0].startswith("37 requests in flight at 2026-03-14 09:26:53 (5 unfinished")
    assert "last request rid=live-004, prompt 1,238 tokens, max_new_tokens=2048" in in_flight[0]
    assert (doc["crash"], doc["failure_class"], doc["matches"]) == (None, "none", [])


def test_the_dumps_lines_leave_the_prompts_out():
    text = "\n".join(iter_lines([FIXTURE]))
    assert "crash dump request 37/37: rid=live-004" in text
    assert "quarterly numbers" not in text, "prompt text is the users' data, and could read as an error"


def test_a_dump_beside_a_log_fills_only_what_the_log_does_not_say():
    alone = analyze_paths([LOG_WITH_ARGS])
    for paths in ([LOG_WITH_ARGS, FIXTURE], [FIXTURE, LOG_WITH_ARGS]):
        both = analyze_paths(paths)
        assert both["model"] == alone["model"] == "openai/gpt-oss-120b"
        assert both["backends"]["attention_backend"] == alone["backends"]["attention_backend"]
        assert both["server_args"]["tp_size"] == alone["server_args"]["tp_size"]
        assert both["server_args"]["crash_dump_folder"] == "/data/crash", (
            "what the log lacks comes from the dump"
        )
        assert both["failure_class"] == alone["failure_class"] == "oom"
        assert [m["id"] for m in both["matches"]] == [m["id"] for m in alone["matches"]]
        assert "runs" not in both, "the dump does not start a run"


def test_a_dump_beside_a_log_without_arguments_names_the_server_and_keeps_the_diagnosis():
    alone = analyze_paths([LOG_WITHOUT_ARGS])
    both = analyze_paths([LOG_WITHOUT_ARGS, FIXTURE])
    assert (alone["server"], alone["model"]) == ("unknown", None)
    assert (both["server"], both["model"]) == ("sglang", "deepseek-ai/DeepSeek-V3.2-Exp")
    assert both["failure_class"] == alone["failure_class"] == "cuda_error"
    assert both["crash"]["line"] == alone["crash"]["line"]


def test_the_command_line_matches_a_dump(tmp_path):
    path = write_crash_dump(tmp_path)
    result = run_cli("match", str(path), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (doc["server"], doc["failure_class"], doc["backends"]["moe_runner_backend"]) == (
        "sglang",
        "none",
        "deep_gemm",
    )


def test_a_dump_inside_a_zip_is_read_with_its_host(tmp_path):
    archive = tmp_path / "crash.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.write(FIXTURE, "crash/gpu-node-07/crash_dump_2026-03-14_09-26-53.pkl")
        zf.write(LOG_WITHOUT_ARGS, "server.log")
    doc = analyze_paths([archive])
    assert doc["model"] == "deepseek-ai/DeepSeek-V3.2-Exp" and doc["failure_class"] == "cuda_error"
    assert any("from host gpu-node-07" in line for line in iter_lines([archive]))


def test_a_dump_without_server_args_still_counts_its_requests(tmp_path):
    # SGLang retries without server_args when they do not pickle (--trust-remote-code)
    path = tmp_path / "crash_dump_2026-03-14_09-26-53.pkl"
    dump = crash_dump(unfinished=2, finished=0)
    dump["server_args"] = None
    path.write_bytes(dumps(dump, 4))
    doc = analyze_paths([path])
    assert doc["server_args"]["tp_size"] == 8, "the launch command still gives the flags"
    assert any(e["detail"].startswith("2 requests in flight") for e in doc["timeline"])


def test_a_pickle_of_something_else_is_refused_with_a_reason(tmp_path):
    path = tmp_path / "weights.pkl"
    path.write_bytes(pickle.dumps({"layer.0": [0.1, 0.2]}, protocol=4))
    with pytest.raises(
        LogReadError, match=r"weights\.pkl: not an SGLang crash dump: .*not SGLang's server_args"
    ):
        analyze_paths([path])


def test_a_binary_file_not_named_as_a_pickle_is_still_refused(tmp_path):
    path = tmp_path / "dump.bin"
    path.write_bytes(FIXTURE.read_bytes())
    with pytest.raises(LogReadError, match="binary data, not a text log"):
        analyze_paths([path])


# ---------------------------------------------------------------- hostile pickles


class _Runs:
    """Pickles as a call: unpickling it would run `command` through `func`."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return (self.func, self.args)


def _marker_command(marker: Path) -> str:
    return f"touch {marker}"


def test_a_pickle_that_calls_os_system_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    evil = pickle.dumps(_Runs(os.system, _marker_command(marker)), protocol=4)
    (tmp_path / "evil.pkl").write_bytes(evil)
    with pytest.raises(
        LogReadError, match=r"not an SGLang crash dump: the pickle holds an object of (posix|nt)\.system"
    ):
        analyze_paths([tmp_path / "evil.pkl"])
    assert not marker.exists()


def test_a_dump_that_smuggles_eval_in_as_server_args_runs_nothing_and_names_it(tmp_path):
    marker = tmp_path / "ran"
    code = f"__import__('os').system('touch {marker}')"
    dump = crash_dump(finished=1, unfinished=1, launch=False)
    dump["server_args"] = _Runs(eval, code)
    dump["requests"].append(_Runs(exec, code))
    path = tmp_path / "crash_dump_2026-03-14_09-26-53.pkl"
    path.write_bytes(dumps(dump, 2))
    doc = analyze_paths([path])
    assert not marker.exists()
    assert doc["server_args"] == {} and doc["failure_class"] == "none"
    detail = next(e["detail"] for e in doc["timeline"] if e["name"] == "crash_dump")
    assert detail.startswith("2 requests in flight"), "the entry that is no request is left out"
    # protocol 2 names builtins as Python 2 did
    assert "no server_args in the dump (a __builtin__.eval object instead)" in "\n".join(iter_lines([path]))


def test_a_class_the_pickle_names_is_never_imported():
    assert "antigravity" not in sys.modules
    data = b"\x80\x04\x8c\x0bantigravity\x94\x8c\x07geohash\x94\x93\x94)R\x94."
    with pytest.raises(NotACrashDump, match=r"an object of antigravity\.geohash"):
        read_crash_dump(data, "x.pkl")
    assert "antigravity" not in sys.modules


def test_deep_nesting_is_refused_or_read_without_recursing():
    deep_marks = b"\x80\x04" + b"](" * 100_000 + b"."
    with pytest.raises(NotACrashDump, match="nests deeper than 500 levels"):
        read_crash_dump(deep_marks, "deep.pkl")
    # lists each appended to the one below: no MARK at all, one value 200,000 deep, where a request goes
    levels = 200_000
    deep_appends = b"\x80\x04}\x8c\x08requests" + b"]" * levels + b"a" * (levels - 1) + b"s."
    dump = read_crash_dump(deep_appends, "deep.pkl")
    assert dump.complete and dump.request_count == 0
    assert "0 requests in flight" in "\n".join(crash_dump_lines(dump))


def test_a_list_that_holds_itself_is_read_as_no_request():
    # requests = [requests]: a cycle through the memo
    data = b"\x80\x04}(\x8c\x08requests]\x94(h\x00eu."
    dump = read_crash_dump(data, "cycle.pkl")
    assert dump.complete and dump.request_count == 0


def test_a_list_shared_a_hundred_times_a_level_is_read_within_bounds():
    # server_args = {"k": L40}, L_d a list of 100 references to L_(d-1): 100**40 values if walked naively
    nested = bytearray(b"\x8c\x01x\x940")
    for depth in range(1, 41):
        nested += b"(" + (b"h" + bytes([depth - 1])) * 100 + b"l\x94" + (b"0" if depth < 40 else b"")
    data = b"\x80\x04}(\x8c\x0bserver_args}\x8c\x01k" + bytes(nested) + b"s\x8c\x08requests]u."
    dump = read_crash_dump(data, "fan.pkl")
    assert dump.complete and dump.server_args is not None
    assert "<more than the reader keeps>" in json.dumps(dump.server_args)


def test_a_huge_memo_stops_the_walk_cleanly():
    data = b"\x80\x04]" + b"\x94" * 5000 + b"."
    read = read_pickle(data, max_memo=1000)
    assert not read.complete and "memo grows past 1,000 entries" in (read.stopped or "")
    with pytest.raises(NotACrashDump, match="the pickle holds a list"):
        read_crash_dump(data, "memo.pkl")


def test_a_dump_cut_anywhere_is_refused_or_read_in_part():
    data = FIXTURE.read_bytes()
    partial = 0
    for cut in range(2, len(data), max(1, len(data) // 97)):
        try:
            dump = read_crash_dump(data[:cut], "crash_dump_2026-03-14_09-26-53.pkl")
        except NotACrashDump:
            continue
        assert not dump.complete and dump.stopped and "cut short" in dump.stopped
        assert dump.request_count <= 37
        partial += 1
    assert partial > 50, "a dump cut after its server_args still gives them"


def test_a_cut_dump_says_it_was_read_in_part(tmp_path):
    path = tmp_path / "crash_dump_2026-03-14_09-26-53.pkl"
    path.write_bytes(FIXTURE.read_bytes()[: FIXTURE.stat().st_size // 2])
    doc = analyze_paths([path])
    assert doc["model"] == "deepseek-ai/DeepSeek-V3.2-Exp" and doc["failure_class"] == "none"
    assert any("partly read: the pickle is cut short" in line for line in iter_lines([path]))


def test_the_opcode_bound_keeps_what_came_before():
    data = dumps(crash_dump(finished=3, unfinished=40), 4)
    read = read_pickle(data, max_opcodes=20_000)
    assert not read.complete and "more than 20,000 opcodes" in (read.stopped or "")
    assert read.value["server_args"].class_name == "sglang.srt.server_args.ServerArgs"
    assert 3 < len(read.value["requests"]) < 43
