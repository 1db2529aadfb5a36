"""The cast of the web tests: alice and bob share the project "acme" (alice uploads, bob only reads);
charlie belongs to "umbrella" and must see nothing of acme."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from dispatchlab.config.celery import app as celery_app
from dispatchlab.reports.groups import report_columns
from dispatchlab.reports.models import Membership, Project, Report

LOGS = Path(__file__).resolve().parent.parent / "pipeline" / "data"


@pytest.fixture(autouse=True)
def _isolated(settings: Any, tmp_path: Path) -> Iterator[None]:
    settings.MEDIA_ROOT = tmp_path / "media"
    settings.STATIC_ROOT = tmp_path / "static"
    settings.STATIC_ROOT.mkdir()
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    # A task that does get sent runs here, in-process, never on a broker.
    eager = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = eager


@pytest.fixture
def acme(db: None) -> Project:
    return Project.objects.create(name="Acme", slug="acme")


@pytest.fixture
def umbrella(db: None) -> Project:
    return Project.objects.create(name="Umbrella", slug="umbrella")


def _user(name: str, project: Project, role: str) -> User:
    user = User.objects.create_user(username=name, password="password")
    Membership.objects.create(user=user, project=project, role=role)
    return user


@pytest.fixture
def alice(acme: Project) -> User:
    return _user("alice", acme, Membership.Role.MEMBER)


@pytest.fixture
def bob(acme: Project, alice: User) -> User:
    return _user("bob", acme, Membership.Role.VIEWER)


@pytest.fixture
def charlie(umbrella: Project) -> User:
    # Charlie should have no access to Alice's stuff.
    return _user("charlie", umbrella, Membership.Role.MEMBER)


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def alice_client(alice: User) -> Client:
    return _client(alice)


@pytest.fixture
def alice_in_lab(alice_client: Client, acme: Project, alice: User) -> tuple[Client, Project, User]:
    """A member's logged-in client, her project and herself."""
    return alice_client, acme, alice


@pytest.fixture
def bob_client(bob: User) -> Client:
    return _client(bob)


@pytest.fixture
def charlie_client(charlie: User) -> Client:
    return _client(charlie)


def sample_document(**overrides: Any) -> dict[str, Any]:
    """A small match document as the core produces it (CONTRACT.md fields)."""
    document: dict[str, Any] = {
        "server": "sglang",
        "server_version": "0.5.2",
        "model": "Qwen/Qwen3-30B-A3B",
        "gpu": {"name": "NVIDIA H100 80GB HBM3", "arch": "sm_90", "count": 1},
        "server_args": {"mem_fraction_static": 0.92, "attention_backend": "fa3"},
        "backends": {"attention_backend": "fa3", "moe_runner_backend": "triton"},
        "draft_backends": {"attention_backend": "triton"},
        "timeline": [
            {"line": 11, "time": None, "rank": "TP0", "kind": "error", "name": "exception", "detail": "OOM"}
        ],
        "tracebacks": [],
        "kernels": [],
        "crash": {
            "line": 11,
            "phase": "cuda_graph_capture",
            "exception": "torch.OutOfMemoryError",
            "message": "CUDA out of memory.",
        },
        "outcome": "crashed",
        "matches": [
            {
                "id": "cuda-out-of-memory",
                "title": "CUDA out of memory",
                "failure_class": "oom",
                "confidence": 0.9,
                "lines": [17],
                "facts": {},
                "fix": {
                    "summary": "lower --mem-fraction-static",
                    "args": {},
                    "env": {},
                    "tried_and_failed": [],
                },
                "decisions": [],
            }
        ],
        "failure_class": "oom",
        "fingerprint": "f" * 16,
        "kb_digest": "d" * 16,
        "sources": [{"name": "server.log", "first_line": 1, "line_count": 20}],
        "line_count": 20,
    }
    document.update(overrides)
    return document


@pytest.fixture
def make_report(db: None) -> Callable[..., Report]:
    """make_report(project, status="done", document=sample_document(), **fields) -> Report"""
    counter = iter(range(1, 10_000))

    def make(project: Project, *, status: str = Report.Status.DONE, **fields: Any) -> Report:
        document = fields.pop("document", sample_document() if status == Report.Status.DONE else None)
        columns = report_columns(document) if document else {}
        columns.update(fields)
        return Report.objects.create(
            project=project,
            status=status,
            checksum=f"{next(counter):064x}",
            title=columns.pop("title", "server.log"),
            document=document,
            **columns,
        )

    return make


def _upload(name: str = "server.log", content: bytes | None = None) -> SimpleUploadedFile:
    if content is None:
        content = (LOGS / "sglang_oom.log").read_bytes()
    return SimpleUploadedFile(name, content, content_type="text/plain")


@pytest.fixture
def make_upload() -> Callable[..., SimpleUploadedFile]:
    """make_upload(name="server.log", content=<the OOM crash log>) -> an uploaded file"""
    return _upload


@pytest.fixture
def make_document() -> Callable[..., dict[str, Any]]:
    """make_document(**overrides) -> a match document"""
    return sample_document


@pytest.fixture
def oom_log() -> bytes:
    return (LOGS / "sglang_oom.log").read_bytes()
