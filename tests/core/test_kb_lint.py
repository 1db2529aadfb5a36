"""`dispatchlab kb lint` refuses a negative example that shares no text with its signature's patterns."""

from __future__ import annotations

from dispatchlab.core.signatures import Example, Signature
from dispatchlab.core.signatures.lint import check_negative_examples_are_near_misses, near_miss_fragments


def signature_with_negative(log: str, patterns: list[str]) -> Signature:
    return Signature(
        id="s", path="s.toml", title="t", failure_class="cuda_error", severity="critical", level="failure",
        explanation="e", references=[], any_patterns=patterns, all_patterns=[], sequence=[], within=200,
        conditions={}, fix_summary="f", fix_args={}, fix_env={}, fix_by_server={}, tried_and_failed=[],
        examples=[Example("match", "RuntimeError: unspecified launch failure", {}), Example("no_match", log, {})],
    )  # fmt: skip


def test_a_negative_example_without_a_word_of_the_patterns_is_reported():
    unrelated = signature_with_negative(
        "[TP0] Decode batch, #running-req: 12", ["unspecified launch failure"]
    )
    assert check_negative_examples_are_near_misses(unrelated) == [
        "s.toml: example[1]: the no_match example shares no word with the patterns, so it cannot fail; make it a near miss"
    ]


def test_a_near_miss_passes():
    near = signature_with_negative(
        "RuntimeError: an illegal memory access was encountered", ["an illegal instruction"]
    )
    assert check_negative_examples_are_near_misses(near) == []


def test_a_pattern_without_words_asks_for_half_its_literal():
    assert near_miss_fragments(["!!!!!!!!!!!!!!!!!!!!!!!!"]) == {"!!!!!!!!!!!!"}
    assert "cuda_error_launch_" in near_miss_fragments([r"CUDA_ERROR_LAUNCH_(?:FAILED|OUT_OF_RESOURCES)"])
