"""The status line of every answer the endpoint documents carries the standard reason phrase."""
from __future__ import annotations

from http import HTTPStatus

from memprof_otel.http.openapi import openapi_document
from memprof_otel.http.server import _status_line


def test_every_documented_status_has_its_standard_phrase():
    statuses = {int(code) for path in openapi_document()["paths"].values() for op in path.values()
                for code in op.get("responses", {}) if code.isdigit()}
    assert {200, 202, 400, 404, 409} <= statuses
    for code in statuses:
        assert _status_line(code) == f"{code} {HTTPStatus(code).phrase}"
    assert _status_line(202) == "202 Accepted"
