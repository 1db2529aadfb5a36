"""A traceback's frame lines the short way to the extractors.

A traceback flood (100,000 frames in 100 MB) spent most of its parse handing each frame line to every
extractor: the rule confirmations, the dispatch, each extractor's tests of rules the line cannot have. A line
whose only candidate rules are `tb_frame` and one server's path mention (`.../sglang/srt/...`) goes straight
to the three extractors that read those rules, each doing what its `handle` does with such a line
(tests/core/test_frame_lines.py compares both ways).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from dispatchlab.core.parse.extract.environment import Environment
from dispatchlab.core.parse.extract.failures import Failures
from dispatchlab.core.parse.extract.servers import ServerMentions, marker_rules
from dispatchlab.core.parse.lineformat import Line
from dispatchlab.core.records import record

SHORTCUT = True  # tests turn it off to compare


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
