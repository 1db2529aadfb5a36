"""Blanking secrets out of a log and out of the texts derived from it: every match of a regular
expression, or whole lines by number, become `[REDACTED]`.

A person's pattern may backtrack for longer than the universe lasts (`(a+)+$` on a line of forty `a`
and a `!`), and CPython's `re` cannot be interrupted while it matches. So the dashboard never runs a
pattern in its own process: it runs this module as a child (`python -m dispatchlab.core.redact`, a
JSON request on stdin, a JSON answer on stdout) and kills it when its time is up.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dispatchlab.core.reading import MAX_ZIP_MEMBERS, LogReadError, expansion_limit, iter_lines

REDACTED = "[REDACTED]"
MAX_PATTERN_CHARS = 500
# A line range's removed lines are also removed from the derived texts (titles, events, confirm output)
# when they are at least this long (shorter ones would blank common words) ...
MIN_NEEDLE_CHARS = 6
# ... up to this many distinct lines: past it the derived texts are matched against the first ones only.
MAX_NEEDLES = 2000


class RedactionError(ValueError):
    """The pattern or range cannot be used. str(error) is one line for people."""


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """The compiled pattern, or RedactionError saying why not. Compiling is cheap and bounded by the
    pattern's length; matching is not, which is why matching happens in a child process."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise RedactionError(
            f"the pattern must be a regular expression of at most {MAX_PATTERN_CHARS} characters"
        )
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as problem:
        raise RedactionError(f"the pattern is not a regular expression: {problem}") from None


@dataclass
class LineRedactor:
    """What to blank out: every match of `pattern`, or lines first_line..last_line (1-based)."""

    pattern: re.Pattern[str] | None = None
    first_line: int = 0
    last_line: int = 0
    needles: list[str] = field(default_factory=list)  # removed lines, for the derived texts

    def line(self, number: int, text: str) -> str:
        if self.pattern is not None:
            return self.pattern.sub(REDACTED, text)
        if not self.first_line <= number <= self.last_line:
            return text
        needle = text.strip()
        if len(needle) >= MIN_NEEDLE_CHARS and len(self.needles) < MAX_NEEDLES and needle not in self.needles:
            self.needles.append(needle)
        return REDACTED

    def text(self, value: str) -> str:
        """A derived text (a title, a launch command, a stored event's field) with the same secrets
        blanked: the pattern's matches, or any removed line it contains or that contains it."""
        if self.pattern is not None:
            return self.pattern.sub(REDACTED, value)
        stripped = value.strip()
        for needle in self.needles:
            if len(stripped) >= MIN_NEEDLE_CHARS and stripped in needle:
                return REDACTED
            value = value.replace(needle, REDACTED)
        return value

    def value(self, value: Any) -> Any:
        """Every string inside a JSON value (dict values, list items) through `text`."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(item) for item in value]
        if isinstance(value, dict):
            return {key: self.value(item) for key, item in value.items()}
        return value


def redactor_for(*, pattern: str | None, first_line: int = 0, last_line: int = 0) -> LineRedactor:
    if pattern:
        compiled = compile_pattern(pattern)
        if compiled.search(""):  # may itself backtrack: only ever called in the child
            raise RedactionError("the pattern matches empty text; make it match what is to be removed")
        return LineRedactor(pattern=compiled)
    if not 1 <= first_line <= last_line:
        raise RedactionError("the lines must satisfy 1 <= first_line <= last_line")
    return LineRedactor(first_line=first_line, last_line=last_line)


def redact_log(paths: Sequence[str | Path], target: Path, redactor: LineRedactor) -> int:
    """Write the log (as the parser numbers its lines) redacted to `target`; how many lines changed."""
    changed = 0
    with target.open("w", encoding="utf-8", errors="replace", newline="\n") as out:
        for number, line in enumerate(iter_lines(paths), start=1):
            redacted = redactor.line(number, line)
            changed += redacted != line
            out.write(redacted + "\n")
    return changed


def run(request: dict[str, Any]) -> dict[str, Any]:
    """One redaction as the child runs it: the request's log to its target, then its values.
    A refusal is an answer ({"ok": false, "reason": ...}), not an exception."""
    try:
        redactor = redactor_for(
            pattern=request.get("pattern") or None,
            first_line=int(request.get("first_line") or 0),
            last_line=int(request.get("last_line") or 0),
        )
        changed = 0
        if request.get("paths"):
            with expansion_limit(
                int(request["max_expanded_bytes"]),
                report_bytes=request.get("max_report_expanded_bytes"),
                zip_members=int(request.get("max_zip_members") or MAX_ZIP_MEMBERS),
            ):
                changed = redact_log(request["paths"], Path(request["target"]), redactor)
        return {"ok": True, "changed": changed, "values": redactor.value(request.get("values"))}
    except (RedactionError, LogReadError) as problem:
        return {"ok": False, "reason": str(problem)}
    except FileNotFoundError as problem:
        return {"ok": False, "reason": f"the stored log cannot be read: {problem.strerror}"}


def main() -> int:
    answer = run(json.load(sys.stdin))
    json.dump(answer, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
