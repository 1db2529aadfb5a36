"""docker-compose.yml and the Dockerfile, checked without Docker: the Compose specification's own JSON
schema (vendored, see README.md here), then what a deployment relies on."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
SCHEMA = json.loads((Path(__file__).parent / "compose-spec.json").read_text())
# What the README and the deployment notes name: the stack itself, and the GPU worker of the gpu profile.
STACK = {"db", "redis", "migrate", "web", "worker", "beat", "gpu-worker"}
ONE_SHOT = {"migrate"}


def _errors(document: Any) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMA)
    return [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(document)
    ]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _commands(service: dict[str, Any]) -> list[str]:
    """The service's command, entrypoint and health check, each as one shell-like string."""
    found = []
    for key in ("command", "entrypoint"):
        value = service.get(key)
        if value:
            found.append(value if isinstance(value, str) else shlex.join(map(str, value)))
    test = service.get("healthcheck", {}).get("test")
    if test:
        found.append(test if isinstance(test, str) else shlex.join(map(str, test)))
    return found


def test_the_compose_file_follows_the_compose_specification(compose):
    assert _errors(compose) == []


def test_the_schema_check_rejects_what_compose_would_refuse(compose):
    broken = json.loads(json.dumps(compose))
    broken["services"]["web"]["healthcheck"]["test"] = 5
    broken["services"]["worker"]["restart_policy"] = "always"  # not a service key
    broken["services"]["db"]["ports"] = {"5432": "5432"}
    errors = _errors(broken)
    assert any(error.startswith("services/web/healthcheck/test") for error in errors), errors
    assert any("restart_policy" in error for error in errors), errors
    assert any(error.startswith("services/db/ports") for error in errors), errors


def test_every_service_the_docs_name_exists(compose):
    named = set(STACK)
    for text in (ROOT / "README.md").read_text(), COMPOSE.read_text():
        for line in re.findall(r"docker compose [^\n`]*", text):
            words = line.split()
            if "up" in words:
                named |= {word for word in words[words.index("up") + 1 :] if not word.startswith("-")}
    assert named <= set(compose["services"]), named - set(compose["services"])


def test_nothing_is_installed_when_a_container_starts(compose):
    for name, service in compose["services"].items():
        for command in _commands(service):
            assert not re.search(r"\b(pip|pip3|uv|poetry|apt-get|apk)\b[^|;&]*\binstall\b", command), (
                name,
                command,
            )
    dockerfile = (ROOT / "Dockerfile").read_text()
    starts = re.findall(r"^(?:CMD|ENTRYPOINT)\b.*(?:\\\n.*)*", dockerfile, flags=re.MULTILINE)
    assert starts and not any("install" in start for start in starts), starts


def test_app_services_run_the_image_built_from_the_dockerfile(compose):
    for name in ("migrate", "web", "worker", "beat", "gpu-worker"):
        service = compose["services"][name]
        assert "build" in service, f"{name} does not build the image"
        assert not any(mount.startswith(".:") for mount in service.get("volumes", [])), (
            f"{name} mounts the checkout instead of running the image"
        )
    assert compose["services"]["gpu-worker"]["build"]["target"] == "gpu"
    assert re.search(r"^FROM .* AS gpu$", (ROOT / "Dockerfile").read_text(), flags=re.MULTILINE)


def test_every_long_running_service_has_a_health_check(compose):
    for name, service in compose["services"].items():
        if name in ONE_SHOT:
            assert service.get("restart") == "no", f"{name} runs once"
            continue
        test = service.get("healthcheck", {}).get("test")
        assert test and not service["healthcheck"].get("disable"), f"{name} has no health check"


def test_the_app_waits_for_healthy_services_and_the_migrations(compose):
    for name in ("web", "worker", "beat"):
        depends = compose["services"][name]["depends_on"]
        assert depends["db"]["condition"] == "service_healthy"
        assert depends["redis"]["condition"] == "service_healthy"
        assert depends["migrate"]["condition"] == "service_completed_successfully"


def test_the_gpu_worker_only_starts_with_its_profile(compose):
    assert compose["services"]["gpu-worker"].get("profiles") == ["gpu"]
    assert all(
        "profiles" not in service for name, service in compose["services"].items() if name != "gpu-worker"
    )


def test_the_web_server_is_not_held_by_slow_clients(compose):
    # uvicorn (tests/pipeline/test_slow_clients.py); gunicorn's sync workers were held by four clients.
    web = " ".join(_commands(compose["services"]["web"]))
    assert web.startswith("uvicorn dispatchlab.config.asgi:application"), web
    assert "gunicorn" not in web
