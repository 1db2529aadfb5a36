"""`dispatchlab report` against the live stack, and the CI snippets of docs/ci run as a CI would run them."""

from __future__ import annotations

import gzip
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parents[2]
GITHUB_SNIPPET = ROOT / "docs" / "ci" / "github-actions.yml"
GITLAB_SNIPPET = ROOT / "docs" / "ci" / "gitlab-ci.yml"
BIN = Path(sys.executable).parent
DISPATCHLAB = BIN / "dispatchlab"
REPORT_URL = re.compile(r"^(http://\S+)/reports/(\d+)/$")


def unique(log: bytes) -> bytes:
    """The same log with one line more, so checksum de-duplication does not answer from another test."""
    return log + f"[report-cli-test {secrets.token_hex(8)}] done\n".encode()


def clean_env(**extra: str) -> dict[str, str]:
    """This machine's environment without any CI's or dispatchlab's variables, plus `extra`."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("GITHUB_", "GITLAB_", "CI_", "DISPATCHLAB_", "RUNNER_"))
        and key not in ("CI", "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")
    }
    return {**env, "NO_PROXY": "127.0.0.1,localhost", **extra}


def report(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, stdin: bytes = b""):
    return subprocess.run(
        [str(DISPATCHLAB), "report", *args],
        env=env or clean_env(),
        cwd=cwd,
        input=stdin,
        capture_output=True,
        timeout=180,
        check=False,
    )


def report_id(stdout: str) -> int:
    last = stdout.rstrip("\n").splitlines()[-1]
    found = REPORT_URL.match(last)
    assert found, f"the last line is not the report's URL: {stdout}"
    return int(found.group(2))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------- with a token


def test_a_crash_log_is_reported_and_its_diagnosis_printed_with_the_link(stack, crash_log, tmp_path):
    log = tmp_path / "crash.log"
    log.write_bytes(unique(crash_log))
    done = report(str(log), "--url", stack.base_url, "--token", stack.token)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr
    assert "CRASH    line" in out and "failure class  oom" in out and "cuda-out-of-memory" in out
    number = report_id(out)
    assert out.rstrip("\n").splitlines()[-1] == f"{stack.base_url}/reports/{number}/"
    answer = stack.get(number)
    assert answer["status"] == "done" and answer["document"]["sources"][0]["name"] == "crash.log"


def test_token_and_url_come_from_the_environment_and_several_files_make_one_report(
    stack, crash_log, tmp_path
):
    (tmp_path / "rank0.log").write_bytes(unique(crash_log))
    with gzip.open(tmp_path / "rank1.log.gz", "wb") as packed:
        packed.write(unique(crash_log))
    env = clean_env(DISPATCHLAB_URL=stack.base_url + "/", DISPATCHLAB_TOKEN=stack.token)
    done = report("rank0.log", "rank1.log.gz", "--json", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["status"] == "done" and answer["document"]["failure_class"] == "oom"
    assert [source["name"] for source in answer["document"]["sources"]] == ["rank0.log", "rank1.log.gz"]


def test_a_log_on_stdin_is_reported(stack, crash_log):
    done = report("-", "--url", stack.base_url, "--token", stack.token, stdin=unique(crash_log))
    assert done.returncode == 0, done.stderr
    assert "failure class  oom" in done.stdout.decode()
    assert stack.get(report_id(done.stdout.decode()))["document"]["sources"][0]["name"] == "stdin.log"


def test_without_waiting_it_prints_the_link_at_once(stack, crash_log, tmp_path):
    log = tmp_path / "crash.log"
    log.write_bytes(unique(crash_log))
    done = report(str(log), "--url", stack.base_url, "--token", stack.token, "--wait", "0")
    assert done.returncode == 0, done.stderr
    first, _link = done.stdout.decode().splitlines()
    number = report_id(done.stdout.decode())
    assert first == f"report {number}: queued"
    assert stack.wait_finished(number)["status"] == "done"


def test_a_file_that_cannot_be_a_log_exits_1_with_the_servers_reason(stack, tmp_path):
    for name, content, reason in (
        ("core.log", b"\x7fELF\x02\x01\x01\x00" + os.urandom(4096), "core.log: binary data, not a text log"),
        ("empty.log", b"", "empty.log: empty file, nothing to parse"),
    ):
        log = tmp_path / name
        log.write_bytes(content)
        done = report(str(log), "--url", stack.base_url, "--token", stack.token)
        assert done.returncode == 1 and done.stdout == b"", done.stdout
        assert done.stderr.decode() == f"dispatchlab report: the server refused the upload (400): {reason}\n"


def test_a_bad_token_exits_1_with_the_servers_reason(stack, crash_log, tmp_path):
    log = tmp_path / "crash.log"
    log.write_bytes(crash_log)
    done = report(str(log), "--url", stack.base_url, "--token", "dl_not-a-token")
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr.decode() == (
        "dispatchlab report: the server refused the token (401): invalid or revoked token\n"
    )


def test_a_bad_webhook_secret_exits_1_with_the_servers_reason(stack, crash_log, tmp_path):
    log = tmp_path / "crash.log"
    log.write_bytes(crash_log)
    done = report(
        str(log), "--url", stack.base_url, "--webhook-secret", "not-the-secret", "--project", "pipeline"
    )
    assert done.returncode == 1
    assert done.stderr.decode().startswith(
        "dispatchlab report: the server refused the signature (401): bad signature; check"
    )


def test_an_unreachable_server_exits_1(crash_log, tmp_path):
    log = tmp_path / "crash.log"
    log.write_bytes(crash_log)
    url = f"http://127.0.0.1:{free_port()}"
    done = report(str(log), "--url", url, "--token", "dl_x")
    assert done.returncode == 1
    assert done.stderr.decode() == f"dispatchlab report: cannot reach {url}: connection refused\n"


def test_usage_errors_exit_2(crash_log, tmp_path):
    log = tmp_path / "crash.log"
    log.write_bytes(crash_log)
    no_url = report(str(log), "--token", "dl_x")
    assert no_url.returncode == 2
    assert no_url.stderr.decode() == "dispatchlab report: no server: pass --url or set DISPATCHLAB_URL\n"
    no_credentials = report(str(log), "--url", "http://127.0.0.1:9")
    assert no_credentials.returncode == 2 and b"DISPATCHLAB_TOKEN" in no_credentials.stderr
    missing = report(str(tmp_path / "nope.log"), "--url", "http://127.0.0.1:9", "--token", "dl_x")
    assert missing.returncode == 2 and missing.stderr.decode().endswith("nope.log: no such file\n")


@pytest.fixture(scope="module")
def small_server(stack) -> Iterator[str]:
    """A second web process on the same database, with a 64 KiB upload limit."""
    port = free_port()
    log = open(os.devnull, "wb")  # noqa: SIM115 - closed below
    web = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "dispatchlab.config.wsgi", "--bind", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env={**stack.env, "DISPATCHLAB_MAX_UPLOAD_BYTES": str(64 * 1024)},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        web.terminate()
        web.wait(timeout=20)
        log.close()


@pytest.mark.parametrize("size", [200 * 1024, 4 * 1024 * 1024], ids=["read-then-refused", "refused-early"])
def test_an_upload_over_the_servers_limit_exits_1_with_both_sizes(stack, small_server, tmp_path, size):
    big = tmp_path / "big.log"
    big.write_bytes(b"x" * (size - 1) + b"\n")
    done = report(str(big), "--url", small_server, "--token", stack.token)
    assert done.returncode == 1
    assert re.fullmatch(
        r"dispatchlab report: 413: the upload is [\d,]+ bytes; the limit is 65,536 bytes\n",
        done.stderr.decode(),
    ), done.stderr


# ---------------------------------------------------------------- the CI snippets of docs/ci


def read_yaml(text: str) -> Any:
    """The YAML the snippets use (mappings, lists, `|` blocks, plain or quoted scalars); PyYAML is not
    a dependency, and a reader this small cannot hide a snippet's mistake behind leniency."""
    lines = text.splitlines()

    def structural(i: int) -> int:
        while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("#")):
            i += 1
        return i

    def indent_of(i: int) -> int:
        return len(lines[i]) - len(lines[i].lstrip(" "))

    def scalar(raw: str) -> Any:
        raw = raw.strip()
        if raw[:1] in ("'", '"'):
            return raw[1 : raw.index(raw[0], 1)]
        return re.sub(r"\s+#.*$", "", raw)

    def block_scalar(i: int, parent: int) -> tuple[str, int]:
        body: list[str] = []
        while i < len(lines) and (not lines[i].strip() or indent_of(i) > parent):
            body.append(lines[i])
            i += 1
        while body and not body[-1].strip():
            body.pop()
        cut = min(len(line) - len(line.lstrip(" ")) for line in body if line.strip())
        return "\n".join(line[cut:] for line in body) + "\n", i

    def node(i: int, indent: int, first: str | None = None) -> tuple[Any, int]:
        text = first if first is not None else lines[i].strip()
        if text.startswith("- ") or text == "-":
            items: list[Any] = []
            while True:
                item = text[1:].strip()
                if item in ("|", "|-"):
                    value, i = block_scalar(i + 1, indent)
                elif re.match(r"^[\w.-]+:(\s|$)", item):
                    value, i = node(i, indent + 2, first=item)
                else:
                    value, i = scalar(item), i + 1
                items.append(value)
                i = structural(i)
                if i >= len(lines) or indent_of(i) != indent or not lines[i].strip().startswith("-"):
                    return items, i
                text = lines[i].strip()
        mapping: dict[str, Any] = {}
        while True:
            key, _, rest = text.partition(":")
            rest = rest.strip()
            if rest in ("|", "|-"):
                mapping[key], i = block_scalar(i + 1, indent)
            elif rest and not rest.startswith("#"):
                mapping[key], i = scalar(rest), i + 1
            else:
                i = structural(i + 1)
                child = indent_of(i) if i < len(lines) else -1
                if child > indent or (child == indent and lines[i].strip().startswith("- ")):
                    mapping[key], i = node(i, child)
                else:
                    mapping[key] = None
            i = structural(i)
            if i >= len(lines) or indent_of(i) != indent or lines[i].strip().startswith("- "):
                return mapping, i
            text = lines[i].strip()

    start = structural(0)
    value, _ = node(start, indent_of(start))
    return value


def test_the_yaml_reader_reads_what_the_snippets_use():
    text = (
        "# a comment\na: 1\nb:\n  - x\n  - name: y\n    if: failure()\n    run: |\n      one\n      # two\n"
        "\n      three\n  - |\n    four\nc:\n  d: '${{ secrets.X }}'  # why\ne: \"q\"\n"
    )
    assert read_yaml(text) == {
        "a": "1",
        "b": ["x", {"name": "y", "if": "failure()", "run": "one\n# two\n\nthree\n"}, "four\n"],
        "c": {"d": "${{ secrets.X }}"},
        "e": "q",
    }


def ci_shell(
    tmp_path: Path, script: str, env: dict[str, str], crash_log: bytes
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run a snippet's shell lines as the runner does (bash -eo pipefail) in a workspace holding the
    failed server's log; `pip` is a stand-in that records its arguments (the package comes from here)."""
    workspace = tmp_path / "workspace"
    workspace.mkdir(parents=True)
    (workspace / "server.log").write_bytes(unique(crash_log))
    shims = tmp_path / "shims"
    shims.mkdir()
    pip_calls = tmp_path / "pip-calls"
    (shims / "pip").write_text(f'#!/bin/sh\necho "$@" >> "{pip_calls}"\n')
    (shims / "pip").chmod(0o755)
    env = {**env, "PATH": f"{shims}:{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    return done, pip_calls


def test_the_github_actions_snippet_reports_a_failed_job(stack, crash_log, tmp_path):
    workflow = read_yaml(GITHUB_SNIPPET.read_text())
    steps = [step for job in workflow["jobs"].values() for step in job["steps"]]
    on_failure = [step for step in steps if step.get("if") == "failure()"]
    assert any(str(step.get("uses", "")).startswith("actions/setup-python@") for step in on_failure)
    (step,) = [step for step in on_failure if "run" in step]
    secrets_of_the_repository = {
        "DISPATCHLAB_URL": stack.base_url,
        "DISPATCHLAB_WEBHOOK_SECRET": stack.webhook_secret,
    }
    variables_of_the_repository = {"DISPATCHLAB_PROJECT": "pipeline"}
    settings = {"secrets": secrets_of_the_repository, "vars": variables_of_the_repository}
    step_env = {
        name: re.sub(
            r"\$\{\{\s*(secrets|vars)\.(\w+)\s*\}\}", lambda m: settings[m.group(1)][m.group(2)], value
        )
        for name, value in step["env"].items()
    }
    run_id, sha = str(secrets.randbelow(10**10)), secrets.token_hex(20)
    runner = {
        "CI": "true",
        "GITHUB_ACTIONS": "true",
        "GITHUB_WORKFLOW": "serve",
        "GITHUB_JOB": "serve",
        "GITHUB_RUN_ID": run_id,
        "GITHUB_RUN_ATTEMPT": "1",
        "GITHUB_SHA": sha,
        "GITHUB_REF_NAME": "main",
        "GITHUB_SERVER_URL": "https://github.com",
        "GITHUB_REPOSITORY": "acme/serving",
    }
    done, pip_calls = ci_shell(tmp_path, step["run"], clean_env(**runner, **step_env), crash_log)
    assert done.returncode == 0, done.stderr
    assert "install" in pip_calls.read_text() and "dispatchlab" in pip_calls.read_text()
    assert "failure class  oom" in done.stdout, done.stdout + stack.worker_tail()
    assert "cuda-out-of-memory" in done.stdout
    row = stack.row(report_id(done.stdout))
    assert row["ci_job"] == "serve / serve"
    assert row["ci_commit"] == sha
    assert row["ci_url"] == f"https://github.com/acme/serving/actions/runs/{run_id}"
    assert row["title"] == f"serve / serve on main @ {sha[:12]}"
    assert row["delivery_id"].startswith(f"github:acme/serving:{run_id}:1:serve:")


def test_the_gitlab_snippet_reports_a_failed_job_and_stays_quiet_otherwise(stack, crash_log, tmp_path):
    pipeline = read_yaml(GITLAB_SNIPPET.read_text())
    (job,) = [value for key, value in pipeline.items() if isinstance(value, dict) and "after_script" in value]
    script = "\n".join(job["after_script"])
    job_id, sha = str(secrets.randbelow(10**9)), secrets.token_hex(20)
    runner = {
        "CI": "true",
        "GITLAB_CI": "true",
        "CI_JOB_NAME": "serve",
        "CI_JOB_ID": job_id,
        "CI_JOB_URL": f"https://gitlab.example.com/acme/serving/-/jobs/{job_id}",
        "CI_COMMIT_SHA": sha,
        "CI_COMMIT_REF_NAME": "release-1.2",
        "CI_PIPELINE_ID": "777",
        "CI_SERVER_HOST": "gitlab.example.com",
        # masked CI/CD variables of the project
        "DISPATCHLAB_URL": stack.base_url,
        "DISPATCHLAB_WEBHOOK_SECRET": stack.webhook_secret,
        "DISPATCHLAB_PROJECT": "pipeline",
    }
    passed, pip_calls = ci_shell(
        tmp_path / "ok", script, clean_env(**runner, CI_JOB_STATUS="success"), crash_log
    )
    assert passed.returncode == 0 and passed.stdout == "" and not pip_calls.exists()

    done, pip_calls = ci_shell(
        tmp_path / "failed", script, clean_env(**runner, CI_JOB_STATUS="failed"), crash_log
    )
    assert done.returncode == 0, done.stderr
    assert "install" in pip_calls.read_text()
    assert "failure class  oom" in done.stdout, done.stdout + stack.worker_tail()
    assert "cuda-out-of-memory" in done.stdout
    row = stack.row(report_id(done.stdout))
    assert (row["ci_job"], row["ci_commit"]) == ("serve", sha)
    assert row["ci_url"] == f"https://gitlab.example.com/acme/serving/-/jobs/{job_id}"
    assert row["delivery_id"].startswith(f"gitlab:gitlab.example.com:{job_id}:")


def test_a_retried_delivery_returns_the_same_report(stack, crash_log, tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(unique(crash_log))
    env = clean_env(
        GITLAB_CI="true",
        CI_JOB_NAME="retry",
        CI_JOB_ID=str(secrets.randbelow(10**9)),
        DISPATCHLAB_URL=stack.base_url,
        DISPATCHLAB_WEBHOOK_SECRET=stack.webhook_secret,
        DISPATCHLAB_PROJECT="pipeline",
    )
    first = report(str(log), env=env)
    again = report(str(log), env=env)
    assert first.returncode == again.returncode == 0, (first.stderr, again.stderr)
    assert report_id(first.stdout.decode()) == report_id(again.stdout.decode())
    assert b"reported before" in again.stdout


def test_the_readmes_api_quick_start_runs_as_written(stack, crash_log, tmp_path):
    if not shutil.which("curl"):
        pytest.skip("curl is not installed")
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## API quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```\n(.*?)^```$", section, flags=re.S | re.M)
    assert len(blocks) == 2, section
    script = "\n".join(blocks)
    # as a person in the repository root would run it, against this test's server and database
    script = script.replace(".venv/bin/", f"{BIN}/").replace(" manage.py ", f" {ROOT / 'manage.py'} ")
    script = script.replace("http://127.0.0.1:8000", stack.base_url)
    # More projects with a webhook secret than the server checks an unnamed delivery against.
    for number in range(9):
        stack.manage("apitoken", "--user", "readme", "--project", f"readme-other-{number}", "--create")
    (tmp_path / "server.log").write_bytes(unique(crash_log))
    with gzip.open(tmp_path / "rank1.log.gz", "wb") as packed:
        packed.write(unique(crash_log))
    env = {**clean_env(), **{k: v for k, v in stack.env.items() if k.startswith(("DISPATCHLAB_", "DJANGO_"))}}
    done = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"status": "queued"' in done.stdout  # curl's upload
    assert done.stdout.count("failure class  oom") == 2  # the token's report, then the webhook's
    report_id(done.stdout)
