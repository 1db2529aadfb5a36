"""A one-line `dispatchlab match` starts fast (issue #19): it loads only what such a log needs, reads the
knowledge base and the learned fallback from caches that never go stale, and reads a plain command line
without argparse, to the same namespace argparse would make."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dispatchlab.core import fallback, signatures
from dispatchlab.core.cli import build_parser, plain_document_args

from .helpers import ROOT

ONE_LINE = "[2026-01-01 00:00:00] Load weight begin. avail mem=70.00 GB\n"

# what a one-line match must not import: each cost start-up time once (or would, for the web and GPU stacks)
NOT_FOR_ONE_LINE = (
    "dispatchlab.core.garbage",
    "dispatchlab.core.pickle_walk",
    "dispatchlab.core.crashdump",
    "dispatchlab.core.terminal",
    "dispatchlab.core.similar",
    "dispatchlab.core.summary",
    "dispatchlab.core.evaluate",
    "dispatchlab.core.reporter",
    "dispatchlab.core.parse.parallelscan",
    "dataclasses",
    "inspect",
    "ast",
    "pickle",
    "threading",
    "queue",
    "zipfile",
    "gzip",
    "bz2",
    "lzma",
    "tempfile",
    "shutil",
    "hashlib",
    "tomllib",
    "packaging",
    "argparse",
    "django",
    "celery",
    "plotly",
    "pygments",
    "torch",
)

_MATCH_AND_LIST_MODULES = """
import contextlib, io, json, sys
from dispatchlab.core.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(["match", "--json", sys.argv[1]])
print(json.dumps({"code": code, "document": json.loads(out.getvalue()), "modules": sorted(sys.modules)}))
"""


def _match_in_a_fresh_process(log: Path, cache: Path) -> dict[str, object]:
    env = {**os.environ, "DISPATCHLAB_CACHE_DIR": str(cache)}
    result = subprocess.run(
        [sys.executable, "-c", _MATCH_AND_LIST_MODULES, str(log)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    answer: dict[str, object] = json.loads(result.stdout)
    return answer


def test_a_one_line_match_loads_no_module_it_does_not_need(tmp_path: Path):
    log = tmp_path / "one-line.log"
    log.write_text(ONE_LINE)
    cold = _match_in_a_fresh_process(log, tmp_path / "cache")  # builds the caches a later call reads
    warm = _match_in_a_fresh_process(log, tmp_path / "cache")
    assert warm["code"] == 0 and warm["document"] == cold["document"]
    loaded = {str(name) for name in warm["modules"]}  # type: ignore[attr-defined]
    found = sorted(m for m in loaded if any(m == n or m.startswith(f"{n}.") for n in NOT_FOR_ONE_LINE))
    assert not found, f"a one-line match imported {found}"


# ---------------------------------------------------------------- the command line without argparse
@pytest.mark.parametrize(
    "argv",
    [
        ["match", "--json", "a.log"],
        ["match", "a.log"],
        ["parse", "--json", "a.log", "b.log.gz"],
        ["match", "--progress", "--json", "-"],
        ["match", "a.log", "b.zip", "--json"],
        ["match", "--json", "a.log", "--progress"],
        ["parse", "--json", "--json", "x y.log", ""],
    ],
)
def test_a_plain_command_line_reads_as_argparse_reads_it(argv: list[str]):
    plain = plain_document_args(argv)
    assert plain is not None
    assert vars(plain) == vars(build_parser().parse_args(argv))


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["match"],
        ["match", "--json"],
        ["report", "a.log"],
        ["eval", "cases"],
        ["match", "--js", "a.log"],  # argparse takes the abbreviation
        ["match", "-h"],
        ["match", "--decisions", "d.json", "a.log"],
        ["match", "a.log", "--json", "b.log"],  # argparse refuses the second path
        ["match", "--", "a.log"],
        ["match", "-1.log"],
        ["parse", "--json=1", "a.log"],
    ],
)
def test_any_other_command_line_is_left_to_argparse(argv: list[str]):
    assert plain_document_args(argv) is None


# ---------------------------------------------------------------- caches that never go stale
def _copy_of_the_knowledge_base(tmp_path: Path) -> Path:
    copy = tmp_path / "kb"
    shutil.copytree(signatures.DATA_DIR, copy)
    return copy


def test_the_cached_knowledge_base_equals_one_read_from_the_files(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DISPATCHLAB_CACHE_DIR", str(tmp_path / "cache"))
    directory = _copy_of_the_knowledge_base(tmp_path)
    first = signatures.load_knowledge_base(directory)
    signatures._load_cached.cache_clear()
    cached = signatures.load_knowledge_base(directory)
    assert list((tmp_path / "cache").glob("kb-*"))
    fresh = signatures._load(str(directory))
    assert cached.signatures == fresh.signatures == first.signatures
    assert (cached.patterns, cached.digest) == (fresh.patterns, fresh.digest)


def _same_length_edit(text: str) -> str:
    """The text with its first lowercase ASCII letter replaced: another text of the same bytes' length."""
    at = next(i for i, c in enumerate(text) if "a" <= c <= "z")
    return text[:at] + ("x" if text[at] != "x" else "y") + text[at + 1 :]


def test_editing_a_signature_is_seen_by_the_next_command_even_at_the_same_size_and_mtime(
    tmp_path: Path, monkeypatch
):
    monkeypatch.setenv("DISPATCHLAB_CACHE_DIR", str(tmp_path / "cache"))
    directory = _copy_of_the_knowledge_base(tmp_path)
    before = signatures.load_knowledge_base(directory)
    edited = next(s for s in before.signatures if f'title = "{s.title}"' in Path(s.path).read_text("utf-8"))
    path = Path(edited.path)
    text, stat = path.read_text(encoding="utf-8"), path.stat()
    title = _same_length_edit(edited.title)
    path.write_text(text.replace(f'title = "{edited.title}"', f'title = "{title}"', 1), encoding="utf-8")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # as a copy that keeps mtimes would leave it
    assert path.stat().st_size == stat.st_size
    signatures._load_cached.cache_clear()  # a new command: only the on-disk cache remains
    after = signatures.load_knowledge_base(directory)
    assert next(s.title for s in after.signatures if s.id == edited.id) == title
    assert after.digest != before.digest


def test_a_new_signature_file_is_seen_by_the_next_command(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DISPATCHLAB_CACHE_DIR", str(tmp_path / "cache"))
    directory = _copy_of_the_knowledge_base(tmp_path)
    before = signatures.load_knowledge_base(directory)
    source = Path(before.signatures[0].path)
    text = source.read_text(encoding="utf-8").replace(f'"{source.stem}"', '"a-new-signature"', 1)
    (source.parent / "a-new-signature.toml").write_text(text, encoding="utf-8")
    signatures._load_cached.cache_clear()
    after = signatures.load_knowledge_base(directory)
    assert len(after.signatures) == len(before.signatures) + 1
    assert "a-new-signature" in {s.id for s in after.signatures}


def test_the_cached_model_predicts_what_the_json_model_predicts(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DISPATCHLAB_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "model.json"
    shutil.copy(fallback.MODEL_PATH, path)
    from_json = fallback.Model.from_json(json.loads(path.read_text(encoding="utf-8")))
    fallback.load_model.cache_clear()
    fallback.load_model(path)  # writes the cache
    fallback.load_model.cache_clear()
    cached = fallback.load_model(path)
    fallback.load_model.cache_clear()
    assert list((tmp_path / "cache").glob("model-*"))
    assert cached == from_json
    tokens = [*list(from_json.weights)[::50], "outcome=crashed", "a-token-no-model-has"]
    assert cached is not None and cached.predict(tokens) == from_json.predict(tokens)


def test_a_retrained_model_is_read_by_the_next_command_even_at_the_same_size_and_mtime(
    tmp_path: Path, monkeypatch
):
    monkeypatch.setenv("DISPATCHLAB_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "model.json"
    shutil.copy(fallback.MODEL_PATH, path)
    fallback.load_model.cache_clear()
    before = fallback.load_model(path)
    assert before is not None
    data = json.loads(path.read_text(encoding="utf-8"))
    data["threshold"] = 0.3 if data["threshold"] == 0.5 else 0.5  # one digit: the file keeps its size
    stat = path.stat()
    path.write_text(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n", encoding="utf-8")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size
    fallback.load_model.cache_clear()
    after = fallback.load_model(path)
    fallback.load_model.cache_clear()
    assert after is not None and after.threshold == data["threshold"] != before.threshold
