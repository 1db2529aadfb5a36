"""The learned fallback: a failure class, with a calibrated confidence, for a log no rule explains.

A multinomial naive Bayes over normalised tokens of what the parser found (failure-evidence and error
lines, the terminal exception, crash phase, server, arch family, outcome, and the log's last lines). Its
inference is a dictionary walk in pure Python; the model is JSON shipped as package data
(`data/fallback_model.json`), loaded on first use only. Naive Bayes because leave-one-source-out retraining
is then a subtraction of counts: every case can be scored by a model that never saw its thread.

Training (`dispatchlab kb train`) is deterministic: same labelled data, byte-identical model file.
"""

from __future__ import annotations

import bisect
import itertools
import json
import marshal
import math
import re
import sys
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from dispatchlab.core.cache import cache_path, read_cached, write_cached
from dispatchlab.core.lazyre import lazy_compile
from dispatchlab.core.parse.model import ParsedLog
from dispatchlab.core.records import field, record

MODEL_PATH = Path(__file__).resolve().parent / "data" / "fallback_model.json"
ALPHA = 0.1  # additive smoothing of token counts
MIN_DOCS = 2  # a token seen in one labelled log only is that log's, not a class's
TAIL_LINES = 12
SERVING = ("serving", "ready")

_NORMALISE = [
    (lazy_compile(r"0x[0-9a-fA-F]+|\b[0-9a-f]{12,}\b"), " HEX "),
    (lazy_compile(r"\[[\d, ]+\]|\(\d+(?:, ?\d+)+\)|torch\.Size\([^)]*\)"), " SHAPE "),
    (lazy_compile(r"\b(?:TP|DP|EP|PP|rank|Rank|pid|GPU|cuda:)\s*=?\s*\d+\b"), " RANK "),
    (lazy_compile(r"\d+(?:\.\d+)*"), " NUM "),
]
_WORD = lazy_compile(r"[A-Za-z_][A-Za-z0-9_]+")
_STOP = frozenset(
    [
        "the",
        "a",
        "an",
        "of",
        "to",
        "in",
        "is",
        "at",
        "on",
        "for",
        "and",
        "or",
        "by",
        "with",
        "from",
        "this",
        "that",
        "be",
        "it",
        "as",
        "are",
        "was",
    ]
)


_NEGATIONS = frozenset(["not"])


def _words(text: str) -> list[str]:
    for pattern, replacement in _NORMALISE:
        text = pattern.sub(replacement, text)
    # a path's last component says what (libcuda.so, config.json); its folders say where it was installed
    text = re.sub(r"(?:[\w.+-]*/)+([\w.+-]+)", r"\1", text)
    return [w for w in (m.lower() for m in _WORD.findall(text)) if w not in _STOP and len(w) > 1]


def _text_tokens(prefix: str, texts: Iterable[str], into: set[str]) -> None:
    for text in texts:
        words = _words(text[:600])
        # "not" alone says nothing; before a word it turns it round ("not found", "not supported")
        into.update(f"{prefix}{w}" for w in words if w not in _NEGATIONS)
        into.update(f"{prefix}{a}_{b}" for a, b in itertools.pairwise(words))


def arch_family(arch: str | None) -> str:
    if not arch:
        return "unknown"
    if arch.startswith("gfx"):
        return "amd"
    digits = re.sub(r"\D", "", arch)
    if not digits:
        return "other"
    major = int(digits[:-1] or "0")
    return {
        7: "volta",
        8: "ampere",
        9: "hopper",
        10: "blackwell",
        11: "blackwell",
        12: "blackwell_consumer",
    }.get(major, "older" if major < 7 else "newer")


def features(parsed: ParsedLog) -> list[str]:
    """The tokens the model reads, sorted: categorical facts as `key=value`, words and word pairs."""
    tokens: set[str] = {
        f"server={parsed.server if parsed.server != 'unknown' else parsed.engine or 'unknown'}",
        f"arch={arch_family(parsed.gpu.arch)}",
        f"outcome={parsed.outcome}",
    }
    crash = parsed.crash
    if crash is not None:
        tokens.add(f"phase={crash.phase or 'unknown'}")
        if crash.exception:
            tokens.add(f"exc={crash.exception.rsplit('.', 1)[-1].lower()}")
        _text_tokens("", [crash.message or ""], tokens)
    for tb in parsed.tracebacks[-3:]:
        tokens.add(f"exc={tb.exception.rsplit('.', 1)[-1].lower()}")
        _text_tokens("", [tb.message, *(c.get("message", "") for c in tb.chain)], tokens)
        tokens.update(f"fn={f.function.lower()}" for f in tb.frames[-4:])
    for error in parsed.errors[:40]:
        tokens.add(f"kind={error.kind}")
        _text_tokens("", [error.text], tokens)
    _text_tokens("", parsed.tail[-TAIL_LINES:], tokens)
    return sorted(tokens)


# words that say something went wrong; a log the rules call `none` is read by the model only when it has one
_FAILURE_STEMS = (
    "error", "fail", "exception", "fault", "abort", "killed", "traceback", "unsupported", "invalid", "denied",
    "refused", "timeout", "timed", "unable", "cannot", "segmentation", "dumped",
    "no_such", "oom", "nan",
)  # fmt: skip


def _may_alarm(tokens: Sequence[str]) -> bool:
    return not any(f"outcome={o}" in tokens for o in SERVING) and shows_failure(tokens)


def shows_failure(tokens: Iterable[str]) -> bool:
    return any(stem in t for t in tokens if "=" not in t for stem in _FAILURE_STEMS)


# ---------------------------------------------------------------- inference
@record(frozen=True)
class Guess:
    failure_class: str
    probability: float


@record(frozen=True)
class Calibrator:
    """A monotone step map from a decision's raw score to the share of such decisions that were right."""

    at: tuple[float, ...]  # the lowest raw score of each step, increasing
    p: tuple[float, ...]  # each step's calibrated probability, non-decreasing

    def __call__(self, raw: float) -> float:
        step = bisect.bisect_right(self.at, raw) - 1
        return self.p[max(step, 0)]


# what decided the class, as calibrated: each kind of decision has its own map from raw score to probability
DECISION_KINDS = ("signature", "exception", "warning", "model", "model_unsure", "rules", "none")


def decision_kind(
    class_source: str, failure_class_source: str, failure_class: str, low_confidence: bool
) -> str:
    if class_source in ("signature", "exception"):
        return class_source
    if class_source == "model":
        return "model_unsure" if low_confidence else "model"
    if failure_class_source == "warning":
        return "warning"
    return "none" if failure_class == "none" else "rules"


@record(frozen=True)
class Model:
    classes: tuple[str, ...]
    prior: tuple[float, ...]  # log prior per class
    weights: Mapping[str, list[float]]  # token -> log P(token | class); other tokens are not read
    temperature: float
    threshold: float  # below it the class is `other`, low confidence
    alarm_threshold: float  # a log the rules call `none` gets a failure class only above it
    calibration: dict[str, Calibrator] = field(default_factory=dict)  # decision kind -> its map

    def calibrated(self, kind: str, raw: float | None) -> float | None:
        """The probability that a decision of this kind with this raw score is right; the raw score when
        the model carries no map for the kind. A decision without a score (the rules' own class) reads as 1."""
        calibrator = self.calibration.get(kind)
        if calibrator is None:
            return raw
        return calibrator(1.0 if raw is None else raw)

    def predict(self, tokens: Sequence[str]) -> list[Guess]:
        """Every class with its calibrated probability, most likely first."""
        scores = list(self.prior)
        for token in tokens:
            row = self.weights.get(token)
            if row is not None:
                scores = [s + w for s, w in zip(scores, row, strict=True)]
        return _softmax(self.classes, scores, self.temperature)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Model:
        return cls(
            classes=tuple(data["classes"]),
            prior=tuple(data["prior"]),
            weights=data["weights"],
            temperature=float(data["temperature"]),
            threshold=float(data["threshold"]),
            alarm_threshold=float(data["alarm_threshold"]),
            calibration={
                kind: Calibrator(tuple(m["at"]), tuple(m["p"]))
                for kind, m in data.get("calibration", {}).items()
            },
        )


def _softmax(classes: Sequence[str], scores: Sequence[float], temperature: float) -> list[Guess]:
    top = max(scores)
    exps = [math.exp((s - top) / temperature) for s in scores]
    total = sum(exps)
    return sorted(
        (Guess(c, e / total) for c, e in zip(classes, exps, strict=True)),
        key=lambda g: (-g.probability, g.failure_class),
    )


class _Rows(Mapping[str, list[float]]):
    """A cached model's weights: one flat array of doubles and each token's row number; a row becomes a list
    only when a log has that token (a few dozen of the thousands)."""

    def __init__(self, rows: dict[str, int], flat: array[float], width: int) -> None:
        self._rows, self._flat, self._width = rows, flat, width

    def __getitem__(self, token: str) -> list[float]:
        start = self._rows[token] * self._width
        return self._flat[start : start + self._width].tolist()

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


# bump when the cached form of the model changes
_CACHE_FORMAT = 1


@lru_cache(maxsize=1)
def load_model(path: Path = MODEL_PATH) -> Model | None:
    """The shipped model, read on first use; None when it is missing (the rules then decide alone).

    Parsing its JSON took longer than the rest of a one-line match, so a copy is kept in the cache dir as
    marshal data with the weights as one array of doubles (the same floats the JSON gives), keyed by the
    file's path, size and times: any write to the file makes the copy stale."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    key = (
        _CACHE_FORMAT,
        sys.implementation.cache_tag,
        str(path),
        stat.st_size,
        stat.st_mtime_ns,
        stat.st_ctime_ns,
    )
    cached = cache_path("model", key, ".marshal")
    stored = read_cached(cached)
    if stored is not None:
        try:
            data, tokens, flat = marshal.loads(stored)
            weights = array("d")
            weights.frombytes(flat)
            return Model.from_json({**data, "weights": _Rows(tokens, weights, len(data["classes"]))})
        except Exception:  # written by another version of this code: rebuild it
            pass
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    model = Model.from_json(data)
    rows = data.pop("weights")
    flat = array("d", [weight for row in rows.values() for weight in row])
    write_cached(cached, marshal.dumps((data, {token: n for n, token in enumerate(rows)}, flat.tobytes())))
    return model


# ---------------------------------------------------------------- training
@record(frozen=True)
class Example:
    name: str
    source: str  # the thread: cases of one thread are held out together
    label: str
    tokens: tuple[str, ...]


class Counts:
    """Token counts per class, from which a model for any subset of the examples is a subtraction away."""

    def __init__(self, classes: Sequence[str], examples: Sequence[Example]) -> None:
        self.classes = tuple(classes)
        self.index = {c: i for i, c in enumerate(self.classes)}
        docs: Counter[str] = Counter(t for e in examples for t in set(e.tokens))
        self.vocabulary = sorted(t for t, n in docs.items() if n >= MIN_DOCS)
        self.vocab = set(self.vocabulary)
        self.token_counts: dict[str, list[int]] = {t: [0] * len(self.classes) for t in self.vocabulary}
        self.class_docs = [0] * len(self.classes)
        self.class_tokens = [0] * len(self.classes)
        for example in examples:
            self._add(example, +1)

    def _add(self, example: Example, sign: int) -> None:
        k = self.index[example.label]
        self.class_docs[k] += sign
        for token in example.tokens:
            if token in self.vocab:
                self.token_counts[token][k] += sign
                self.class_tokens[k] += sign

    def model(
        self,
        without: Sequence[Example] = (),
        temperature: float = 1.0,
        threshold: float = 0.0,
        alarm_threshold: float = 1.0,
    ) -> Model:
        for example in without:
            self._add(example, -1)
        try:
            v = len(self.vocabulary)
            docs = sum(self.class_docs)
            prior = tuple(math.log((n + 1) / (docs + len(self.classes))) for n in self.class_docs)
            denominators = [math.log(n + ALPHA * v) for n in self.class_tokens]
            weights = {
                t: [math.log(c + ALPHA) - d for c, d in zip(row, denominators, strict=True)]
                for t, row in self.token_counts.items()
            }
        finally:
            for example in without:
                self._add(example, +1)
        return Model(self.classes, prior, weights, temperature, threshold, alarm_threshold)


def out_of_fold(counts: Counts, examples: Sequence[Example]) -> list[tuple[Example, list[float]]]:
    """Each example's class scores from a model trained without its thread (leave one source out)."""
    by_source: dict[str, list[Example]] = {}
    for example in examples:
        by_source.setdefault(example.source, []).append(example)
    out: list[tuple[Example, list[float]]] = []
    for source in sorted(by_source):
        held = by_source[source]
        model = counts.model(without=held)
        for example in held:
            scores = list(model.prior)
            for token in example.tokens:
                row = model.weights.get(token)
                if row is not None:
                    scores = [s + w for s, w in zip(scores, row, strict=True)]
            out.append((example, scores))
    return out


def fit_temperature(classes: Sequence[str], scored: Sequence[tuple[Example, list[float]]]) -> float:
    """The temperature that minimises the negative log-likelihood of the out-of-fold predictions."""
    best, best_nll = 1.0, math.inf
    for step in range(1, 400):
        t = step * 0.25
        nll = 0.0
        for example, scores in scored:
            p = next(g.probability for g in _softmax(classes, scores, t) if g.failure_class == example.label)
            nll -= math.log(max(p, 1e-12))
        if nll < best_nll - 1e-9:
            best, best_nll = t, nll
    return best


# ---------------------------------------------------------------- the decision
@record(frozen=True)
class FallbackClass:
    failure_class: str
    confidence: float
    low_confidence: bool
    best_guesses: list[Guess]


def fallback_class(parsed: ParsedLog, rules_class: str, model: Model) -> FallbackClass | None:
    """The model's class for a log no signature or terminal exception explains; None keeps the rules' `none`.

    When the rules saw a failure, `none` is no answer: the best failure class above the threshold, else
    `other` with low confidence and the best guesses. When the rules saw none, only a confident failure class
    (above the alarm threshold) replaces it, so a clean log stays clean."""
    tokens = features(parsed)
    guesses = model.predict(tokens)
    if rules_class == "none":
        top = guesses[0]
        if parsed.outcome in SERVING or not shows_failure(tokens):
            return None  # a server that answers, or a log with no word of failure, stays clean
        if top.failure_class == "none" or top.probability < model.alarm_threshold:
            return None
        return FallbackClass(top.failure_class, round(top.probability, 3), False, _rounded(guesses))
    failing = [g for g in guesses if g.failure_class != "none"]
    total = sum(g.probability for g in failing) or 1.0
    failing = [Guess(g.failure_class, g.probability / total) for g in failing]
    top = failing[0]
    if top.probability >= model.threshold:
        return FallbackClass(top.failure_class, round(top.probability, 3), False, _rounded(failing))
    return FallbackClass("other", round(top.probability, 3), True, _rounded(failing))


def _rounded(guesses: Sequence[Guess]) -> list[Guess]:
    return [Guess(g.failure_class, round(g.probability, 3)) for g in guesses[:3]]


# ---------------------------------------------------------------- `dispatchlab kb train`
DEFAULT_TRAINING_DIRS = tuple(
    Path(__file__).resolve().parents[2] / "tests" / "fixtures" / d for d in ("cases", "longtail")
)


def labelled_examples(directories: Sequence[Path]) -> list[Example]:
    """Every scored `X.log` with its label `X.json` in the folders, as the model reads it (parser only)."""
    from dispatchlab.core.parse import parse_sources
    from dispatchlab.core.reading import open_sources

    examples: list[Example] = []
    for folder in directories:
        for log in sorted(Path(folder).glob("*.log")):
            label_file = log.with_suffix(".json")
            if not label_file.exists():
                continue
            label = json.loads(label_file.read_text(encoding="utf-8"))
            if not label.get("scored", True):
                continue  # the excerpt lacks the decisive line: its label is not the log's
            parsed = parse_sources(open_sources([log]))
            source = str(label.get("source") or label.get("url") or log.stem)
            examples.append(
                Example(
                    f"{Path(folder).name}/{log.stem}", source, label["failure_class"], tuple(features(parsed))
                )
            )
    return examples


def _failing(guesses: Sequence[Guess]) -> list[Guess]:
    failing = [g for g in guesses if g.failure_class != "none"]
    total = sum(g.probability for g in failing) or 1.0
    return [Guess(g.failure_class, g.probability / total) for g in failing]


def choose_thresholds(
    classes: Sequence[str], scored: Sequence[tuple[Example, list[float]]], temperature: float
) -> tuple[float, float]:
    """On out-of-fold predictions: the threshold with the best accuracy on failed logs (the highest of nearly
    equals: when unsure, say so), and the lowest alarm threshold no clean log reaches."""
    predicted = [(e, _softmax(classes, s, temperature)) for e, s in scored]
    failed = [(e, _failing(g)[0]) for e, g in predicted if e.label != "none"]
    # answer a class where it is more often right than wrong; below, `other` with low confidence is more honest.
    # The utility is flat near its top; within 1% of the failed logs of the best, the highest threshold wins
    utilities: list[tuple[float, int]] = []
    for step in range(0, 19):
        t = round(step * 0.05, 2)
        right = sum(1 for e, top in failed if top.probability >= t and top.failure_class == e.label)
        wrong = sum(1 for e, top in failed if top.probability >= t and top.failure_class != e.label)
        unsure = sum(1 for e, top in failed if top.probability < t and e.label == "other")
        utilities.append((t, right + unsure - wrong))
    near = max(u for _, u in utilities) - 0.01 * len(failed)
    best = max(t for t, u in utilities if u >= near)
    clean = [
        g[0].probability
        for e, g in predicted
        if e.label == "none" and g[0].failure_class != "none" and _may_alarm(e.tokens)
    ]
    alarm = max([0.5, *(math.ceil(p * 100) / 100 + 0.01 for p in clean)])
    return best, min(alarm, 1.01)


# ---------------------------------------------------------------- calibration of every decision
SHRINK = 2.0  # pseudo-decisions at the prior in each step and kind: three right of three is not 100%


@record(frozen=True)
class Decision:
    """One labelled case as leave-one-source-out diagnosed it: what decided, its raw score, whether right."""

    thread: str
    kind: str
    raw: float | None
    correct: bool


def _pool(steps: list[list[float]]) -> list[list[float]]:
    """Pool adjacent violators: steps [lowest raw, value, weight] whose values increase (equal ones pooled)."""
    pooled: list[list[float]] = []
    for step in steps:
        pooled.append(list(step))
        while len(pooled) > 1 and pooled[-2][1] >= pooled[-1][1]:
            top = pooled.pop()
            low = pooled[-1]
            weight = low[2] + top[2]
            low[1], low[2] = (low[1] * low[2] + top[1] * top[2]) / weight, weight
    return pooled


def fit_calibrator(points: Sequence[tuple[float, bool]], prior: float) -> Calibrator:
    """Isotonic regression of right-or-wrong on the raw score, each step shrunk towards the kind's accuracy
    (itself shrunk towards the prior, the accuracy of all decisions)."""
    accuracy = (sum(1 for _, right in points if right) + SHRINK * prior) / (len(points) + SHRINK)
    steps: list[list[float]] = []
    for raw, right in sorted(points):
        if steps and steps[-1][0] == raw:
            steps[-1][1] += right
            steps[-1][2] += 1
        else:
            steps.append([raw, float(right), 1.0])
    pooled = _pool([[raw, right / n, n] for raw, right, n in steps])
    shrunk = _pool([[raw, (p * n + SHRINK * accuracy) / (n + SHRINK), n + SHRINK] for raw, p, n in pooled])
    return Calibrator(tuple(round(s[0], 4) for s in shrunk), tuple(round(s[1], 3) for s in shrunk))


def fit_calibration(decisions: Iterable[Decision]) -> dict[str, Calibrator]:
    """A calibrator per kind of decision, from out-of-fold decisions (a decision without a score reads as 1)."""
    points: dict[str, list[tuple[float, bool]]] = {}
    for d in decisions:
        points.setdefault(d.kind, []).append((1.0 if d.raw is None else d.raw, d.correct))
    every = [right for kind in points.values() for _, right in kind]
    prior = sum(every) / (len(every) or 1)
    return {kind: fit_calibrator(points[kind], prior) for kind in sorted(points)}


def calibration_json(calibration: dict[str, Calibrator]) -> dict[str, Any]:
    return {kind: {"at": list(c.at), "p": list(c.p)} for kind, c in sorted(calibration.items())}


def train(examples: Sequence[Example]) -> dict[str, Any]:
    classes = sorted({e.label for e in examples})
    counts = Counts(classes, examples)
    scored = out_of_fold(counts, examples)
    temperature = fit_temperature(classes, scored)
    threshold, alarm = choose_thresholds(classes, scored, temperature)
    model = counts.model()
    return {
        "format": 1,
        "trained_on": len(examples),
        "classes": list(classes),
        "prior": [round(p, 4) for p in model.prior],
        "temperature": temperature,
        "threshold": threshold,
        "alarm_threshold": alarm,
        "calibration": {},  # filled by `kb train` from leave-one-source-out diagnoses (evaluate.py)
        "weights": {t: [round(w, 3) for w in row] for t, row in sorted(model.weights.items())},
    }


def write_model(data: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n", encoding="utf-8")
