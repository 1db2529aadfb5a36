"""The scan stage: one pass over the bytes, multi-pattern prefiltered, rule hits handed to the extractors.

Chunk scans (chunkscan; where they are made: sources.py) arrive in file order; their hits go to the
extractors, which append to one Observations record.
"""

from __future__ import annotations

import bisect
import re
from array import array
from typing import TYPE_CHECKING

from dispatchlab.core.parse import framelines, heldstarts
from dispatchlab.core.parse.chunkscan import ChunkScan, Hit
from dispatchlab.core.parse.extract import Hits
from dispatchlab.core.parse.extract.arguments import COMMAND_START
from dispatchlab.core.parse.extract.environment import Environment
from dispatchlab.core.parse.extract.failures import Failures
from dispatchlab.core.parse.extract.metrics import Metrics
from dispatchlab.core.parse.extract.servers import ServerMentions
from dispatchlab.core.parse.framelines import FramePlan, QuickFrames, plans_for, read_frame_line
from dispatchlab.core.parse.heldstarts import StartEffect, file_facts, lone_hit, shape_of
from dispatchlab.core.parse.interpret.phases import seconds_between
from dispatchlab.core.parse.interpret.runs import close_run, last_progress, run_ended
from dispatchlab.core.parse.lineformat import Line, split_line
from dispatchlab.core.parse.model import PatternHit, RunSummary
from dispatchlab.core.parse.observations import Observations
from dispatchlab.core.parse.rules import EXTRACTORS, WANTS, CompiledRules
from dispatchlab.core.parse.vocabulary import (
    MAX_MESSAGE,
    MAX_TIMELINE_EVENTS,
    METRIC_POINTS_TARGET,
)
from dispatchlab.core.reading import decode_line
from dispatchlab.core.records import record, replace

if TYPE_CHECKING:
    from dispatchlab.core.lineindex import LineIndexWriter

_DUMP_MARKS = ("server_args=ServerArgs(", "non-default args:", "with config:")
# What a server prints once per start, read from SGLang's and vLLM's own startup logging: SGLang's args dump,
# vLLM's API-server version and non-default args, a launch command line. vLLM's engine banner ("Initializing
# a V1 LLM engine ... with config:") is printed by every data-parallel engine, so it starts a run only after
# the last one failed, stopped or came up, or when the clock went back. "Starting vLLM API server on" is
# not one: vLLM prints it when the engine is up (the `vllm_ready` milestone).
_START_RULES = frozenset({"args_dump", "vllm_non_default", "vllm_version", "launch"})
_ENGINE_START_RULES = frozenset({"vllm_engine_config"})
_ANY_START = _START_RULES | _ENGINE_START_RULES
_CLOCK_BACK_SECONDS = 60
_COMMAND_AT_START = 40  # a launch command opens its line (after a prompt or a short label), not quoted in one


_MAX_TEMPLATE_HITS = 20_000  # a run compared with the next holds this many hits at most
# Past this many runs a file is a crash loop: each run is compared with the last one read, a repeat is replayed
# from its record, and the events of every run but the first and the current one are counted, not kept (the
# same whether a run was read or replayed, so the document does not depend on which)
_LOOP_RUNS = 20
_MAX_START_EFFECTS = 64  # start lines' effects kept at once (heldstarts.py)

_ExtraHits = list[tuple[int, re.Match[str]]]  # (extra pattern, its match) of a line
_ReadLine = tuple[Line, Hits, _ExtraHits]  # a line and its hits


@record(frozen=True)
class RunTemplate:
    """The last run read line by line: its hits' keys (after its start line), the key of the start that
    ended it, its record, and what it added to the file's counts (events, warnings, server votes)."""

    keys: array[int]
    end_key: int
    summary: RunSummary
    events: int
    warnings: int
    votes: dict[str, int]


class Scan:
    """One parse's pass: chunk scans in, Observations out."""

    def __init__(self, rules: CompiledRules, stride: int, index: LineIndexWriter | None = None) -> None:
        self.rules = rules
        self.index = index
        self.stride = stride
        self.next_sample = 0
        self.last_process: str | None = None  # the rank of the last prefixed line: bare lines belong to it
        self.obs = Observations()
        self.metrics = Metrics(self.obs)
        self.source_first_line = 1
        self.run_timeline_start = 0  # the current run's first event in obs.timeline
        self.run_latest_time: str | None = None
        self.run_banner_line: int | None = None  # the current run's first start banner
        # a crash loop's runs: each is compared with the last one read line by line, and a repeat is replayed
        self.template: RunTemplate | None = None
        self.run_keys: list[int] | None = None  # the current run's hit keys, while it is read line by line
        self.current_key = 0
        # held hits (scan, base line, first, stop, b"") and statistics lines (None, line, 0, 0, the line)
        self.pending: list[tuple[ChunkScan | None, int, int, int, bytes]] = []
        self.comparing = False
        self.matched = 0
        self.force_start = False
        self.last_hit_line = -1  # the last hit's 0-based line in the file: the distance to the next one
        self.run_truncated_start = 0
        self.run_warnings_start = 0
        self.run_votes_start: dict[str, int] = {}
        self.clock_shapes: set[int] = set()  # keys of lines with no process and no time (_clock_from_held)
        # by a crash loop's start line's key: what reading it added to the file's counts (_note_start_effect)
        self.start_effects: dict[int, StartEffect] = {}
        self.held_start: tuple[ChunkScan, int, int] | None = (
            None  # a start line not read yet: scan, base, hit
        )
        self._make_extractors()

    def _make_extractors(self) -> None:
        made = {cls: cls(self.obs) for cls in EXTRACTORS}
        failures, servers, environment = made[Failures], made[ServerMentions], made[Environment]
        assert isinstance(failures, Failures)
        assert isinstance(servers, ServerMentions) and isinstance(environment, Environment)
        self.failures = failures  # it closes the tracebacks still open at the end
        self.servers, self.environment = servers, environment  # they and failures read frame lines
        self.quick_frames = QuickFrames(self.rules.scanner.regex, servers, failures, self.obs)
        self.extractors = [(e, WANTS[type(e)]) for e in made.values()]

    def feed(self, scan: ChunkScan) -> None:
        obs = self.obs
        base = obs.line_count
        samples = scan.samples
        si = 0
        number = 0
        total = len(scan)
        if total:
            first = base + scan.hit_lines[0]
            scan.hit_keys[0] = hash((scan.first_content, first - self.last_hit_line))
            self.last_hit_line = base + scan.hit_lines[-1]
        plans = plans_for(self.rules.frame_plans, scan.rule_sets)
        while number < total:
            index = scan.hit_lines[number]
            if si < len(samples) and samples[si][0] < index:
                self._sample(samples[si][1], base + samples[si][0] + 1)
                si += 1
                continue
            if self.comparing:
                before = samples[si][0] if si < len(samples) else None
                number = self._compare(scan, base, number, before)
                continue
            if plans[scan.hit_rules[number]] is not None:
                # the frame lines up to the next statistics line, in one go
                stop = (
                    bisect.bisect_right(scan.hit_lines, samples[si][0], number)
                    if si < len(samples)
                    else total
                )
                done = self._frame_hits(scan, base, number, stop, plans)
                if done > number:
                    number = done
                    continue
            self._hit(scan.hit(number), base)
            number += 1
        for index, raw in samples[si:]:
            self._sample(raw, base + index + 1)
        obs.line_count += scan.lines
        obs.metric_total += scan.metric_lines
        obs.scanned_bytes += scan.size
        if not scan.with_sampled:
            obs.unsampled_bytes += scan.size
        while len(obs.metric_points) > 2 * METRIC_POINTS_TARGET:
            # the log is bigger than its stored size said (compressed, stdin): halve the resolution
            obs.metric_points = obs.metric_points[::2]
            self.stride *= 2

    def _sample(self, raw: bytes, number: int) -> None:
        if self.pending:  # after the held hits, in line order
            self.pending.append((None, number, 0, 0, raw))
            return
        # a statistics line right after a held start line: that line is read first, as it would have been (a
        # sample put off would change when the series is halved)
        self._read_held_start()
        self.metrics.sample(raw, number)

    def _read_held_start(self) -> None:
        held, self.held_start = self.held_start, None
        if held is not None:
            self._read_start(held[0].hit(held[2]), held[1])

    def _hit(self, hit: Hit, base: int, read: _ReadLine | None = None) -> None:
        if self.run_keys is not None:
            self.run_keys.append(hit.key)
        self.current_key = hit.key
        if hit.previous:
            # "[ts] Tokenizer init failed:" then a bare traceback: it belongs to that process
            self._note_process(split_line(base + hit.index, decode_line(hit.previous), self.obs.year))
        if read is None:
            self._line(hit.raw, base + hit.index + 1, hit.rules, hit.following)
        else:
            read[0].number = base + hit.index + 1
            self._read_line(read[0], hit.rules, hit.following, read[1:])

    def _frame_hits(
        self, scan: ChunkScan, base: int, number: int, stop: int, plans: list[FramePlan | None]
    ) -> int:
        """`_hit` of the hits from `number` (before `stop`) whose candidate rules are a frame line's
        (framelines), up to the first that is not or was sent with lines around it or repeated; returns the
        hit after the last one read (`number` when it is none). One loop for a traceback's frames: a call
        per frame line was a tenth of a traceback flood's parse."""
        hit_lines, hit_keys, hit_rules, text, ends = (
            scan.hit_lines,
            scan.hit_keys,
            scan.hit_rules,
            scan.hit_text,
            scan.hit_ends,
        )
        context, repeats = scan.context, scan.repeats
        repeated = (
            range(0) if repeats is None else range(repeats.first_hit, repeats.first_hit + repeats.count)
        )
        regex, servers, environment, failures = (
            self.rules.scanner.regex,
            self.servers,
            self.environment,
            self.failures,
        )
        run_keys = self.run_keys
        quick = self.quick_frames if framelines.QUICK else None
        if quick is not None and (
            done := quick.read_whole(scan, number, stop, plans, repeated, self.last_process)
        ):
            self.current_key = hit_keys[done - 1]
            if run_keys is not None:
                run_keys.extend(hit_keys[number:done])
            return done
        while number < stop:
            plan = plans[hit_rules[number]]
            if plan is None or number in context or number in repeated:
                break
            self.current_key = key = hit_keys[number]
            if run_keys is not None:
                run_keys.append(key)
            if quick is not None and quick.read_run(
                text, ends, number, number + 1, [plan], self.last_process
            ):
                number += 1
                continue
            raw = text[ends[number - 1] if number else 0 : ends[number]]
            line = split_line(base + hit_lines[number] + 1, decode_line(raw), self.obs.year)
            if line.prefixed or line.time or line.style != "plain":
                self._read_line(line, scan.rule_sets[hit_rules[number]], b"")
            else:
                line.rank = self.last_process  # a bare line belongs to the process printing around it
                read_frame_line(line, plan, regex, servers, environment, failures)
            number += 1
        return number

    # ---------------------------------------------------------------- a crash loop's repeated runs
    def _compare(self, scan: ChunkScan, base: int, number: int, before: int | None) -> int:
        """Hits of the current run are held while they repeat the last run's, line for line (digits aside);
        returns the next hit to look at."""
        template = self.template
        assert template is not None
        keys = scan.hit_keys
        remaining = len(template.keys) - self.matched
        if remaining:
            stop = min(len(keys), number + remaining)
            if before is not None:
                stop = min(stop, bisect.bisect_left(scan.hit_lines, before, number, stop))
            if (
                stop > number
                and keys[number:stop] == template.keys[self.matched : self.matched + stop - number]
            ):
                self.pending.append((scan, base, number, stop, b""))
                self.matched += stop - number
                return stop
            self._flush()
            return number
        # the whole run repeated: is this the start that followed it?
        hit = scan.hit(number)
        effect = self.start_effects.get(hit.key) if heldstarts.HOLD_STARTS else None
        if (
            hit.key == template.end_key
            and effect is not None
            and effect.holds(hit.raw)
            and lone_hit(scan, number)
        ):
            # a start line read before but for its digits' values: held, read if its run is no repeat
            self._replay_run(base + hit.index + 1)
            self._hold_start(scan, base, number, hit.raw)
            return number + 1
        start = self._start_line(hit) if hit.key == template.end_key else None
        if start is not None:
            self._replay_run(base + hit.index + 1)
            obs = self.obs
            votes, warnings, facts = dict(obs.server_votes), obs.warnings_count, file_facts(obs)
            self._read_start(hit, base, start)
            self._note_start_effect(hit, votes, warnings, facts)
        else:
            self._flush()
            self._hit(hit, base)
        return number + 1

    def _start_line(self, hit: Hit) -> _ReadLine | None:
        """The hit's line and its hits where it starts a run (then read as they are: replaying the run before
        changes nothing they depend on), else None."""
        line = split_line(0, decode_line(hit.raw), self.obs.year)
        hits, extra = self._hits(line, hit.rules)
        if _ANY_START.isdisjoint(hits) or not self._is_banner(line, hits):
            return None
        return line, hits, extra

    def _read_start(self, hit: Hit, base: int, start: _ReadLine | None = None) -> None:
        self.force_start = True
        self._hit(hit, base, start or self._start_line(hit))
        self.force_start = False

    def _note_start_effect(
        self, hit: Hit, votes: dict[str, int], warnings: int, facts: tuple[object, ...]
    ) -> None:
        """What reading a start line in a crash loop added to the file's counts; a start line like it is held
        from then on, unless reading it changed anything else the file keeps."""
        obs = self.obs
        if file_facts(obs) != facts:
            self.start_effects.pop(hit.key, None)
            return
        added = {server: count - votes.get(server, 0) for server, count in obs.server_votes.items()}
        if len(self.start_effects) >= _MAX_START_EFFECTS:
            self.start_effects.clear()  # start lines that keep changing (a host, a path): memory stays flat
        self.start_effects[hit.key] = StartEffect(shape_of(hit.raw), added, obs.warnings_count - warnings)

    def _hold_start(self, scan: ChunkScan, base: int, number: int, raw: bytes) -> None:
        """A run starts here as `_new_run` starts a replayed one, its start line not read: what it sets that a
        replay keeps (its line, clock and process) is taken from the line; what it adds to the file's counts
        is added when its run is replayed; and the line is read after all if its run is no repeat."""
        obs = self.obs
        line = split_line(base + scan.hit_lines[number] + 1, decode_line(raw), obs.year)
        if obs.run_total > _LOOP_RUNS:
            obs.truncated_events += len(obs.timeline) - self.run_timeline_start
            del obs.timeline[self.run_timeline_start :]
        obs.new_run(line.number)
        self._compact_timeline()
        self._start_run_record()
        self.run_banner_line = line.number
        self.run_latest_time = line.time
        if line.time:
            if line.style == "sglang" and obs.year is None:
                obs.year = line.time[:4]
            obs.last_time = line.time
        self._note_process(line)
        self.current_key = scan.hit_keys[number]
        self.held_start = (scan, base, number)

    def _flush(self) -> None:
        """The current run is not a repeat: its held hits go through the extractors after all."""
        self._read_held_start()  # its start line first
        self.comparing = False
        pending, self.pending = self.pending, []
        for scan, base, start, stop, raw in pending:
            if scan is None:
                self.metrics.sample(raw, base)
                continue
            for number in range(start, stop):
                self._hit(scan.hit(number), base)

    def _replay_run(self, next_start: int) -> None:
        """The run held repeats the last one read: it ended the same way, so its record is that run's record
        moved to its own lines, and its events are counted, not kept (a crash loop's middle runs leave
        counts)."""
        obs = self.obs
        template = self.template
        assert template is not None
        shift = obs.run_first_line - template.summary.first_line
        crash_line = template.summary.crash_line
        for scan, number, _start, _stop, raw in self.pending:
            if scan is None:
                self.metrics.sample(raw, number)
        if self.held_start is not None:  # what reading its start line would have added
            held, self.held_start = self.held_start, None
            effect = self.start_effects[held[0].hit_keys[held[2]]]
            for server, votes in effect.votes.items():
                obs.server_votes[server] += votes
            obs.warnings_count += effect.warnings
        self.failures.finish()
        obs.finished_run(
            replace(
                template.summary,
                index=obs.run_total + 1,
                first_line=obs.run_first_line,
                last_line=next_start - 1,
                crash_line=None if crash_line is None else crash_line + shift,
            )
        )
        # counted as the template's events: its start line's events are dropped with the run's (_new_run)
        obs.truncated_events += template.events - (len(obs.timeline) - self.run_timeline_start)
        obs.warnings_count += template.warnings
        for server, votes in template.votes.items():
            obs.server_votes[server] += votes
        self._clock_from_held()
        self.pending = []

    def _clock_from_held(self) -> None:
        """The latest time and process of the held run's last lines (every line read would set them)."""
        obs = self.obs
        held = [
            (scan, base, start, stop) for scan, base, start, stop, _raw in self.pending if scan is not None
        ]
        noted = timed = False
        shapes = self.clock_shapes
        if len(shapes) > 4096:
            shapes.clear()
        for scan, base, start, stop in reversed(held[-2:]):
            keys = scan.hit_keys
            for number in range(stop - 1, max(start, stop - 20) - 1, -1):
                # a line of the same shape (digits aside) as one that had no process and no time has neither:
                # a crash loop's runs end in the same bare traceback lines, read once, not once per run
                if keys[number] in shapes:
                    continue
                hit = scan.hit(number)
                line = split_line(base + hit.index + 1, decode_line(hit.raw), obs.year)
                if not line.prefixed and not line.time:
                    shapes.add(keys[number])
                if not noted and line.prefixed:
                    self.last_process, noted = line.rank, True
                if not timed and line.time:
                    obs.last_time, timed = line.time, True
                    if self.run_latest_time is None or line.time > self.run_latest_time:
                        self.run_latest_time = line.time
                if noted and timed:
                    return

    def _keep_template(self) -> None:
        """The run that just ended was read line by line: the next runs are compared with it."""
        obs = self.obs
        keys = self.run_keys
        self.template = None
        if keys is not None and len(keys) <= _MAX_TEMPLATE_HITS and obs.runs:
            events = (
                len(obs.timeline) - self.run_timeline_start + obs.truncated_events - self.run_truncated_start
            )
            votes = {k: v - self.run_votes_start.get(k, 0) for k, v in obs.server_votes.items()}
            # the last key is the start that ended the run
            warnings = obs.warnings_count - self.run_warnings_start
            self.template = RunTemplate(
                array("q", keys[:-1]), self.current_key, obs.runs[-1], events, warnings, votes
            )

    def _line(self, raw: bytes, number: int, rule_ids: tuple[int, ...] | None, following: bytes) -> None:
        self._read_line(split_line(number, decode_line(raw), self.obs.year), rule_ids, following)

    def _read_line(
        self,
        line: Line,
        rule_ids: tuple[int, ...] | None,
        following: bytes,
        found: tuple[Hits, _ExtraHits] | None = None,
    ) -> None:
        obs = self.obs
        if not line.prefixed:
            line.rank = self.last_process  # a bare line belongs to the process printing around it
        hits, extra = self._hits(line, rule_ids) if found is None else found
        if not _ANY_START.isdisjoint(hits) and self._is_banner(line, hits):
            if self.force_start or self._starts_run(line, hits):
                self._new_run(line, replayed=self.force_start)
            elif self.run_banner_line is None:
                self.run_banner_line = line.number
        for index, m in extra:
            self._extra_hit(index, line, m)
        if line.time:
            if line.style == "sglang" and obs.year is None:
                obs.year = line.time[:4]
            obs.last_time = line.time
            if self.run_latest_time is None or line.time > self.run_latest_time:
                self.run_latest_time = line.time
        self._note_process(line)
        if line.style == "trtllm":
            obs.server_votes["tensorrt_llm"] += 3
        elif line.style in ("sglang", "vllm"):
            obs.server_votes[line.style] += 1
        if hits:
            for extractor, wants in self.extractors:
                if not wants.isdisjoint(hits) and extractor.handle(line, hits, following):
                    break

    def _note_process(self, line: Line) -> None:
        if line.prefixed:
            self.last_process = line.rank

    def _hits(self, line: Line, rule_ids: tuple[int, ...] | None) -> tuple[Hits, _ExtraHits]:
        """The extractors' rules that match the line, and the extra patterns' (recorded once the line's run
        is known)."""
        regex = self.rules.scanner.regex
        names = self.rules.names
        base = self.rules.rule_count
        hits: Hits = {}
        extra: _ExtraHits = []
        kept, most = self.obs.pattern_hits, self.rules.extra.max_hits
        for rule in range(len(self.rules.scanner.patterns)) if rule_ids is None else rule_ids:
            if rule >= base and len(kept.get(rule - base, ())) >= most:
                continue  # its hits are all kept: not searched again on each traceback of a flood
            m = regex(rule).search(line.msg)
            if m is None:
                continue
            if rule >= base:
                extra.append((rule - base, m))
            else:
                hits[names[rule]] = m
        return hits, extra

    # ---------------------------------------------------------------- runs
    def _starts_run(self, line: Line, hits: Hits) -> bool:
        """A start banner begins a new run when the current run started with one and got somewhere in this
        file since; banners with nothing between them are one start (several ranks, nodes or processes
        printing it). A run with no banner of its own is an excerpt (an error pasted above its command)."""
        obs = self.obs
        if self.run_banner_line is None:
            return False
        progress = last_progress(obs)
        for current in self.failures.open.values():
            progress = max(progress, current.tb.line)
        if progress <= self.run_banner_line or progress < self.source_first_line:
            return False
        if _ENGINE_START_RULES.isdisjoint(hits):
            return True
        # processes flush out of order by seconds; a start a minute before the run's latest line is another run
        back = seconds_between(line.time, self.run_latest_time)
        return (back is not None and back > _CLOCK_BACK_SECONDS) or run_ended(obs) or bool(self.failures.open)

    @staticmethod
    def _is_banner(line: Line, hits: Hits) -> bool:
        if "args_dump" in hits or "vllm_non_default" in hits:
            return True
        if "vllm_version" in hits and "server version" in line.msg:
            return True  # not `collect_env`'s "vLLM Version :", pasted anywhere
        if "vllm_engine_config" in hits and "Initializing" in line.msg:
            return True  # not the engine's input dump at a crash ("Dumping input data for V1 LLM engine")
        command = COMMAND_START.search(line.msg) if "launch" in hits else None
        return command is not None and command.start() <= _COMMAND_AT_START

    def _new_run(self, line: Line, *, replayed: bool = False) -> None:
        obs = self.obs
        if not replayed:  # a replayed run's record is already kept
            self.failures.finish()
            close_run(obs, line.number - 1, self.run_timeline_start)
            self._keep_template()
        if (
            obs.run_total > _LOOP_RUNS
        ):  # a crash loop: the runs between the first and the current leave counts
            obs.truncated_events += len(obs.timeline) - self.run_timeline_start
            del obs.timeline[self.run_timeline_start :]
        obs.new_run(line.number)
        self._make_extractors()
        self._compact_timeline()
        self._start_run_record()
        self.run_latest_time = None
        self.run_banner_line = line.number
        obs.event(line, "phase", "server_start", f"run {obs.run_total + 1}: the server starts again")

    def _start_run_record(self) -> None:
        obs = self.obs
        self.run_timeline_start = len(obs.timeline)
        self.run_truncated_start = obs.truncated_events
        self.run_warnings_start = obs.warnings_count
        self.run_votes_start = dict(obs.server_votes)
        self.run_keys = []
        self.comparing = self.template is not None and obs.run_total >= _LOOP_RUNS
        self.matched = 0

    def begin_source(self, first_line: int) -> None:
        """Runs are compared within one source only."""
        self._flush()
        self.source_first_line = first_line
        self.template = None
        self.run_keys = None

    def _compact_timeline(self) -> None:
        """A crash loop must leave room for its last run: past half the cap, the events of the runs between
        the first and the one just finished go (counted in truncated_events)."""
        obs = self.obs
        if len(obs.timeline) <= MAX_TIMELINE_EVENTS // 2 or obs.run_total < 3:
            return
        first_end, keep_from = obs.runs[0].last_line, obs.runs[-1].first_line
        kept = [e for e in obs.timeline if e.line <= first_end or e.line >= keep_from]
        if len(kept) > MAX_TIMELINE_EVENTS // 2:
            kept = [e for e in kept if e.line >= keep_from]
        obs.truncated_events += len(obs.timeline) - len(kept)
        obs.timeline = kept

    def _extra_hit(self, index: int, line: Line, m: re.Match[str]) -> None:
        if any(mark in line.msg for mark in _DUMP_MARKS):
            return
        hits = self.obs.pattern_hits.setdefault(index, [])
        if len(hits) < self.rules.extra.max_hits:
            groups = {k: v for k, v in m.groupdict().items() if v is not None}
            hits.append(PatternHit(line.number, line.rank, line.msg[:MAX_MESSAGE], groups))

    def finish(self) -> Observations:
        self._flush()
        self.failures.finish()
        return self.obs
