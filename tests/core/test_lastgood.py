"""A crash read against the last good run of the same launch: what changed, and the lines only the crash
printed (issue #21, item 6)."""

from __future__ import annotations

from dispatchlab.core.lastgood import (
    NOT_PRINTED,
    NOT_SET,
    Change,
    compare_with_good_run,
    is_clean,
    new_log_lines,
    normalise_line,
    value_changes,
)

GOOD_LOG = """\
[2025-12-01 09:12:01 TP0] Load weight begin. avail mem=78.31 GB
[2025-12-01 09:12:44 TP0] Load weight end. type=Qwen3MoeForCausalLM, dtype=torch.bfloat16, mem=21.07 GB
[2025-12-01 09:12:45 TP0] Using attention backend fa3 (pid=41122)
[2025-12-01 09:12:46 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=55.20 GB
[2025-12-01 09:13:02 TP0] Capture cuda graph end. Time elapsed: 16.02 s. mem usage=1.31 GiB
[2025-12-01 09:13:05] The server is fired up and ready to roll!
""".splitlines()

CRASH_LOG = """\
[2025-12-02 14:03:11 TP0] Load weight begin. avail mem=78.30 GB
[2025-12-02 14:03:50 TP0] Load weight end. type=Qwen3MoeForCausalLM, dtype=torch.bfloat16, mem=21.07 GB
[2025-12-02 14:03:51 TP0] Using attention backend fa3 (pid=50001)
[2025-12-02 14:03:51 TP0] FlashInfer workspace at /root/.cache/flashinfer/9f2ab1c3d4/ws.bin
[2025-12-02 14:03:52 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=55.19 GB
[2025-12-02 14:03:53 TP1] WARNING: mem_fraction_static=0.95 leaves 1.2 GB for cuda graphs
[2025-12-02 14:03:53 TP2] WARNING: mem_fraction_static=0.95 leaves 1.2 GB for cuda graphs
[2025-12-02 14:03:58 TP0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
""".splitlines()


def numbered(lines: list[str]) -> list[tuple[int, str]]:
    return list(enumerate(lines, 1))


def test_lines_of_two_runs_read_alike_once_times_pids_numbers_and_hex_are_set_aside():
    assert normalise_line(GOOD_LOG[2]) == normalise_line(CRASH_LOG[2])
    assert normalise_line(
        "12-02 14:03:11 [core.py:88] addr 0x7f3a2c00 uuid 1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    ) == (normalise_line("11-30 02:00:59 [core.py:91] addr 0x10 uuid 00000000-0000-0000-0000-000000000000"))


def test_a_paths_directories_are_set_aside_but_its_file_name_is_kept():
    a = normalise_line("loading /home/alice/.cache/hf/snapshots/3f2a/model-00001-of-00004.safetensors")
    b = normalise_line("loading /mnt/weights/snap/model-00003-of-00004.safetensors")
    assert a == b
    assert normalise_line("reading /a/b/config.json") != normalise_line("reading /a/b/tokenizer.json")


def test_new_lines_are_those_the_good_run_never_printed_counted_once_with_their_first_line():
    found = new_log_lines(numbered(CRASH_LOG), GOOD_LOG)
    assert [(item.line, item.text) for item in found.first] == [
        (4, CRASH_LOG[3]),
        (6, CRASH_LOG[5]),  # TP2 prints the same warning: one new line, not two
        (8, CRASH_LOG[7]),
    ]
    assert found.total == 3
    assert found.more == 0


def test_only_the_first_new_lines_are_listed_and_the_rest_is_counted():
    crash = [(n, f"error in kernel_{chr(96 + n)}") for n in range(1, 27)]
    found = new_log_lines(crash, [], shown_at_most=5)
    assert [item.line for item in found.first] == [1, 2, 3, 4, 5]
    assert (found.total, found.more) == (26, 21)


def test_blank_lines_are_never_new():
    assert new_log_lines([(1, ""), (2, "   ")], []).total == 0


def test_value_changes_list_only_what_differs_and_what_one_side_does_not_set():
    changes = value_changes(
        {"mem_fraction_static": 0.88, "tp_size": 8, "port": 30000},
        {"mem_fraction_static": 0.95, "tp_size": 8, "enable_dp_attention": True},
    )
    assert changes == [
        Change("enable_dp_attention", NOT_SET, "true"),
        Change("mem_fraction_static", "0.88", "0.95"),
        Change("port", "30000", NOT_SET),
    ]


def good_doc(**overrides):
    doc = {
        "server": "sglang",
        "server_version": "0.5.2",
        "outcome": "serving",
        "crash": None,
        "server_args": {"mem_fraction_static": 0.88, "attention_backend": "fa3"},
        "versions": {"torch": "2.8.0", "flashinfer": "0.3.1", "cuda": None},
        "backends": {"attention_backend": "fa3", "moe_runner_backend": "triton"},
        "draft_backends": {},
    }
    return doc | overrides


def test_a_crash_is_compared_on_arguments_versions_backends_and_new_lines():
    crash = good_doc(
        outcome="crashed",
        crash={"line": 8},
        server_version="0.5.3",
        server_args={"mem_fraction_static": 0.95, "attention_backend": "fa3"},
        versions={"torch": "2.8.0", "flashinfer": "0.4.0"},
        backends={"attention_backend": "fa3", "moe_runner_backend": "flashinfer_cutlass"},
        draft_backends={"attention_backend": "triton"},
    )
    diff = compare_with_good_run(crash, good_doc(), numbered(CRASH_LOG), GOOD_LOG)
    assert diff.args == [Change("mem_fraction_static", "0.88", "0.95")]
    # the server's version counts as a version; a version neither prints (cuda: None) is no change
    assert diff.versions == [Change("sglang", "0.5.2", "0.5.3"), Change("flashinfer", "0.3.1", "0.4.0")]
    assert diff.backends == [
        Change("draft attention_backend", NOT_PRINTED, "triton"),
        Change("moe_runner_backend", "triton", "flashinfer_cutlass"),
    ]
    assert diff.new_lines.total == 3
    assert not diff.same_setup


def test_a_crash_with_the_same_setup_says_so():
    diff = compare_with_good_run(good_doc(outcome="crashed"), good_doc())
    assert diff.same_setup
    assert diff.notes == []


def test_arguments_are_not_called_changed_when_one_log_prints_none():
    diff = compare_with_good_run(good_doc(server_args={}), good_doc())
    assert diff.args == []
    assert diff.notes == [
        "The crashed run's log prints no server arguments: only the launch's other facts compare."
    ]


def test_only_a_run_that_came_up_without_crashing_is_clean():
    assert is_clean(good_doc(outcome="serving"))
    assert is_clean(good_doc(outcome="ready"))
    assert not is_clean(good_doc(outcome="crashed", crash={"line": 3}))
    assert not is_clean(good_doc(outcome="incomplete"))
