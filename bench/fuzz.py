"""Fuzz the core's public entry points with hypothesis-generated inputs; count inputs and surprises.

    python bench/fuzz.py                         # 80,000 logs + 20,000 signature files (>= 100k inputs)
    python bench/fuzz.py --logs 2000 --signatures 500 --seed 3 --json bench/out/fuzz.json

Logs: lines of the fixture logs (tests/fixtures/logs), mutated (cut, spliced, control characters,
wide characters, huge numbers, unbalanced brackets) and mixed with random text and bytes, written to a
file (.log, sometimes .gz) and run through `dispatchlab.core.analyze_paths`, the function behind
`dispatchlab match`. The only expected exception is LogReadError (the CLI's one-line reason).
Signature files: the knowledge base's own files with fields dropped, retyped or replaced, broken
regexes and broken TOML, run through `load_signature` and then `lint_signature` (what `dispatchlab kb
lint` does per file). A bad file must give SignatureError, naming the file and the field; anything else
is a surprise. Each surprise is printed once per (exception type, place) with the smallest input that
raised it. Exit status 1 when there was one.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_LOGS = sorted((ROOT / "tests" / "fixtures" / "logs").glob("*.log"))
SIGNATURES = ROOT / "dispatchlab" / "core" / "signatures" / "data"


@dataclass
class Surprises:
    inputs: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)  # the expected answers, by kind
    by_place: dict[tuple[str, str], tuple[bytes, str]] = field(default_factory=dict)
    count: int = 0

    def record(self, data: bytes, error: BaseException) -> None:
        self.count += 1
        frame = traceback.extract_tb(error.__traceback__)[-1]
        place = (type(error).__name__, f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}")
        known = self.by_place.get(place)
        if known is None or len(data) < len(known[0]):
            self.by_place[place] = (data, f"{type(error).__name__}: {error}"[:300])


# ---------------------------------------------------------------- logs

REAL_LINES = [
    line for path in FIXTURE_LOGS for line in path.read_text(errors="replace").splitlines() if line.strip()
]
NASTY = ["\x00", "\r", "\x1b[31m", "\u202e", "\U0001f4a5", "(", ")", "[", "]", "'", '"', "=", ",", "\\"]
NUMBERS = ["1e309", "-0", "99999999999999999999999", "nan", "inf", "0x1f", "1.2.3", "-1"]


@st.composite
def mutated_line(draw: Any) -> str:
    line = draw(st.sampled_from(REAL_LINES))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(line)))
        choice = draw(st.integers(0, 3))
        if choice == 0:
            line = line[:at]  # cut
        elif choice == 1:
            line = line[:at] + draw(st.sampled_from(NASTY + NUMBERS)) + line[at:]
        elif choice == 2:
            line = line[:at] + draw(st.sampled_from(REAL_LINES)) + line[at:]  # spliced
        else:
            line = line[:at] + draw(st.text(max_size=20)) + line[at:]
    return line


log_lines = st.lists(
    st.one_of(st.sampled_from(REAL_LINES), mutated_line(), st.text(max_size=80)), min_size=0, max_size=25
)


@st.composite
def log_file(draw: Any) -> tuple[bytes, str]:
    text = "\n".join(draw(log_lines))
    data = text.encode("utf-8", "surrogatepass") if draw(st.booleans()) else text.encode("utf-8", "replace")
    if draw(st.integers(0, 19)) == 0:
        data += draw(st.binary(max_size=64))  # a binary tail
    suffix = ".log.gz" if draw(st.integers(0, 9)) == 0 else ".log"
    return data, suffix


def fuzz_logs(count: int, seed_value: int, folder: Path, surprises: Surprises) -> None:
    from dispatchlab.core import LogReadError, analyze_paths

    analyze_paths(FIXTURE_LOGS[:1])  # compile the knowledge base once, outside the count

    @seed(seed_value)
    @settings(**_settings(count))
    @given(log_file())
    def one(case: tuple[bytes, str]) -> None:
        data, suffix = case
        path = folder / f"fuzz{suffix}"
        path.write_bytes(gzip.compress(data, compresslevel=1) if suffix.endswith(".gz") else data)
        surprises.inputs += 1
        try:
            document = analyze_paths([path])
            json.dumps(document)  # what leaves the process must be JSON
            surprises.outcomes[f"parsed, class {document.get('failure_class')}"] += 1
        except LogReadError:
            surprises.outcomes["LogReadError"] += 1
        except Exception as error:
            surprises.record(data, error)

    one()


# ---------------------------------------------------------------- signature files

SIGNATURE_TEXTS = [path.read_text() for path in sorted(SIGNATURES.rglob("*.toml"))]
VALUES = ['""', "0", "-1", "true", "[]", "{}", '"(unclosed"', '"[a-"', '"a{2,1}"', '"(?P<x>a)(?P<x>b)"',
          '"\\\\"', '"*"', '"(?<=a+)b"', "1e999", '"\\u0000"', "[1, 2]", '["(", ")"]', '{ any = "x" }']  # fmt: skip


@st.composite
def signature_file(draw: Any) -> str:
    lines = draw(st.sampled_from(SIGNATURE_TEXTS)).splitlines()
    for _ in range(draw(st.integers(1, 4))):
        if not lines:
            break
        at = draw(st.integers(0, len(lines) - 1))
        choice = draw(st.integers(0, 4))
        key = lines[at].split("=", 1)[0].rstrip()
        if choice == 0:
            del lines[at]  # a field or a table header dropped
        elif choice == 1 and "=" in lines[at]:
            lines[at] = f"{key} = {draw(st.sampled_from(VALUES))}"  # retyped or broken value
        elif choice == 2:
            lines.insert(at, draw(st.sampled_from(lines)))  # a duplicate line
        elif choice == 3:
            lines[at] = lines[at][: draw(st.integers(0, len(lines[at])))]  # cut
        else:
            lines.insert(at, draw(st.text(max_size=40)))
    return "\n".join(lines) + "\n"


def fuzz_signatures(count: int, seed_value: int, folder: Path, surprises: Surprises) -> None:
    from dispatchlab.core.signatures import SignatureError, load_signature
    from dispatchlab.core.signatures.lint import lint_signature

    @seed(seed_value)
    @settings(**_settings(count))
    @given(signature_file())
    def one(text: str) -> None:
        match = next((line for line in text.splitlines() if line.startswith("id = ")), 'id = "fuzz"')
        name = match.split("=", 1)[1].strip().strip('"') or "fuzz"
        path = folder / f"{''.join(c for c in name if c.isalnum() or c in '-_') or 'fuzz'}.toml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        surprises.inputs += 1
        try:
            signature = load_signature(path)
            problems = lint_signature(signature)
            surprises.outcomes["lint problems" if problems else "loaded clean"] += 1
        except SignatureError as error:
            surprises.outcomes[f"SignatureError on {error.field_name}"] += 1
            if str(path) not in str(error):
                surprises.record(
                    text.encode(errors="replace"), AssertionError(f"error names no file: {error}")
                )
        except Exception as error:
            surprises.record(text.encode(errors="replace"), error)
        finally:
            path.unlink(missing_ok=True)

    one()


# ---------------------------------------------------------------- main


def _settings(count: int) -> dict[str, Any]:
    # Generate only (no shrinking: a surprise is recorded, not raised), no example database, no deadline.
    return {
        "max_examples": count,
        "phases": [Phase.generate],
        "database": None,
        "deadline": None,
        "suppress_health_check": list(HealthCheck),
    }


def _run(name: str, target: Callable[..., None], count: int, seed_value: int, folder: Path) -> dict[str, Any]:
    surprises = Surprises()
    started = time.monotonic()
    target(count, seed_value, folder, surprises)
    elapsed = time.monotonic() - started
    print(
        f"{name}: {surprises.inputs:,} inputs in {elapsed:.0f} s ({surprises.inputs / elapsed:,.0f}/s), "
        f"{surprises.count} unexpected exceptions at {len(surprises.by_place)} places",
        flush=True,
    )
    print("  expected answers:", ", ".join(f"{kind} {n:,}" for kind, n in surprises.outcomes.most_common(8)))
    for (kind, place), (data, message) in sorted(surprises.by_place.items()):
        print(f"  {kind} at {place}: {message}\n    smallest input ({len(data)} bytes): {data[:400]!r}")
    return {
        "inputs": surprises.inputs,
        "seconds": round(elapsed, 1),
        "unexpected": surprises.count,
        "outcomes": dict(surprises.outcomes.most_common()),
        "places": {
            f"{kind} at {place}": message for (kind, place), (_, message) in surprises.by_place.items()
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=int, default=80_000, help="generated logs")
    parser.add_argument("--signatures", type=int, default=20_000, help="generated signature files")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dispatchlab-fuzz-") as scratch:
        folder = Path(scratch)
        figures = {
            "signatures": _run("signature files", fuzz_signatures, args.signatures, args.seed, folder),
            "logs": _run("logs", fuzz_logs, args.logs, args.seed, folder),
        }
    total = sum(part["inputs"] for part in figures.values())
    unexpected = sum(part["unexpected"] for part in figures.values())
    print(f"total: {total:,} inputs, {unexpected} unexpected exceptions")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2))
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
