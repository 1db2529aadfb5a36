"""`python -m worker`: the GPU worker's command line.

    python -m worker                          the inventory, for people
    python -m worker inventory [--json] [--out FILE]
                                              GPUs, links, driver, package versions, queues, and
                                              whether FlashInfer's downloaded kernels are here
    python -m worker probe [NAME...] [--json] [--component C] [--model-shapes JSON] [--jit-timeout S]
                           [--perturb] [--out FILE]
    python -m worker probe allreduce [--json] the NCCL all-reduce over every GPU (only when named, or
                                              with --component comm)
    python -m worker probe --list             the probes there are
    python -m worker sweep REPORT_OR_LOG --component moe|attention|gemm|sampling [--out F] [--json]
                                              every installed backend of the component at the log's model
                                              shapes, checked, timed and ranked (worker.sweep)
    python -m worker serve                    take confirm and probe jobs from the broker (DISPATCHLAB_BROKER_URL)

Both commands exit 0 also on a host without a GPU (the output says why nothing ran); 2 on usage errors.
With --json, stdout holds exactly one JSON object: whatever a library prints while probing goes to stderr.
--out FILE also writes that JSON object to FILE (with or without --json on stdout). probe --perturb is a
control run: every checked output is pushed past the tolerance, so every checked probe must fail.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from worker import allreduce
from worker.inventory import summary_lines, take_inventory
from worker.probes import (
    DEFAULT_JIT_TIMEOUT_S,
    Component,
    ProbeResult,
    model_shapes_from_env,
    probe_catalog,
    probe_names,
    run_probes,
    table_lines,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m worker", description="dispatchlab's GPU worker")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    inventory = commands.add_parser("inventory", help="what this host has: GPUs, links, versions")
    inventory.add_argument("--json", action="store_true", help="one JSON object")
    inventory.add_argument("--out", metavar="FILE", help="also write the JSON object to FILE")
    probe = commands.add_parser("probe", help="run kernel probes on this host's GPU")
    probe.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"probes to run (default: every single-GPU probe; {allreduce.NAME} only when named)",
    )
    probe.add_argument("--json", action="store_true", help="one JSON object: {host, probes}")
    probe.add_argument(
        "--component",
        choices=[*(c.value for c in Component), allreduce.COMPONENT],
        help=f"only this component's probes ({allreduce.COMPONENT}: the all-reduce)",
    )
    probe.add_argument(
        "--model-shapes",
        metavar="JSON",
        help="the model's shapes as a JSON object or @FILE (hidden_size, moe_intermediate_size, num_experts, "
        "top_k, tokens, num_attention_heads, num_key_value_heads, head_dim); default: "
        "$DISPATCHLAB_PROBE_MODEL_SHAPES, else DeepSeek-V3-like",
    )
    probe.add_argument(
        "--jit-timeout",
        type=float,
        default=float(os.environ.get("DISPATCHLAB_PROBE_JIT_TIMEOUT") or DEFAULT_JIT_TIMEOUT_S),
        metavar="S",
        help=f"longest a slow FlashInfer JIT build may take before the probe gives up (default {DEFAULT_JIT_TIMEOUT_S:g})",
    )
    probe.add_argument("--list", action="store_true", help="list the probes and exit")
    probe.add_argument(
        "--perturb",
        action="store_true",
        help="control run: push every checked output past the tolerance (each checked probe must then fail)",
    )
    probe.add_argument("--out", metavar="FILE", help="also write the JSON object to FILE")
    sweep = commands.add_parser(
        "sweep", help="run every installed backend of a component at the log's shapes"
    )
    sweep.add_argument("source", metavar="REPORT_OR_LOG", help="a crash log, or a report's JSON document")
    sweep.add_argument("--component", required=True, choices=["moe", "attention", "gemm", "sampling"])
    sweep.add_argument("--out", metavar="F", help="also write the JSON to this file")
    sweep.add_argument("--json", action="store_true", help="stdout holds exactly one JSON object")
    sweep.add_argument(
        "--tokens", type=int, metavar="N", help="tokens per call (default 4096 on a GPU, 64 on CPU)"
    )
    sweep.add_argument("--only", nargs="+", metavar="NAME", help="only these candidates")
    sweep.add_argument(
        "--jit-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="longest a FlashInfer JIT build may take before its candidate says `building` (default 120)",
    )
    serve = commands.add_parser("serve", help="take confirm and probe jobs from the broker")
    serve.add_argument("--loglevel", default="INFO", help="Celery's log level")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "probe":
        return _probe(parser, args)
    if args.command == "sweep":
        return _sweep(parser, args)
    if args.command == "serve":
        return _serve(loglevel=args.loglevel)
    return _inventory(json_output=bool(getattr(args, "json", False)), out=getattr(args, "out", None))


def _inventory(*, json_output: bool, out: str | None = None) -> int:
    inventory = take_inventory()
    text = json.dumps(inventory.to_dict(), indent=2)
    _write_out(out, text)
    print(text if json_output else "\n".join(summary_lines(inventory)))
    return 0


def _write_out(path: str | None, text: str) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n", encoding="utf-8")


def _probe(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    # Before anything could start NCCL or torch's symmetric memory: multicast stays off on shared GPUs.
    allreduce.disable_multicast(os.environ)
    if args.list:
        entries = [
            *probe_catalog(),
            {
                "name": allreduce.NAME,
                "component": allreduce.COMPONENT,
                "backend": allreduce.BACKEND,
                "description": allreduce.DESCRIPTION,
            },
        ]
        for entry in entries:
            print(
                f"{entry['name']:<28} {entry['component']:<10} {entry['backend']:<30} {entry['description']}"
            )
        return 0
    names: list[str] = list(dict.fromkeys(args.names))
    known = probe_names()
    unknown = [n for n in names if n not in known and n != allreduce.NAME]
    if unknown:
        parser.error(f"unknown probe {', '.join(unknown)}: one of {', '.join([*known, allreduce.NAME])}")
    try:
        shapes = _model_shapes(args.model_shapes)
    except (OSError, ValueError) as error:
        parser.error(f"--model-shapes: {error}")
    comm = args.component == allreduce.COMPONENT
    single = [n for n in names if n != allreduce.NAME]
    # No names: every single-GPU probe (of the component); the all-reduce only when named or its component.
    run_single = not comm and (bool(single) or not names)
    run_allreduce = (allreduce.NAME in names and args.component in (None, allreduce.COMPONENT)) or (
        comm and not names
    )
    inventory = take_inventory()
    results: list[ProbeResult] = []
    try:
        with _stdout_to_stderr() if args.json else contextlib.nullcontext():
            if run_single:
                results += run_probes(
                    single or None,
                    model_shapes=shapes,
                    component=args.component,
                    jit_timeout_s=args.jit_timeout,
                    artifacts=inventory.flashinfer_artifacts,
                    perturb=args.perturb,
                )
            if run_allreduce:
                results.append(allreduce.run_allreduce(model_shapes=shapes, inventory=inventory))
    except ValueError as error:  # an unknown probe or shape, found before anything ran
        parser.error(str(error))
    document: dict[str, Any] = {"host": inventory.to_dict(), "probes": [r.to_dict() for r in results]}
    if args.perturb:
        document["perturbed"] = True
    text = json.dumps(document, indent=2)
    _write_out(args.out, text)
    if args.json:
        print(text)
        return 0
    gpus = ", ".join(f"{g.name} ({g.arch})" for g in inventory.gpus) or f"no GPU ({inventory.reason})"
    print(f"host {inventory.hostname}: {gpus}")
    print("\n".join(table_lines(results)))
    if inventory.flashinfer_artifacts is not None:
        print()
        print(inventory.flashinfer_artifacts.summary())
    if args.perturb:
        print("control run (--perturb): every checked probe above must say INCORRECT_NUMERICAL")
    for result in results:
        if result.name == allreduce.NAME and (lines := allreduce.size_table_lines(result)):
            print()
            print("\n".join(lines))
    return 0


def _sweep(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from worker.sweep import run_sweep, shapes_from_source
    from worker.sweep import table_lines as sweep_table

    allreduce.disable_multicast(os.environ)
    try:
        read = shapes_from_source(Path(args.source))
    except (OSError, ValueError) as error:
        parser.error(f"{args.source}: {error}")
    if args.tokens is not None and args.tokens <= 0:
        parser.error("--tokens: a positive integer is needed")
    with _stdout_to_stderr() if args.json else contextlib.nullcontext():
        report = run_sweep(
            args.component,
            read,
            tokens=args.tokens,
            jit_timeout_s=args.jit_timeout,
            only=args.only,
            source=str(args.source),
        )
    data = report.to_dict()
    text = json.dumps(data, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    if args.json:
        print(text)
    else:
        print("\n".join(sweep_table(report)))
        print(text)
    return 0


def _serve(*, loglevel: str) -> int:
    from worker.app import serve
    from worker.config import ConfigError

    inventory = take_inventory().to_dict()
    try:
        return serve(inventory=inventory, loglevel=loglevel)
    except ConfigError as error:
        print(f"python -m worker serve: {error}", file=sys.stderr)
        return 2


def _model_shapes(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return model_shapes_from_env()
    text = Path(raw[1:]).read_text(encoding="utf-8") if raw.startswith("@") else raw
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("a JSON object is needed")
    return data


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Keep stdout for the JSON: point file descriptor 1 (C libraries, JIT compilers) and sys.stdout at
    stderr while the probes run."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


if __name__ == "__main__":
    sys.exit(main())
