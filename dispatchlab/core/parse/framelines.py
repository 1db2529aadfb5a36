"""A traceback's frame lines the short way to the extractors.

A traceback flood (100,000 frames in 100 MB) spent most of its parse handing each frame line to every
extractor: the rule confirmations, the dispatch, each extractor's tests of rules the line cannot have. A line
whose only candidate rules are `tb_frame` and one server's path mention (`.../sglang/srt/...`) goes straight
to the three extractors that read those rules, each doing what its `handle` does with such a line
(tests/core/test_frame_lines.py compares both ways).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import lru_cache

from dispatchlab.core.arch import ARCH_MARKS
from dispatchlab.core.parse.chunkscan import ChunkScan
from dispatchlab.core.parse.extract.environment import Environment
from dispatchlab.core.parse.extract.failures import (
    ERRORISH_PIECES,
    Failures,
    _OpenTraceback,
)
from dispatchlab.core.parse.extract.servers import VERSION_PIECES, ServerMentions, marker_rules
from dispatchlab.core.parse.lineformat import Line
from dispatchlab.core.parse.model import Frame
from dispatchlab.core.parse.observations import Observations
from dispatchlab.core.parse.scanner import Scanner, hyperscan_enabled
from dispatchlab.core.parse.vocabulary import MAX_FRAMES
from dispatchlab.core.records import record

SHORTCUT = True  # tests turn it off to compare
QUICK = True  # tests turn QuickFrames off to compare


@record(frozen=True)
class FramePlan:
    """The rules of a frame line: tb_frame's id, and the server mention rule's id, name, server and weight."""

    frame: int
    mention: int | None = None
    mention_name: str = ""
    server: str = ""
    weight: int = 0


def frame_plans(names: list[str]) -> dict[tuple[int, ...], FramePlan]:
    """The candidate rule sets (sorted rule ids, as the scan gives them) of lines that may take the short way."""
    ids = {name: number for number, name in enumerate(names)}
    frame = ids["tb_frame"]
    plans: dict[tuple[int, ...], FramePlan] = {(frame,): FramePlan(frame)}
    for name, server, weight in marker_rules():
        mention = ids[name]
        rule_set = tuple(sorted((frame, mention)))
        plans[rule_set] = FramePlan(frame, mention, name, server, weight)
    return plans


def plans_for(
    plans: dict[tuple[int, ...], FramePlan], rule_sets: list[tuple[int, ...] | None]
) -> list[FramePlan | None]:
    """Each of a chunk's rule sets' plan, None where its lines go the long way."""
    return [None if rules is None or not SHORTCUT else plans.get(rules) for rules in rule_sets]


def read_frame_line(
    line: Line,
    plan: FramePlan,
    regex: Callable[[int], re.Pattern[str]],
    servers: ServerMentions,
    environment: Environment,
    failures: Failures,
) -> None:
    """What the scan does with an unprefixed, untimed plain line whose candidate rules are `plan`'s: it
    confirms them and hands the hits to the extractors that read them, in their order. No other extractor
    reads these rules, and none of these three claims the line."""
    msg = line.msg
    # a mention that can add nothing (the server's first lines all kept, no version named) is not confirmed
    if plan.mention is not None and servers.may_record(plan.server, plan.weight, msg):
        mention = regex(plan.mention).search(msg)
        if mention is not None:
            servers.handle(line, {plan.mention_name: mention}, b"")
    frame = regex(plan.frame).search(msg)
    if frame is not None:
        environment.weak_hint(line)  # all Environment.handle does with a frame
        failures.frame_line(line, frame)


_INDENT_BYTES = (32, 9)


# What sends frame lines the long way, by what reading them would do besides adding frames. A piece of each:
# ERRORISH_PIECES, ARCH_MARKS and VERSION_PIECES are what is_errorish, weak_arch_hint and the version test of
# ServerMentions look for first (tests/core/test_frame_lines.py checks that they still are).
MARK_KINDS: dict[str, tuple[str, ...]] = {
    # a gutter, an escape, a `Line N:` label (split_line reads those lines), an error word (Failures._kernels)
    "always": ("|", "+", "\x1b", "Line ", *ERRORISH_PIECES),
    "arch": ARCH_MARKS,  # Environment.weak_hint, while no arch is known better
    "version": VERSION_PIECES,  # ServerMentions may record a version
    "request": (".py:",),  # request_logged
}


class _Marks:
    """The kinds of mark in a text: one Hyperscan scan for every piece where installed (a test of each piece
    was a third of a traceback's frames read whole), else a test of each."""

    def __init__(self) -> None:
        pieces = [(kind, piece) for kind, kind_pieces in MARK_KINDS.items() for piece in kind_pieces]
        self.kinds = [kind for kind, _piece in pieces]
        self.pieces = [(kind, piece.encode()) for kind, piece in pieces]
        self.scanner = Scanner([re.escape(piece) for _kind, piece in pieces]) if hyperscan_enabled() else None

    def of(self, text: bytes) -> set[str]:
        scanner = self.scanner
        if scanner is not None and scanner.accelerated and not scanner.python_only:
            kinds = self.kinds
            return {kinds[i] for ids in scanner.candidates(text).values() for i in (ids or range(len(kinds)))}
        return {kind for kind, piece in self.pieces if piece in text}


@lru_cache(maxsize=1)
def _marks() -> _Marks:
    return _Marks()  # built on the first run of frames: a log without tracebacks never loads its database


class QuickFrames:
    """The common frame lines read with no Line made: indented, no gutter or escape (split_line's first case),
    inside an open traceback, mentioning no server it may still record, naming no error or arch. Any other
    line is left to `read_frame_line`, nothing changed. A traceback's frames are first tried as a whole
    (`read_whole`: every test once over their joined text, where a mark across two lines only sends them the
    long way), then one by one (`read_run` of one line). tests/core/test_frame_lines.py compares both with the
    long way."""

    def __init__(
        self,
        regex: Callable[[int], re.Pattern[str]],
        servers: ServerMentions,
        failures: Failures,
        obs: Observations,
    ) -> None:
        self.regex, self.servers, self.failures, self.obs = regex, servers, failures, obs

    def read_whole(
        self,
        scan: ChunkScan,
        number: int,
        stop: int,
        plans: list[FramePlan | None],
        repeated: range,
        rank: str | None,
    ) -> int:
        """Reads the frame lines from hit `number` on (before `stop`; none sent with lines around it or
        repeated) at once: the hit after them, or 0 where they must be read one by one."""
        rules, context = scan.hit_rules, scan.context
        end = number
        while end < stop and plans[rules[end]] is not None and end not in context and end not in repeated:
            end += 1
        if end - number < 2:
            return 0
        run_plans: list[FramePlan] = [plans[rules[i]] for i in range(number, end)]  # type: ignore[misc]
        return end if self.read_run(scan.hit_text, scan.hit_ends, number, end, run_plans, rank) else 0

    def read_run(
        self,
        text: bytes,
        ends: Sequence[int],
        first: int,
        stop: int,
        plans: list[FramePlan],
        rank: str | None,
    ) -> bool:
        """Reads hits first..stop-1 (their lines in `text` up to `ends`, their plans) of process `rank`, all
        or none: False where any must be read the long way."""
        begin = ends[first - 1] if first else 0
        kinds = _marks().of(text[begin : ends[stop - 1]])
        if "always" in kinds:
            return False
        for number in range(first, stop):
            start = ends[number - 1] if number else 0
            if start == ends[number] or text[start] not in _INDENT_BYTES:
                return False
        current = self._run_traceback(kinds, plans, rank)
        if current is None:
            return False
        frames = current.tb.frames
        search = self.regex(plans[0].frame).search  # tb_frame, every plan's
        for number in range(first, stop):
            if len(frames) >= MAX_FRAMES:
                break
            frame = search(text[ends[number - 1] if number else 0 : ends[number]].decode("utf-8", "replace"))
            if frame is not None:
                file, line, function = frame.group("file", "line", "func")
                frames.append(Frame(file, int(line), function))
        return True

    def _run_traceback(
        self, kinds: set[str], plans: list[FramePlan], rank: str | None
    ) -> _OpenTraceback | None:
        """The traceback the frames add to, where reading them does nothing else (their joined text holding
        these kinds of mark, _Marks): no mention to record (ServerMentions), no arch hint to weigh
        (Environment.weak_hint), no request or kernel to note (Failures); else None."""
        servers = self.servers
        for server, weight in {(plan.server, plan.weight) for plan in plans if plan.mention is not None}:
            if "version" in kinds or servers.may_record(server, weight, ""):
                return None
        current = self.failures.open.get(rank)
        if current is None or current.finished:
            return None
        if self.obs.arch_strength < 1 and "arch" in kinds:
            return None
        if not current.request and "request" in kinds:
            return None
        return current
