"""A closed traceback's frames are tested for request handlers and kernels by one search over their names,
only when the names hold a piece every such name holds: the same answers as a match per frame."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchlab.core.parse.extract.failures import (
    _KERNEL_FUNCS,
    _REQUEST_FRAME,
    _REQUEST_FRAMES,
    KERNEL_FUNC,
    KERNEL_PIECES,
    REQUEST_PIECES,
)

_NAMES = st.one_of(
    st.from_regex(KERNEL_FUNC.pattern, fullmatch=True),
    st.from_regex(_REQUEST_FRAME.pattern, fullmatch=True),
    st.from_regex(r"[A-Za-z_<>][\w<>.]{0,30}", fullmatch=True),
).filter(lambda name: "\n" not in name)


@settings(max_examples=1000, deadline=None)
@given(st.from_regex(KERNEL_FUNC.pattern, fullmatch=True))
def test_every_kernel_name_holds_a_kernel_piece(name):
    assert any(piece in name for piece in KERNEL_PIECES)


@settings(max_examples=1000, deadline=None)
@given(st.from_regex(_REQUEST_FRAME.pattern, fullmatch=True))
def test_every_request_handler_name_holds_a_request_piece(name):
    assert any(piece in name for piece in REQUEST_PIECES)


@settings(max_examples=500, deadline=None)
@given(st.lists(_NAMES, max_size=14))
def test_one_search_over_the_names_finds_what_a_match_per_frame_finds(names):
    functions = "".join("\n" + name for name in names)
    kernels = [m.group(1) for m in _KERNEL_FUNCS.finditer(functions)]
    assert kernels == [name for name in names if KERNEL_FUNC.match(name)]
    assert (_REQUEST_FRAMES.search(functions) is not None) == any(_REQUEST_FRAME.match(n) for n in names)
