"""Files that hold several runs: where a server starts again, and the small record each finished run leaves.

A run's crash and outcome are decided by the same functions as the file's (`decide_crash`, `outcome`), on the
run's own observations; the scan calls `close_run` at each new start so that a crash loop of thousands of
copies keeps one small record per run, not its tracebacks and error lines.
"""

from __future__ import annotations

from dispatchlab.core.inference import run_fingerprint
from dispatchlab.core.parse.interpret.crash import crash_event, decide_crash
from dispatchlab.core.parse.interpret.phases import outcome
from dispatchlab.core.parse.model import Crash, RunSummary
from dispatchlab.core.parse.observations import Observations
from dispatchlab.core.parse.vocabulary import PROGRESS_MILESTONES

_RUN_MESSAGE = 200


def summarise_run(obs: Observations, last_line: int, crash: Crash | None) -> RunSummary:
    """The record of the current run (its crash already decided), ending at `last_line`."""
    ended = outcome(obs, crash)
    tb = next((t for t in obs.tracebacks if t.line == crash.line), None) if crash else None
    return RunSummary(
        index=obs.run_total + 1,
        first_line=obs.run_first_line,
        last_line=last_line,
        outcome=ended,
        exception=crash.exception if crash else None,
        fingerprint=run_fingerprint(ended, crash, tb),
        crash_line=crash.pointer if crash else None,
        phase=crash.phase if crash else None,
        message=crash.message[:_RUN_MESSAGE] if crash else None,
    )


def close_run(obs: Observations, last_line: int, timeline_start: int) -> None:
    """Record the current run (its crash goes on the timeline, with its own events) before a new one starts."""
    crash = decide_crash(obs)
    if crash is not None:
        obs.timeline.append(crash_event(crash, obs.timeline[timeline_start:]))
    obs.finished_run(summarise_run(obs, last_line, crash))


def last_progress(obs: Observations) -> int:
    """The last line that shows the current run got somewhere (0: none): a milestone past startup, a failure,
    an answer, a stop. A start banner after it is a new start; banners with nothing between are one start
    printed by several ranks or processes."""
    lines = [
        obs.ready_line or 0,
        obs.stop_line or 0,
        obs.served_line or 0,
        obs.first_decode_line or 0,
        obs.tracebacks[-1].line if obs.tracebacks else 0,
        obs.fatal_lines[-1].line if obs.fatal_lines else 0,
        next((m.line for m in reversed(obs.milestones) if m.name in PROGRESS_MILESTONES), 0),
    ]
    if obs.last_metric_line is not None and obs.last_metric_line >= obs.run_first_line:
        lines.append(obs.last_metric_line)
    return max(lines)


def run_ended(obs: Observations) -> bool:
    """The current run failed, was stopped or came up: nothing of its startup can follow."""
    return bool(obs.tracebacks or obs.fatal_lines or obs.ready_line or obs.stop_line or obs.served_line)
