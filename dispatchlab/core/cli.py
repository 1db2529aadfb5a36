"""`dispatchlab parse|match|eval|kb|report` (docs/contract.md: exit 0 ok, 1 unreadable input, 2 usage)."""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

from dispatchlab.core.reading import LogReadError

if TYPE_CHECKING:
    import argparse


def _progress_to_stderr(enabled: bool):  # type: ignore[no-untyped-def]
    if not enabled:
        return None
    last = [0.0]

    def report(done: int, total: int | None) -> None:
        import time

        now = time.monotonic()
        if now - last[0] < 0.5:
            return
        last[0] = now
        text = f"{done / total:6.1%}" if total else f"{done / 1e6:,.0f} MB"
        print(f"\rparsing… {text}", end="", file=sys.stderr, flush=True)

    return report


def _print_json(document: dict[str, Any]) -> None:
    # json.dumps takes the C encoder; json.dump to a stream would write in 100k small pieces
    sys.stdout.write(json.dumps(document, ensure_ascii=False, separators=(",", ":")) + "\n")


def _document_command(args: argparse.Namespace, *, matched: bool) -> int:
    from dispatchlab.core.api import analyze_paths, parse_paths

    run = analyze_paths if matched else parse_paths
    records = None
    if getattr(args, "decisions", None):  # match --decisions FILE: read before a long parse
        from dispatchlab.core.decisions import attach_decisions, load_decisions, render_decisions

        records = load_decisions(args.decisions)
    document = run(args.paths, progress=_progress_to_stderr(args.progress))
    if args.progress:
        print(file=sys.stderr)
    if records is not None:
        attach_decisions(document, records)
    if args.json:
        _print_json(document)
    else:
        from dispatchlab.core.summary import render_summary

        sys.stdout.write(render_summary(document))
        if records is not None:
            sys.stdout.write(render_decisions(document, total=len(records)))
    return 0


def cmd_parse(args: argparse.Namespace) -> int:
    return _document_command(args, matched=False)


def cmd_match(args: argparse.Namespace) -> int:
    return _document_command(args, matched=True)


def cmd_eval(args: argparse.Namespace) -> int:
    from dispatchlab.core.evaluate import evaluate_directory, evaluate_leave_one_source_out, render_evaluation

    if args.loso:
        result = evaluate_leave_one_source_out([*([args.directory] if args.directory else []), *args.loso])
    elif args.directory:
        result = evaluate_directory(args.directory)
    else:
        sys.stderr.write("eval: give DIR or --loso DIR [DIR...]\n")
        return 2
    if args.json:
        _print_json({**result, "accuracy": f"{result['correct']}/{result['total']}"})
    else:
        sys.stdout.write(render_evaluation(result))
    return 0


def _listed(problems: list[str], summary: str) -> int:
    for problem in problems:
        print(problem)
    print(summary)
    return 1 if problems else 0


def cmd_kb_lint(args: argparse.Namespace) -> int:
    from dispatchlab.core.signatures.lint import lint_knowledge_base

    problems, count = lint_knowledge_base()
    return _listed(problems, f"{count} signatures, {len(problems)} problems")


def cmd_kb_test(args: argparse.Namespace) -> int:
    from dispatchlab.core.signatures.examples import run_examples

    failures, count = run_examples()
    return _listed(failures, f"{count} examples, {len(failures)} failed")


def cmd_kb_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dispatchlab.core.evaluate import out_of_fold_decisions
    from dispatchlab.core.fallback import (
        DEFAULT_TRAINING_DIRS,
        MODEL_PATH,
        calibration_json,
        fit_calibration,
        labelled_examples,
        train,
        write_model,
    )

    directories = [Path(d) for d in args.directories] or list(DEFAULT_TRAINING_DIRS)
    out = Path(args.out) if args.out else MODEL_PATH
    data = train(labelled_examples(directories))
    # every kind of decision's confidence, mapped to how often such decisions were right leave-one-source-out
    data["calibration"] = calibration_json(fit_calibration(out_of_fold_decisions(directories)))
    write_model(data, out)
    print(
        f"{out}: {data['trained_on']} cases, {len(data['weights'])} tokens, temperature {data['temperature']}, "
        f"threshold {data['threshold']}, alarm threshold {data['alarm_threshold']}"
    )
    from dispatchlab.core.similar import INDEX_PATH, train_index

    # the similar-incidents index sits beside the model: a model written elsewhere gets its own index
    index = INDEX_PATH if out == MODEL_PATH else out.with_name(INDEX_PATH.name)
    train_index(directories, index)
    print(f"{index}: the similar-incidents index of the same cases")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from dispatchlab.core.reporter import run_report

    return run_report(args)


def build_parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(
        prog="dispatchlab", description="Triage crashes of LLM inference servers."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    for name, func, help_text in (
        ("parse", cmd_parse, "parse a log into the resolved-backend timeline"),
        ("match", cmd_match, "parse, then match the knowledge base of known failures"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument(
            "paths", nargs="+", metavar="PATH", help="log file (.log/.txt/.gz/.zip), or - for stdin"
        )
        p.add_argument("--json", action="store_true", help="print one JSON object")
        p.add_argument("--progress", action="store_true", help="show progress on stderr")
        if name == "match":
            p.add_argument(
                "--decisions",
                metavar="FILE",
                help="decision records exported by the dashboard (GET /api/v1/decisions?format=export): "
                "show those linked to this failure, stale when the log meets their revisit-when",
            )
        p.set_defaults(func=func)

    p = sub.add_parser("eval", help="compare match output with labels X.json next to X.log")
    p.add_argument("directory", metavar="DIR", nargs="?")
    p.add_argument(
        "--loso", nargs="+", metavar="DIR", help="leave one source out: corpus and fixture folders"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_eval)

    kb = sub.add_parser("kb", help="knowledge-base maintenance")
    kb_sub = kb.add_subparsers(dest="kb_command", required=True)
    kb_sub.add_parser("lint", help="check every signature file").set_defaults(func=cmd_kb_lint)
    kb_sub.add_parser("test", help="run every signature against its own examples").set_defaults(
        func=cmd_kb_test
    )

    p = kb_sub.add_parser("train", help="rebuild the learned fallback from the labelled cases (reproducible)")
    p.add_argument(
        "directories", nargs="*", metavar="DIR", help="labelled folders (default: the repository's)"
    )
    p.add_argument("--out", metavar="PATH", help="where to write the model (default: the shipped one)")
    p.set_defaults(func=cmd_kb_train)

    from dispatchlab.core.report_args import add_report_arguments

    p = sub.add_parser("report", help="upload logs to a dispatchlab server, print the diagnosis and link")
    add_report_arguments(p)
    p.set_defaults(func=cmd_report)
    return parser


# `parse|match [--json] [--progress] PATH...`, the options before or after the paths, is read without argparse:
# importing it and building the parser (a help formatter per argument) took a fifth of a one-line match.
# Anything else (another command, -h, --decisions, an abbreviated option, a path that starts with "-") goes to
# argparse, which also words every error; tests/core/test_cli.py holds both readings to the same namespace.
_PLAIN_FLAGS = {"--json": "json", "--progress": "progress"}


def plain_document_args(argv: Sequence[str]) -> argparse.Namespace | None:
    """The namespace argparse would make of a plain `parse` or `match` command line; None for any other."""
    if not argv or argv[0] not in ("parse", "match"):
        return None
    command, rest = argv[0], argv[1:]
    values: dict[str, Any] = {"command": command, "json": False, "progress": False}
    paths: list[str] = []
    for position, arg in enumerate(rest):
        if arg in _PLAIN_FLAGS:
            values[_PLAIN_FLAGS[arg]] = True
        elif arg.startswith("-") and arg != "-":
            return None
        elif paths and rest[position - 1] in _PLAIN_FLAGS:
            return (
                None  # paths, an option, a path again: argparse refuses the second ("unrecognized arguments")
            )
        else:
            paths.append(arg)
    if not paths:
        return None
    if command == "match":
        values["decisions"] = None
    values.update(paths=paths, func=cmd_match if command == "match" else cmd_parse)
    return cast("argparse.Namespace", SimpleNamespace(**values))


def main(argv: Sequence[str] | None = None) -> int:
    args = plain_document_args(sys.argv[1:] if argv is None else argv)
    if args is None:
        args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except LogReadError as error:
        print(f"dispatchlab: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def command() -> int:
    """The `dispatchlab` program: `main`, then an exit that skips the interpreter's last garbage collection.

    That collection walks every object the command made (the knowledge base, the model, the compiled rules)
    and cost a tenth of a one-line match; the objects are freed all the same as the modules are torn down.
    In-process callers of `main` (tests, other tools) keep their collector as it was."""
    code = main()
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(command())
