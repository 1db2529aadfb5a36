"""Fuzz the running API from its own OpenAPI document (/api/schema/) with schemathesis, as four callers.

    python bench/api_fuzz.py                          # starts gunicorn + a worker on PostgreSQL + Redis
    python bench/api_fuzz.py --stack embedded         # on SQLite + the kombu filesystem broker
    python bench/api_fuzz.py --examples 50 --json bench/out/api_fuzz.json
    python bench/api_fuzz.py --url http://host:8000 --token T --read-only-token T2 --other-token T3

Every operation of the document gets `--examples` generated requests (schema-valid ones, then half as
many invalid ones) from each caller: a member's token, a read-only token of the same project, a member
of another project, and no token. Requests that name an object name either one that exists (a parsed
report, its failure group, a confirm run, a decision record, a signature) or a random id.
Each answer must be no server error, carry a documented status, content type, headers and a body that
validates against the operation's generated schema; an invalid request must be refused (4xx). And per
caller: without a token only 401 (or the 400 of a refused parameter); a read-only token never changes
anything; another project's caller never gets one of the member's objects nor a trace of its project.

The upload, the CI webhook and the confirm run are fuzzed too, within reason: the member's uploads are
invalid ones only (a valid one would be parsed by the worker: real work for nothing), the webhook
without the project's secret (refused before any work), the confirm queues to a GPU queue no host reads.

Prints, per operation, the cases run and the statuses seen per caller, then every failure with a curl
line to reproduce it; exits 1 when there is one. tests/pipeline/test_api_fuzz.py runs `fuzz()` against
the pipeline tests' live stack.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import sys
import time
import urllib.request
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "tests" / "pipeline" / "data" / "sglang_oom.log"
UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}
# Operations whose valid requests from a caller who may upload start real work (a parse): fuzzed with
# invalid requests only.
INVALID_ONLY_FOR_WRITERS = frozenset({"reports_create"})
# Objects every project shares: the knowledge base.
SHARED = {"/api/v1/signatures/{id}"}


@dataclass(frozen=True)
class Caller:
    name: str
    headers: dict[str, str]
    may_write: bool = False  # a member (of the seeded project, or of another one)
    outsider: bool = False  # another project's member: must never see the seeded objects


@dataclass
class Tally:
    cases: int = 0
    statuses: Counter[int] = field(default_factory=Counter)


@dataclass
class Problem:
    operation: str
    caller: str
    what: str
    curl: str


@dataclass
class FuzzRun:
    tallies: dict[tuple[str, str], Tally] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def cases(self) -> int:
        return sum(t.cases for t in self.tallies.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "seconds": round(self.seconds, 1),
            "operations": [
                {
                    "operation": op,
                    "caller": caller,
                    "cases": t.cases,
                    "statuses": dict(sorted(t.statuses.items())),
                }
                for (op, caller), t in self.tallies.items()
            ],
            "problems": [vars(p) for p in self.problems],
        }


# ---------------------------------------------------------------- seeding, over HTTP as a client would


def _call(base_url: str, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> Any:
    request = urllib.request.Request(base_url + path, data=body, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def seed_objects(base_url: str, member: dict[str, str], *, confirm: bool = True) -> dict[str, Any]:
    """Objects of the member's project for the fuzzer to aim at: {path template: id}. A confirm run
    waits in a GPU queue: `confirm=False` leaves it to the caller, which knows which queue is safe."""
    boundary = "fuzzseed"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="seed.log"\r\n'
            "Content-Type: text/plain\r\n\r\n"
        ).encode()
        + LOG.read_bytes()
        + f"\r\n--{boundary}--\r\n".encode()
    )
    headers = {**member, "Content-Type": f"multipart/form-data; boundary={boundary}"}
    report = _call(base_url, "POST", "/api/v1/reports", headers, body)["id"]
    deadline = time.monotonic() + 90
    while _call(base_url, "GET", f"/api/v1/reports/{report}", member)["status"] not in ("done", "failed"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the seeded report {report} was not parsed within 90 s")
        time.sleep(0.2)
    (summary,) = [
        r for r in _call(base_url, "GET", "/api/v1/reports?limit=100", member)["results"] if r["id"] == report
    ]
    json_headers = {**member, "Content-Type": "application/json"}
    decision = _call(
        base_url,
        "POST",
        "/api/v1/decisions",
        json_headers,
        json.dumps({"title": "seeded", "links": {"reports": [report]}}).encode(),
    )["id"]
    seeds = {
        "/api/v1/reports/{id}": report,
        "/api/v1/reports/{id}/confirm": report,
        "/api/v1/decisions/{id}": decision,
        "/api/v1/decisions/{id}/history": decision,
        "/api/v1/groups/{id}": summary["group"],
        "/api/v1/signatures/{id}": "cuda-out-of-memory",
    }
    if confirm:
        seeds["/api/v1/confirms/{id}"] = seed_confirm(base_url, member, report)
    return seeds


def seed_confirm(base_url: str, member: dict[str, str], report: int) -> int:
    headers = {**member, "Content-Type": "application/json"}
    return int(_call(base_url, "POST", f"/api/v1/reports/{report}/confirm", headers, b"{}")["id"])


# ---------------------------------------------------------------- the fuzzer


def _projects_named(node: Any) -> set[str]:
    """Every value of a "project" key in a JSON answer."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "project" and isinstance(value, str):
                found.add(value)
            found |= _projects_named(value)
    elif isinstance(node, list):
        for item in node:
            found |= _projects_named(item)
    return found


def _routable(operation: Any, case: Any) -> bool:
    """Whether the case's path parameters can reach the view: a value the route's converter refuses
    (`<int:...>`: digits only) is Django's 404 for a URL that does not exist, before any view runs."""
    for parameter in operation.definition.raw.get("parameters", []):
        if parameter.get("in") != "path":
            continue
        value, schema = case.path_parameters.get(parameter["name"]), parameter.get("schema", {})
        if schema.get("type") == "integer":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                return False
        elif schema.get("pattern") and not re.search(schema["pattern"], str(value)):
            return False
    return True


def _schema_for_fuzzing(base_url: str) -> tuple[Any, set[str]]:
    """The served document, less its security declarations (and the ids of the operations that need
    none): each caller brings its own credentials, so schemathesis must neither generate an
    Authorization header or session cookie nor count a mutated one as the invalid part of a request."""
    import requests
    import schemathesis

    document = requests.get(base_url + "/api/schema/", timeout=60).json()
    public = set()
    for item in document["paths"].values():
        for op in item.values():
            if op.pop("security", None) == []:
                public.add(op["operationId"])
    document.pop("security", None)
    document["components"].pop("securitySchemes", None)
    document["servers"] = [{"url": base_url}]
    return schemathesis.openapi.from_dict(document), public


def _caller_problem(
    caller: Caller, operation: Any, case: Any, status: int, body: Any, **context: Any
) -> str | None:
    """What this caller must never get, whatever it sends."""
    public = context["public"]
    allowed = (400, 401) if _routable(operation, case) else (400, 401, 404)
    if not caller.headers and not public and status not in allowed:
        return f"no credentials answered {status}, not 401"
    if caller.name == "read-only" and operation.method.upper() in UNSAFE and not public and status < 300:
        return f"a read-only token changed something ({status})"
    if caller.outsider:
        seeded = context["seeded"] if operation.path not in SHARED else None
        if seeded is not None and case.path_parameters.get("id") == seeded and status not in (400, 404):
            return f"another project's caller got the seeded object ({status}, not 404)"
        if context["victim"] in _projects_named(body):
            return f"another project's caller saw the project {context['victim']!r}"
    return None


@dataclass
class _Target:
    """One operation, as one caller sends it."""

    base_url: str
    operation: Any
    op_id: str
    caller: Caller
    seeded: Any
    victim: str
    public: bool
    checks: list[Any]
    session: Any
    tally: Tally
    problems: list[Problem]

    def send(self, case: Any) -> None:
        response = case.call(
            base_url=self.base_url, session=self.session, headers=self.caller.headers, timeout=120
        )
        self.tally.cases += 1
        self.tally.statuses[response.status_code] += 1
        if response.status_code == 414:
            # gunicorn's own refusal of a request line over 4094 bytes, before the app: not the API's
            return
        problem: str | None = None
        checks = self.checks
        if case.media_type == "multipart/form-data":
            # On the wire every form field is text: a field "made" a boolean or a number arrives as the
            # string "true" or "12", a valid title; schemathesis cannot tell, so it is no invalid request.
            checks = [check for check in checks if check.__name__ != "negative_data_rejection"]
        try:
            case.validate_response(response, checks=checks, headers=self.caller.headers)
        except (AssertionError, BaseExceptionGroup) as failure:
            problem = "\n".join(str(failure).strip().splitlines()[:12]) or type(failure).__name__
        if problem is None:
            try:
                body = json.loads(response.content) if response.content else None
            except ValueError:
                body = None
            problem = _caller_problem(
                self.caller,
                self.operation,
                case,
                response.status_code,
                body,
                seeded=self.seeded,
                victim=self.victim,
                public=self.public,
            )
        if problem is not None and len(self.problems) < 200:
            curl = case.as_curl_command(headers=self.caller.headers)
            self.problems.append(Problem(self.op_id, self.caller.name, problem, curl))

    def explore(self, strategy: Any, count: int, seed_value: int) -> None:
        from hypothesis import HealthCheck, Phase, given, seed, settings
        from hypothesis.errors import Unsatisfiable

        sent = 0

        @seed(seed_value)
        @settings(
            max_examples=count,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy)
        def one(case: Any) -> None:
            nonlocal sent
            if sent < count:  # hypothesis may try a few more than max_examples
                sent += 1
                self.send(case)

        with contextlib.suppress(Unsatisfiable):  # nothing to make invalid (GET /api/schema/ takes nothing)
            one()


def fuzz(
    base_url: str,
    callers: list[Caller],
    *,
    seeds: dict[str, Any] | None = None,
    victim: str = "",
    examples: int = 20,
    seed_value: int = 0,
    invalid_only: frozenset[str] = INVALID_ONLY_FOR_WRITERS,
) -> FuzzRun:
    """Run the fuzzer; return the tallies and every problem found (it stops at none). Writers send the
    operations of `invalid_only` only invalid requests."""
    import requests
    import schemathesis
    from hypothesis import strategies as st
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        negative_data_rejection,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
        negative_data_rejection,
    ]
    positive, negative = schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE
    schema, public = _schema_for_fuzzing(base_url)
    run = FuzzRun()
    started = time.monotonic()
    session = requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()
        op_id = operation.definition.raw["operationId"]
        seeded = (seeds or {}).get(operation.path)
        for caller in callers:
            tally = run.tallies.setdefault((op_id, caller.name), Tally())
            target = _Target(
                base_url,
                operation,
                op_id,
                caller,
                seeded,
                victim,
                op_id in public,
                checks,
                session,
                tally,
                run.problems,
            )
            modes = [(positive, examples), (negative, max(1, examples // 2))]
            if caller.may_write and op_id in invalid_only:
                modes = [(negative, examples)]
            for mode, count in modes:
                strategy = operation.as_strategy(generation_mode=mode)
                if seeded is not None:  # half of the cases aim at an object that exists
                    strategy = st.one_of(
                        strategy, operation.as_strategy(generation_mode=mode, path_parameters={"id": seeded})
                    )
                # Each operation, caller and mode draws from its own seed: a run is repeatable.
                target.explore(
                    strategy, count, zlib.crc32(f"{seed_value} {op_id} {caller.name} {mode.value}".encode())
                )
    run.seconds = time.monotonic() - started
    return run


def print_run(run: FuzzRun, callers: list[Caller]) -> None:
    names = [c.name for c in callers]
    operations = list(dict.fromkeys(op for op, _ in run.tallies))
    width = max(len(op) for op in operations) + 2
    print(f"{'operation':<{width}}" + "".join(f"{name:<26}" for name in names))
    for op in operations:
        cells = []
        for name in names:
            tally = run.tallies.get((op, name), Tally())
            statuses = " ".join(f"{code}×{n}" for code, n in sorted(tally.statuses.items()))
            cells.append(f"{tally.cases:>3}: {statuses}"[:25].ljust(26))
        print(f"{op:<{width}}" + "".join(cells))
    total = Counter[int]()
    for tally in run.tallies.values():
        total.update(tally.statuses)
    print(
        f"\n{run.cases} cases over {len(operations)} operations × {len(names)} callers in {run.seconds:.0f} s; "
        "statuses: " + ", ".join(f"{code}: {n}" for code, n in sorted(total.items()))
    )
    for problem in run.problems:
        print(f"\nPROBLEM {problem.operation} as {problem.caller}: {problem.what}\n  {problem.curl}")
    print(f"\n{len(run.problems)} problems" if run.problems else "\nno problems")


# ---------------------------------------------------------------- main


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", choices=["embedded", "services"], default="services")
    parser.add_argument("--url", help="fuzz this running server instead of starting one")
    parser.add_argument("--token", help="with --url: a member's token")
    parser.add_argument("--read-only-token", default="", help="with --url: a read-only token, same project")
    parser.add_argument("--other-token", default="", help="with --url: a member token of another project")
    parser.add_argument("--project", default="", help="with --url: the member token's project slug")
    parser.add_argument("--examples", type=int, default=20, help="valid requests per operation and caller")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))

    stack = None
    if args.url:
        if not args.token:
            parser.error("--url needs --token")
        base_url, tokens, victim = (
            args.url.rstrip("/"),
            (args.token, args.read_only_token, args.other_token),
            args.project,
        )
    else:
        import tempfile

        from pipeline_latency import Stack

        folder = Path(tempfile.mkdtemp(prefix="dispatchlab-fuzz-"))
        # Confirm runs wait in GPU queues of their own, removed at the end (no GPU host reads them).
        gpu_queue = os.environ["DISPATCHLAB_GPU_QUEUE"] = f"gpu-fuzz-{secrets.token_hex(4)}"
        stack = Stack(args.stack, folder, concurrency=1)
        read_only = stack._manage(
            "apitoken", "--user", "bench", "--project", "bench", "--read-only"
        ).splitlines()[-1]
        other = stack._manage(
            "apitoken", "--user", "outsider", "--project", "elsewhere", "--create"
        ).splitlines()[-1]
        base_url, tokens, victim = stack.base_url, (stack.token, read_only, other), "bench"
    try:
        member, read_only, other = tokens
        callers = [Caller("member", _bearer(member), may_write=True)]
        if read_only:
            callers.append(Caller("read-only", _bearer(read_only)))
        if other:
            callers.append(Caller("other project", _bearer(other), may_write=True, outsider=True))
        callers.append(Caller("no token", {}))
        seeds = seed_objects(base_url, _bearer(member))
        run = fuzz(
            base_url, callers, seeds=seeds, victim=victim, examples=args.examples, seed_value=args.seed
        )
    finally:
        if stack is not None:
            stack.close()
            if args.stack == "services":
                import redis

                client = redis.Redis.from_url(stack.env["DISPATCHLAB_BROKER_URL"])
                for key in client.scan_iter(match=f"*{gpu_queue}*"):
                    client.delete(key)
    print_run(run, callers)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(run.as_json(), indent=1))
    return 1 if run.problems else 0


if __name__ == "__main__":
    sys.exit(main())
