"""The OpenAPI 3 description of the API, written by hand as a plain dict (served at /api/schema/)."""

from __future__ import annotations

from typing import Any

from dispatchlab.core.signatures import FAILURE_CLASSES as TAXONOMY
from dispatchlab.decisions.openapi import DECISION_PATHS, DECISION_SCHEMAS

STATUS = {"type": "string", "enum": ["queued", "parsing", "done", "failed"]}
FAILURE_CLASSES = list(TAXONOMY)

CONFIRM_STATUS = {
    "type": "string",
    "enum": [
        "waiting_for_host",
        "queued",
        "running",
        "parsing",
        "fixed",
        "still_fails",
        "garbage",
        "refused",
    ],
}
HOST = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "alive": {"type": "boolean"},
        "busy": {"type": "boolean"},
        "last_seen": {"type": "string", "format": "date-time"},
        "arches": {"type": "array", "items": {"type": "string"}},
        "queues": {"type": "array", "items": {"type": "string"}},
        "gpus": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "arch": {"type": ["string", "null"]},
                    "memory_mib": {"type": "integer"},
                },
            },
        },
        "links": {"type": "array", "items": {"type": "object"}},
        "versions": {"type": "object"},
        "launchers": {"type": "array", "items": {"type": "string"}},
        "model_roots": {"type": "array", "items": {"type": "string"}},
    },
}
LAUNCH = {
    "type": "object",
    "properties": {
        "launcher": {"type": "string"},
        "args": {"type": "array", "items": {"type": "string"}},
        "env": {"type": "object"},
    },
}
CONFIRM_CREATED = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "status": CONFIRM_STATUS,
        "arch": {"type": ["string", "null"]},
        "queue": {"type": "string"},
        "url": {"type": "string"},
        "launch": LAUNCH,
    },
}
CONFIRM = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "status": CONFIRM_STATUS,
        "error": {"type": ["string", "null"]},
        "report": {"type": "integer"},
        "arch": {"type": ["string", "null"]},
        "queue": {"type": "string"},
        "signature": {"type": ["string", "null"]},
        "launch": LAUNCH,
        "argv": {"type": "array", "items": {"type": "string"}},
        "host": {"type": ["string", "null"]},
        "new_report": {"type": ["integer", "null"]},
        "ready": {"type": ["boolean", "null"]},
        "smoke": {"type": ["object", "null"]},
        "throughput": {"type": "array", "items": {"type": "object"}},
        "probes": {"type": "array", "items": {"type": "object"}},
    },
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


ERRORS = {
    "400": _json(_ref("Error"), "The request is malformed (the message says how)."),
    "401": _json(_ref("Error"), "Missing or invalid credentials."),
    "403": _json(_ref("Error"), "Read-only token, viewer role, or failed CSRF check."),
    "413": _json(_ref("Error"), "The upload is larger than DISPATCHLAB_MAX_UPLOAD_BYTES."),
}

MATCH = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "title": {"type": "string"},
        "failure_class": {"type": "string", "enum": FAILURE_CLASSES},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "lines": {"type": "array", "items": {"type": "integer"}},
        "facts": {"type": "object"},
        "fix": {
            "type": "object",
            "properties": {
                "summary": {"type": "string"},
                "args": {"type": "object"},
                "env": {"type": "object"},
                "tried_and_failed": {"type": "array", "items": {"type": "string"}},
            },
        },
        "decisions": {"type": "array", "items": _ref("DecisionRef")},
    },
}

DOCUMENT = {
    "type": "object",
    "description": "The `match` document of CONTRACT.md; more fields may appear.",
    "properties": {
        "server": {"type": "string", "enum": ["sglang", "vllm", "unknown"]},
        "server_version": {"type": ["string", "null"]},
        "model": {"type": ["string", "null"]},
        "gpu": {
            "type": "object",
            "properties": {
                "name": {"type": ["string", "null"]},
                "arch": {"type": ["string", "null"]},
                "count": {"type": ["integer", "null"]},
            },
        },
        "server_args": {"type": "object"},
        "backends": {"type": "object", "additionalProperties": {"type": "string"}},
        "draft_backends": {"type": "object", "additionalProperties": {"type": "string"}},
        "timeline": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "line": {"type": "integer"},
                    "time": {"type": ["string", "null"]},
                    "rank": {"type": ["string", "null"]},
                    "kind": {"type": "string", "enum": ["phase", "backend", "warning", "error", "metric"]},
                    "name": {"type": "string"},
                    "detail": {"type": "string"},
                },
            },
        },
        "tracebacks": {"type": "array", "items": {"type": "object"}},
        "kernels": {"type": "array", "items": {"type": "string"}},
        "crash": {"type": ["object", "null"]},
        "outcome": {"type": "string", "enum": ["crashed", "ready", "serving", "incomplete"]},
        "matches": {"type": "array", "items": MATCH},
        "failure_class": {"type": "string", "enum": FAILURE_CLASSES},
        "fingerprint": {"type": "string"},
        "decisions": {"type": "array", "items": _ref("DecisionRef"), "description": "records linked to it"},
    },
}

CREATED = {
    "type": "object",
    "required": ["id", "url", "status"],
    "properties": {
        "id": {"type": "integer"},
        "url": {"type": "string", "format": "uri", "description": "the report's page"},
        "status": STATUS,
        "duplicate": {"type": "boolean", "description": "the same upload or delivery was already stored"},
    },
}

REPORT = {
    "type": "object",
    "required": ["id", "status", "error", "document"],
    "properties": {
        "id": {"type": "integer"},
        "url": {"type": "string", "format": "uri"},
        "project": {"type": "string"},
        "title": {"type": "string"},
        "status": STATUS,
        "progress": {"type": "number", "minimum": 0, "maximum": 100},
        "error": {"type": ["string", "null"], "description": "why parsing failed, for people"},
        "created_at": {"type": "string", "format": "date-time"},
        "started_at": {"type": ["string", "null"], "format": "date-time", "description": "the latest claim"},
        "finished_at": {"type": ["string", "null"], "format": "date-time"},
        "parse_seconds": {"type": ["number", "null"], "description": "time the core took, in the worker"},
        "failure_class": {"type": ["string", "null"]},
        "document": {"oneOf": [_ref("Document"), {"type": "null"}]},
    },
}

UPLOAD = {
    "type": "object",
    "required": ["file"],
    "properties": {
        "file": {
            "type": "array",
            "items": {"type": "string", "format": "binary"},
            "description": "one log (.log, .txt, .gz, .zip); several files in this field make one report",
        },
        "title": {"type": "string"},
        "launch_command": {"type": "string"},
        "project": {
            "type": "string",
            "description": "project slug; needed only by a caller who can upload to several projects",
        },
    },
}

HOOK_JSON = {
    "type": "object",
    "required": ["log"],
    "properties": {
        "log": {"type": "string", "description": "the log text"},
        "job": {"type": "string"},
        "url": {"type": "string"},
        "commit": {"type": "string"},
        "title": {"type": "string"},
        "launch_command": {"type": "string"},
    },
}


def openapi_schema(*, server_url: str = "/") -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "dispatchlab API",
            "version": "1",
            "description": (
                "Upload SGLang/vLLM server logs and read the diagnosis. Parsing runs in a worker: "
                "POST answers at once, GET tells the status."
            ),
        },
        "servers": [{"url": server_url}],
        "security": [{"bearer": []}, {"session": []}],
        "paths": {
            "/api/v1/reports": {
                "post": {
                    "operationId": "reports_create",
                    "summary": "Upload a log; parsing happens in a worker",
                    "requestBody": {
                        "required": True,
                        "content": {"multipart/form-data": {"schema": UPLOAD}},
                    },
                    "responses": {
                        "201": _json(CREATED, "Stored (or found, when duplicate is true)."),
                        **ERRORS,
                    },
                },
                "get": {
                    "operationId": "reports_list",
                    "summary": "The newest reports the caller may see",
                    "parameters": [
                        {"name": "project", "in": "query", "schema": {"type": "string"}},
                        {"name": "status", "in": "query", "schema": STATUS},
                        {"name": "failure_class", "in": "query", "schema": {"type": "string"}},
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "maximum": 100}},
                    ],
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {"reports": {"type": "array", "items": _ref("ReportSummary")}},
                            },
                            "Reports, newest first.",
                        ),
                        "401": ERRORS["401"],
                    },
                },
            },
            "/api/v1/reports/{id}": {
                "get": {
                    "operationId": "reports_read",
                    "summary": "A report's status and, once done, its document",
                    "parameters": [
                        {"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}
                    ],
                    "responses": {
                        "200": _json(_ref("Report"), "The report."),
                        "401": ERRORS["401"],
                        "404": _json(_ref("Error"), "No such report, or not in the caller's projects."),
                    },
                }
            },
            "/api/v1/hooks/ci": {
                "post": {
                    "operationId": "hooks_ci",
                    "summary": "A CI job reports a failed run",
                    "description": (
                        "Signed with X-Dispatchlab-Signature: sha256=<hex HMAC-SHA256 under the project's "
                        "webhook secret> over the raw body, or over '<timestamp>.<raw body>' when "
                        "X-Dispatchlab-Timestamp (unix seconds) is sent; then deliveries older than 5 "
                        "minutes are refused. X-Dispatchlab-Delivery makes a repeat return the first "
                        "delivery's report. The project is the one whose secret signed the body; "
                        "?project=<slug> or X-Dispatchlab-Project narrows the search. A JSON body is "
                        "limited to DISPATCHLAB_MAX_JSON_BYTES (413 above it); send larger logs as "
                        "multipart."
                    ),
                    "security": [],
                    "parameters": [
                        {
                            "name": "wait",
                            "in": "query",
                            "description": "wait up to this many seconds (at most 60) for the parse",
                            "schema": {"type": "integer", "minimum": 0, "maximum": 60},
                        },
                        {"name": "project", "in": "query", "schema": {"type": "string"}},
                        {
                            "name": "X-Dispatchlab-Signature",
                            "in": "header",
                            "required": True,
                            "schema": {"type": "string", "pattern": "^sha256=[0-9a-f]{64}$"},
                        },
                        {"name": "X-Dispatchlab-Timestamp", "in": "header", "schema": {"type": "integer"}},
                        {"name": "X-Dispatchlab-Delivery", "in": "header", "schema": {"type": "string"}},
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": HOOK_JSON},
                            "multipart/form-data": {
                                "schema": {
                                    "type": "object",
                                    "required": ["file"],
                                    "properties": {
                                        "file": {
                                            "type": "array",
                                            "items": {"type": "string", "format": "binary"},
                                        },
                                        "job": {"type": "string"},
                                        "url": {"type": "string"},
                                        "commit": {"type": "string"},
                                    },
                                }
                            },
                        },
                    },
                    "responses": {
                        "201": _json(
                            {"oneOf": [CREATED, _ref("Report")]},
                            "Stored; with ?wait, the report as GET answers it once parsed (or when the wait ends).",
                        ),
                        **ERRORS,
                    },
                }
            },
            "/api/v1/hosts": {
                "get": {
                    "operationId": "hosts_list",
                    "summary": "GPU hosts from their heartbeats: alive or not, GPUs, versions, queues",
                    "responses": {
                        "200": _json(
                            {"type": "object", "properties": {"results": {"type": "array", "items": HOST}}},
                            "The hosts.",
                        ),
                        "401": ERRORS["401"],
                    },
                }
            },
            "/api/v1/reports/{id}/confirm": {
                "post": {
                    "operationId": "reports_confirm",
                    "summary": "Queue a confirm run of the report's launch with its diagnosis's fix applied",
                    "description": (
                        "The job waits in gpu.<arch of the report> until a GPU worker of that arch takes it. "
                        "`command` replaces the launch (a command line; no shell syntax); `args` / `env` replace "
                        "the fix's patch (a flag set to false is removed); `probes` names kernel probes or "
                        "component:<name> to run afterwards."
                    ),
                    "parameters": [
                        {"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}
                    ],
                    "requestBody": {
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {
                                        "command": {"type": "string"},
                                        "args": {"type": "object"},
                                        "env": {"type": "object"},
                                        "probes": {"type": "array", "items": {"type": "string"}},
                                    },
                                }
                            }
                        }
                    },
                    "responses": {
                        "201": _json(
                            CONFIRM_CREATED,
                            "Queued (status waiting_for_host while no live host of its arch exists).",
                        ),
                        "400": ERRORS["400"],
                        "401": ERRORS["401"],
                        "403": ERRORS["403"],
                        "404": _json(_ref("Error"), "No such report, or not in the caller's projects."),
                    },
                }
            },
            "/api/v1/confirms/{id}": {
                "get": {
                    "operationId": "confirms_read",
                    "summary": "A confirm run: status, the launch as an argument list, the new report, smoke, throughput, probes",
                    "parameters": [
                        {"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}
                    ],
                    "responses": {
                        "200": _json(CONFIRM, "The confirm run."),
                        "401": ERRORS["401"],
                        "404": _json(_ref("Error"), "No such confirm run, or not in the caller's projects."),
                    },
                }
            },
            **DECISION_PATHS,
        },
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a token from `manage.py apitoken`",
                },
                "session": {"type": "apiKey", "in": "cookie", "name": "sessionid"},
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {"error": {"type": "string"}},
                },
                "Report": REPORT,
                "ReportSummary": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer"},
                        "url": {"type": "string"},
                        "project": {"type": "string"},
                        "title": {"type": "string"},
                        "status": STATUS,
                        "failure_class": {"type": ["string", "null"]},
                        "top_match_title": {"type": ["string", "null"]},
                        "server": {"type": ["string", "null"]},
                        "arch": {"type": ["string", "null"]},
                        "created_at": {"type": "string", "format": "date-time"},
                    },
                },
                "Document": DOCUMENT,
                "Match": MATCH,
                **DECISION_SCHEMAS,
            },
        },
    }
