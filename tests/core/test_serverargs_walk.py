"""The arguments dump is split by a regex walk over its brackets and commas, and its plain values are read
without literal_eval: both must give what a character-by-character walk and literal_eval give."""

from __future__ import annotations

import ast
import re
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchlab.core.serverargs import parse_server_args, parse_value, split_top_level

_OPAQUE = re.compile(r"<[A-Za-z_][\w.]*[ :>]")


def _reference_structure(text: str) -> list[tuple[int, str]]:
    """The brackets and commas outside quotes and `<...>` reprs, one character at a time."""
    out: list[tuple[int, str]] = []
    quote: str | None = None
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "<" and _OPAQUE.match(text, i):
            end = text.find(">", i)
            i = n if end < 0 else end + 1
            continue
        elif c in "()[]{},":
            out.append((i, c))
        i += 1
    return out


def _reference_split(body: str) -> list[str]:
    parts, depth, begin = [], 0, 0
    for i, c in _reference_structure(body):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth <= 0:
            parts.append(body[begin:i].strip())
            begin = i + 1
    if body[begin:].strip():
        parts.append(body[begin:].strip())
    return parts


_PIECES = st.sampled_from(
    ["a", "b=", "=", ",", ", ", "(", ")", "[", "]", "{", "}", "'", '"', "\\", "\\'", "<", ">", "<obj at 0x1>",
     "<Enum.X: 1>", "<f", " ", "x.y", "1", "-2.5", "True", "None", "\n"]
)  # fmt: skip


@settings(max_examples=2000, deadline=None)
@given(st.lists(_PIECES, max_size=40).map("".join))
def test_splitting_at_top_level_commas_matches_a_character_walk(body):
    assert split_top_level(body) == _reference_split(body)


@settings(max_examples=1000, deadline=None)
@given(
    st.one_of(
        st.integers(-(10**12), 10**12).map(str),
        st.floats(allow_nan=False, allow_infinity=False).map(repr),
        st.text(st.characters(blacklist_categories=("Cs",)), max_size=12).map(repr),
        st.sampled_from(
            ["True", "False", "None", "007", "1_000", "-0", "1e5", "0.5", "'a\\'b'", '"x"', "inf"]
        ),
        # what literal_eval refuses: a NUL, a carriage return or a lone surrogate quoted, an int past 4,300 digits
        st.sampled_from(["'a\x00b'", "'a\rb'", '"a\ud800b"', "7" * 5000, "-" + "7" * 4400, "'\\d+'"]),
        st.text(max_size=8).map(lambda text: f"'{text}'"),
    )
)
@pytest.mark.filterwarnings("error")  # and quietly: a garbled dump's `'\\d'` prints no warning
def test_plain_values_read_as_literal_eval_reads_them(text):
    try:
        with warnings.catch_warnings():  # `'\^'`: an invalid escape warns, as parse_value keeps it quiet
            warnings.simplefilter("ignore")
            expected = ast.literal_eval(text)
    except (ValueError, SyntaxError):  # as parse_value reads what literal_eval refuses: the text as it is
        expected = text
    value = parse_value(text)
    assert value == expected and type(value) is type(expected)


def test_a_dump_with_reprs_quotes_and_nesting_parses_field_by_field():
    dump = (
        "server_args=ServerArgs(model_path='/m/a,b', tp_size=4, mem_fraction_static=0.82, "
        "json_model_override_args='{\"a\": [1, 2]}', lora_paths=None, hooks=<function f at 0x7f>, "
        "dtype=<Dtype.AUTO: 'auto'>, cuda_graph_bs=[1, 2, 4], extra={'k': (1, 'v)')}, name=\"q\\\"x\")"
    )
    fields, complete = parse_server_args(dump)
    assert complete
    assert (
        fields["model_path"] == "/m/a,b" and fields["tp_size"] == 4 and fields["mem_fraction_static"] == 0.82
    )
    assert fields["json_model_override_args"] == '{"a": [1, 2]}' and fields["lora_paths"] is None
    assert fields["hooks"] == "<function f at 0x7f>" and fields["dtype"] == "<Dtype.AUTO: 'auto'>"
    assert fields["cuda_graph_bs"] == [1, 2, 4] and fields["extra"] == {"k": [1, "v)"]}
    assert fields["name"] == 'q"x'
