"""The OpenAPI description of the decision records' API (merged into dispatchlab.api.schema)."""

from __future__ import annotations

from typing import Any

from dispatchlab.core.decisions import REVISIT_PACKAGES, DecisionStatus

STATUS = {"type": "string", "enum": [s.value for s in DecisionStatus]}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}
LINKS = {
    "type": "object",
    "properties": {
        "groups": {"type": "array", "items": {"type": "string"}, "description": "failure-group fingerprints"},
        "signatures": {"type": "array", "items": {"type": "string"}, "description": "signature ids"},
        "reports": {"type": "array", "items": {"type": "integer"}, "description": "report ids"},
        "upstream": {"type": "array", "items": {"type": "string", "format": "uri"}, "description": "http(s)"},
    },
}
EDITABLE = {
    "title": {"type": "string", "maxLength": 300},
    "status": STATUS,
    "context": {"type": "string", "description": "Markdown"},
    "decision": {"type": "string", "description": "Markdown"},
    "consequences": {"type": "string", "description": "Markdown"},
    "alternatives": {
        "type": "array",
        "items": {
            "type": "object",
            "required": ["what"],
            "properties": {"what": {"type": "string"}, "outcome": {"type": "string"}},
        },
    },
    "links": LINKS,
    "revisit_when": {
        "type": "object",
        "description": (
            "PEP 440 specifiers by package (" + ", ".join(REVISIT_PACKAGES) + "): the first log of the "
            "project that shows a version meeting one makes the record stale; a changed condition clears it"
        ),
        "additionalProperties": {"type": "string"},
        "example": {"flashinfer": ">=0.7", "sglang": ">0.5.23"},
    },
    "superseded_by": {"type": ["integer", "null"], "description": "id of the record that replaces this one"},
}
DECISION = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "number": {"type": "integer", "description": "DR-<number>, a sequence per project"},
        "label": {"type": "string", "example": "DR-7"},
        "project": {"type": "string"},
        **EDITABLE,
        "stale": {"type": "boolean"},
        "stale_reason": {
            "type": ["string", "null"],
            "example": "report 123 shows flashinfer 0.7.1, which matches flashinfer>=0.7",
        },
        "stale_since": {"type": ["string", "null"], "format": "date-time"},
        "stale_report": {"type": ["integer", "null"]},
        "status_since": {"type": "string", "format": "date"},
        "author": {"type": ["string", "null"]},
        "created": {"type": "string", "format": "date-time"},
        "updated": {"type": "string", "format": "date-time"},
        "url": {"type": "string", "format": "uri"},
        "history_url": {"type": "string", "format": "uri"},
    },
}
DECISION_REF = {
    "type": "object",
    "description": "a record as a report's document lists it",
    "properties": {
        "id": {"type": "integer"},
        "number": {"type": "integer"},
        "title": {"type": "string"},
        "status": STATUS,
        "stale": {"type": "boolean"},
        "stale_reason": {"type": ["string", "null"]},
        "status_since": {"type": ["string", "null"], "format": "date"},
    },
}
EDIT = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "kind": {"type": "string", "enum": ["created", "edited", "stale"]},
        "user": {"type": ["string", "null"], "description": "null for a change a log made (stale)"},
        "at": {"type": "string", "format": "date-time"},
        "changes": {
            "type": "object",
            "description": 'each changed field: {"from": old, "to": new}; links per kind, e.g. "links.upstream"',
        },
    },
}
INVALID = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {"type": "string"},
        "fields": {
            "type": "object",
            "additionalProperties": {"type": "array", "items": {"type": "string"}},
            "description": "what is wrong, by field: title, alternatives[1].what, revisit_when.flashinfer ...",
        },
    },
}
ERROR = _ref("Error")
COMMON = {
    "401": _json(ERROR, "Missing or invalid credentials."),
    "404": _json(ERROR, "No such record, or not in the caller's projects."),
}
WRITE = {
    "400": _json(_ref("DecisionInvalid"), "The record is not valid; `fields` says what, by field."),
    "403": _json(ERROR, "Read-only token, viewer role, or failed CSRF check."),
}

DECISION_PATHS: dict[str, Any] = {
    "/api/v1/decisions": {
        "get": {
            "operationId": "decisions_list",
            "summary": "Decision records of the caller's projects, newest first, a page at a time",
            "parameters": [
                {"name": "project", "in": "query", "schema": {"type": "string"}},
                {"name": "status", "in": "query", "schema": STATUS},
                {"name": "stale", "in": "query", "schema": {"type": "boolean"}},
                {
                    "name": "group",
                    "in": "query",
                    "schema": {"type": "string"},
                    "description": "a fingerprint",
                },
                {"name": "signature", "in": "query", "schema": {"type": "string"}},
                {"name": "report", "in": "query", "schema": {"type": "integer"}},
                {"name": "page", "in": "query", "schema": {"type": "integer", "minimum": 1}},
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
                {
                    "name": "format",
                    "in": "query",
                    "schema": {"type": "string", "enum": ["export"]},
                    "description": (
                        'export: {"decisions": [every matching record]}, no pages; the file '
                        "`dispatchlab match LOG --decisions FILE` reads"
                    ),
                },
            ],
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "results": {"type": "array", "items": _ref("Decision")},
                            "count": {"type": "integer"},
                            "next": {"type": ["string", "null"], "format": "uri"},
                            "previous": {"type": ["string", "null"], "format": "uri"},
                            "decisions": {
                                "type": "array",
                                "items": _ref("Decision"),
                                "description": "with ?format=export, instead of results",
                            },
                        },
                    },
                    "A page of records (or, with ?format=export, all of them).",
                ),
                "400": _json(ERROR, "A parameter is malformed (the message says which)."),
                "401": COMMON["401"],
            },
        },
        "post": {
            "operationId": "decisions_create",
            "summary": "Record a decision (members only); `project` is needed by a member of several projects",
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["title"],
                            "properties": {"project": {"type": "string"}, **EDITABLE},
                        }
                    }
                },
            },
            "responses": {"201": _json(_ref("Decision"), "Created."), **WRITE, **COMMON},
        },
    },
    "/api/v1/decisions/{id}": {
        "get": {
            "operationId": "decisions_read",
            "summary": "A decision record",
            "parameters": [ID],
            "responses": {"200": _json(_ref("Decision"), "The record."), **COMMON},
        },
        "patch": {
            "operationId": "decisions_update",
            "summary": "Change some fields (members only); each change is kept in the history",
            "description": (
                "Fields not sent stay as they are; in `links`, kinds not sent stay too. Fields the server "
                "sets (id, number, stale, ...) may be sent back unchanged."
            ),
            "parameters": [ID],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"type": "object", "properties": EDITABLE}}},
            },
            "responses": {"200": _json(_ref("Decision"), "The record after the change."), **WRITE, **COMMON},
        },
    },
    "/api/v1/decisions/{id}/history": {
        "get": {
            "operationId": "decisions_history",
            "summary": "Every change of a record, oldest first: who, when, each field from what to what",
            "parameters": [ID],
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "id": {"type": "integer"},
                            "label": {"type": "string"},
                            "results": {"type": "array", "items": _ref("DecisionEdit")},
                            "count": {"type": "integer"},
                        },
                    },
                    "The history.",
                ),
                **COMMON,
            },
        }
    },
}

DECISION_SCHEMAS: dict[str, Any] = {
    "Decision": DECISION,
    "DecisionRef": DECISION_REF,
    "DecisionEdit": EDIT,
    "DecisionInvalid": INVALID,
}
