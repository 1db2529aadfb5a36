"""Similar incidents: the known cases (labelled public threads) whose failure evidence reads most like a log's.

The evidence of a diagnosed document is its terminal exception and message, its fatal error lines and the
evidence lines of its best failure match, normalised as the fingerprint normalises text (numbers, hex,
paths, shapes, ranks). Terms are word unigrams and bigrams, weighted by TF-IDF (sublinear term frequency)
and compared by cosine. The index of known cases is built by `train_index` from labelled folders and ships
as package data; it is read on the first failed log only, so a clean log costs nothing.

    python -m dispatchlab.core.similar build [--out FILE] [DIR...]
    python -m dispatchlab.core.similar hit-rate DIR [DIR...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from dispatchlab.core.inference import _normalise_text
from dispatchlab.core.parse.vocabulary import NOT_FAILURE_EVIDENCE

INDEX_PATH = Path(__file__).resolve().parent / "data" / "similar-index.json"
_FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
DEFAULT_DIRS = (_FIXTURES / "cases", _FIXTURES / "longtail")
# The locked test split is evaluated once, by someone who has not tuned on it: it never feeds an index.
LOCKED_FOLDER = "cases-locked"
INDEX_VERSION = 1

TOP = 3
# Below this cosine two logs share little more than log scaffolding ("error", "rank", "worker"): not shown.
FLOOR = 0.1
MAX_LINES = 24  # evidence lines read per document: a crash says what it is in its first few
MAX_TERMS = 80  # terms kept per known case: its strongest, which also keeps the index small

_STOPWORDS = frozenset(
    [
        "the",
        "a",
        "an",
        "of",
        "to",
        "in",
        "on",
        "at",
        "is",
        "are",
        "was",
        "be",
        "by",
        "for",
        "and",
        "or",
        "not",
        "no",
        "it",
        "its",
        "this",
        "that",
        "with",
        "as",
        "from",
        "has",
        "have",
        "had",
        "but",
        "if",
        "then",
        "so",
        "can",
        "could",
        "will",
        "would",
        "may",
        "you",
        "your",
        "we",
        "our",
    ]
)
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")
_WORD = re.compile(r"[a-z][a-z0-9]*")
_THREAD = re.compile(r"github\.com/([^/\s]+)/([^/\s]+)/(?:issues|pull|discussions)/(\d+)", re.IGNORECASE)

K = TypeVar("K")

EVIDENCE_KEYS = ("failure_class", "crash", "errors", "matches")


# ---------------------------------------------------------------- text
def evidence_of(document: Mapping[str, Any]) -> str:
    """The failure evidence of a `match` document, one line each; empty when the log shows no failure.

    It reads the JSON document (not the typed diagnosis) because the server ranks its failure groups by
    the documents it stored: one reading for both keeps the CLI's and the dashboard's ranking alike. It
    reads only EVIDENCE_KEYS (of `matches`, the first), so the server fetches those parts and no more."""
    if document.get("failure_class") in (None, "", "none"):
        return ""
    lines: list[str] = []
    crash = document.get("crash")
    if isinstance(crash, dict):
        lines.append(" ".join(str(crash.get(key) or "") for key in ("exception", "message")))
        if crash.get("phase"):
            lines.append(f"crashed in {crash['phase']}")
    errors = [e for e in document.get("errors") or [] if isinstance(e, dict)]
    fatal = [e for e in errors if e.get("fatal") and e.get("kind") not in NOT_FAILURE_EVIDENCE]
    # nothing fatal: the lines that made the class (nonsense output, an error that stopped nothing)
    for error in fatal or [e for e in errors if e.get("kind") not in ("sigquit", "request_error")]:
        lines.append(f"{error.get('kind') or ''} {error.get('text') or ''}")
    # failures rank first: the best match is one, or no failure signature matched
    top = (document.get("matches") or [None])[0]
    if isinstance(top, dict) and top.get("level") == "failure":
        lines += [str(e.get("text") or "") for e in top.get("evidence") or [] if isinstance(e, dict)]
    unique = list(dict.fromkeys(line.strip() for line in lines if line.strip()))
    return "\n".join(unique[:MAX_LINES])


def terms(text: str) -> list[str]:
    """Normalised word unigrams and bigrams of each line (a bigram never spans two lines)."""
    out: list[str] = []
    for line in text.splitlines():
        words = [
            w
            for w in _WORD.findall(_CAMEL.sub(" ", _normalise_text(line)).lower().replace("_", " "))
            if len(w) > 1 and w not in _STOPWORDS
        ]
        out += words
        out += [f"{a} {b}" for a, b in itertools.pairwise(words)]
    return out


def thread_of(label: Mapping[str, Any], fallback: str) -> str:
    """The thread a label comes from (`owner/repo#N`), so that two excerpts of one thread count as one."""
    url = str(label.get("source") or label.get("url") or "")
    found = _THREAD.search(url)
    if found:
        return f"{found.group(1)}/{found.group(2)}#{found.group(3)}".lower()
    return url or fallback


# ---------------------------------------------------------------- the index
@dataclass(frozen=True, eq=False)  # never compared: no generated __eq__
class KnownCase:
    id: str
    url: str
    title: str
    failure_class: str
    fix: str | None
    thread: str
    vector: dict[str, float]


@dataclass(frozen=True, eq=False)  # never compared: no generated __eq__
class SimilarCase:
    id: str
    url: str
    title: str
    failure_class: str
    fix: str | None
    score: float

    def to_dict(self) -> dict[str, Any]:
        return vars(self).copy()


def _unit(weights: dict[str, float]) -> dict[str, float]:
    norm = math.sqrt(sum(w * w for w in weights.values()))
    return {t: w / norm for t, w in weights.items()} if norm else {}


def _cosine(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    if len(a) > len(b):
        a, b = b, a
    return sum(w * b.get(t, 0.0) for t, w in a.items())


@dataclass(frozen=True, eq=False)  # never compared: no generated __eq__
class SimilarIndex:
    idf: dict[str, float]
    unseen_idf: float  # a term no known case has: as rare as a term can be
    cases: tuple[KnownCase, ...]

    def vector(self, text: str) -> dict[str, float]:
        counts = Counter(terms(text))
        return _unit({t: (1.0 + math.log(n)) * self.idf.get(t, self.unseen_idf) for t, n in counts.items()})

    def rank(
        self, text: str, *, skip: Callable[[KnownCase], bool] | None = None, top: int = TOP
    ) -> list[SimilarCase]:
        query = self.vector(text)
        if not query:
            return []
        scored = [(_cosine(query, c.vector), c) for c in self.cases if skip is None or not skip(c)]
        scored = [(s, c) for s, c in scored if s >= FLOOR]
        scored.sort(key=lambda pair: (-pair[0], pair[1].id))
        return [
            SimilarCase(c.id, c.url, c.title, c.failure_class, c.fix, round(s, 3)) for s, c in scored[:top]
        ]

    def rank_texts(
        self, text: str, candidates: Iterable[tuple[K, str]], *, top: int = TOP
    ) -> list[tuple[K, float]]:
        """Rank other texts (a project's failure groups) against `text` with this index's term weights."""
        query = self.vector(text)
        if not query:
            return []
        scored = [(_cosine(query, self.vector(other)), n, key) for n, (key, other) in enumerate(candidates)]
        kept = sorted(((s, n, key) for s, n, key in scored if s >= FLOOR), key=lambda x: (-x[0], x[1]))
        return [(key, round(s, 3)) for s, _, key in kept[:top]]


@lru_cache(maxsize=4)
def load_index(path: str | None = None) -> SimilarIndex:
    """The shipped index (or the one at `path`), read once per process."""
    raw = json.loads(Path(path or INDEX_PATH).read_text(encoding="utf-8"))
    vocab: list[str] = raw["terms"]
    idf = dict(zip(vocab, raw["idf"], strict=True))
    cases = tuple(
        KnownCase(
            id=c["id"],
            url=c["url"],
            title=c["title"],
            failure_class=c["failure_class"],
            fix=c["fix"],
            thread=c["thread"],
            vector={vocab[i]: w for i, w in zip(c["terms"], c["weights"], strict=True)},
        )
        for c in raw["cases"]
    )
    return SimilarIndex(idf, float(raw["unseen_idf"]), cases)


def similar_cases(document: Mapping[str, Any], index: SimilarIndex | None = None) -> list[SimilarCase]:
    """The known cases most like this document's failure; none for a log that shows no failure."""
    text = evidence_of(document)
    if not text:
        return []
    return (index or load_index()).rank(text)


def similar_document(document: Mapping[str, Any]) -> dict[str, Any]:
    """`document.similar`: known cases here; `groups` is the server's to fill (a project's own groups)."""
    return {"cases": [c.to_dict() for c in similar_cases(document)], "groups": []}


# ---------------------------------------------------------------- building and measuring
@dataclass(frozen=True, eq=False)  # never compared: no generated __eq__
class _Labelled:
    id: str
    label: dict[str, Any]
    thread: str
    counts: Counter[str]


_NOT_STATED = re.compile(r"Not stated[^;.]*\.?")


def _fix_of(label: Mapping[str, Any]) -> str | None:
    """The label's fix, else what the thread said of its resolution; a bare "not stated" is no fix."""
    for key in ("fix_summary", "resolution"):
        value = label.get(key)
        if isinstance(value, str) and value.strip() and not _NOT_STATED.fullmatch(value.strip()):
            return value.strip()
    return None


def _labelled(directories: Sequence[Path]) -> list[_Labelled]:
    from dispatchlab.core.matching import diagnose_sources
    from dispatchlab.core.reading import LogReadError, open_sources
    from dispatchlab.core.signatures import load_knowledge_base

    kb = load_knowledge_base()
    out: list[_Labelled] = []
    for folder in directories:
        if folder.resolve().name == LOCKED_FOLDER:
            raise ValueError(f"{folder}: the locked test split never feeds the similar-incident index")
        for log in sorted(folder.glob("*.log")):
            label_path = log.with_suffix(".json")
            if not label_path.exists():
                continue
            label = json.loads(label_path.read_text(encoding="utf-8"))
            try:
                # the diagnosis alone: the document's own `similar` would read the index being built
                document = diagnose_sources(open_sources([log]), kb=kb).to_dict()
            except LogReadError:
                continue
            case_id = f"{folder.name}/{log.stem}"
            out.append(
                _Labelled(case_id, label, thread_of(label, case_id), Counter(terms(evidence_of(document))))
            )
    return out


def _idf(cases: Sequence[_Labelled]) -> dict[str, float]:
    df: Counter[str] = Counter()
    for case in cases:
        df.update(case.counts.keys())
    return {t: math.log((1 + len(cases)) / (1 + n)) + 1.0 for t, n in df.items()}


def _case_vector(counts: Counter[str], idf: Mapping[str, float]) -> dict[str, float]:
    weights = {t: (1.0 + math.log(n)) * idf[t] for t, n in counts.items()}
    strongest = sorted(weights.items(), key=lambda tw: (-tw[1], tw[0]))[:MAX_TERMS]
    return _unit(dict(strongest))


def _index_of(cases: Sequence[_Labelled]) -> SimilarIndex:
    idf = _idf(cases)
    known = tuple(
        KnownCase(
            id=c.id,
            url=str(c.label.get("source") or c.label.get("url") or ""),
            title=str(c.label.get("title") or ""),
            failure_class=str(c.label.get("failure_class") or "other"),
            fix=_fix_of(c.label),
            thread=c.thread,
            vector=_case_vector(c.counts, idf),
        )
        for c in cases
        if c.counts and c.label.get("failure_class") not in (None, "none")
    )
    return SimilarIndex(idf, math.log(1 + len(cases)) + 1.0, known)


def train_index(directories: list[Path], out: Path) -> None:
    """Build the index of known cases from labelled folders (`X.log` + `X.json`) and write it to `out`.

    Deterministic: the same folders (and the same parser and knowledge base) give a byte-identical file.
    Clean logs count for the term weights but are not cases (a clean log has nothing to be similar to)."""
    index = _index_of(_labelled([Path(d) for d in directories]))
    used = sorted({t for c in index.cases for t in c.vector})
    position = {t: i for i, t in enumerate(used)}
    raw = {
        "version": INDEX_VERSION,
        "sources": sorted(Path(d).name for d in directories),
        "terms": used,
        "idf": [round(index.idf[t], 4) for t in used],
        "unseen_idf": round(index.unseen_idf, 4),
        "cases": [
            {
                "id": c.id,
                "url": c.url,
                "title": c.title,
                "failure_class": c.failure_class,
                "fix": c.fix,
                "thread": c.thread,
                "terms": [position[t] for t in sorted(c.vector)],
                "weights": [round(c.vector[t], 4) for t in sorted(c.vector)],
            }
            for c in sorted(index.cases, key=lambda c: c.id)
        ],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(raw, ensure_ascii=False, separators=(",", ":"), sort_keys=True) + "\n", "utf-8")


def similar_hit_rate(directories: list[Path]) -> dict[str, Any]:
    """How often a failed case's own class is among the classes of its top 3, ranked with every case of
    its own thread left out. Clean logs are not counted: by design they get no similar cases."""
    cases = _labelled([Path(d) for d in directories])
    index = _index_of(cases)
    hits = total = 0
    for case in cases:
        expected = case.label.get("failure_class")
        if expected in (None, "none"):
            continue
        total += 1
        query = _unit({t: (1.0 + math.log(n)) * index.idf[t] for t, n in case.counts.items()})
        ranked = sorted(
            ((_cosine(query, c.vector), c.id, c) for c in index.cases if c.thread != case.thread),
            key=lambda x: (-x[0], x[1]),
        )
        top = [c for s, _, c in ranked[:TOP] if s >= FLOOR]
        hits += any(c.failure_class == expected for c in top)
    return {"hits": hits, "total": total, "rate": round(hits / total, 3) if total else 0.0}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dispatchlab.core.similar")
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="rebuild the similar-incident index from labelled folders")
    build.add_argument("dirs", nargs="*", type=Path, default=list(DEFAULT_DIRS))
    build.add_argument("--out", type=Path, default=INDEX_PATH)
    rate = commands.add_parser("hit-rate", help="top-3 class hit rate, each case's own thread left out")
    rate.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.command == "build":
        train_index(args.dirs, args.out)
        print(f"wrote {args.out}")
        return 0
    result = similar_hit_rate(args.dirs)
    print(
        f"similar incidents, top-{TOP} class hit rate: {result['hits']}/{result['total']} ({result['rate']:.1%})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
