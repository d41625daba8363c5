"""The route table: one row per method and path, each naming a handler, and the lookup the router makes."""
from __future__ import annotations

import pytest

from memprof_otel.http.app import Endpoint
from memprof_otel.http.openapi import openapi_document
from memprof_otel.http.routes import ROUTES, routes_at


def test_one_row_per_method_and_path_each_naming_a_handler():
    keys = [(r.method, r.path) for r in ROUTES]
    assert len(keys) == len(set(keys))
    for r in ROUTES:
        assert callable(getattr(Endpoint, r.handler, None)), r.handler
        assert r.method in ("GET", "PUT", "POST")


def test_a_fixed_path_never_falls_under_a_parametrized_one():
    prefixes = [r.prefix for r in ROUTES if r.prefix is not None]
    assert prefixes == ["/v1/dumps/"]
    for r in ROUTES:
        if r.prefix is None:
            assert not any(r.path.startswith(p) for p in prefixes), r.path


@pytest.mark.parametrize("path,methods,arg", [
    ("/metrics", ["GET"], ""), ("/v1/watchdog/rules", ["GET", "PUT"], ""), ("/v1/dumps", ["GET", "POST"], ""),
    ("/v1/dumps/job-0123456789abcdef", ["GET"], "job-0123456789abcdef"), ("/v1/dumps/../x", ["GET"], "../x"),
    ("/v1/nope", [], ""), ("/V1/status", [], ""),
])
def test_routes_at(path, methods, arg):
    rows, rest = routes_at(path)
    assert sorted(r.method for r in rows) == methods
    assert rest == arg


def test_the_answers_the_router_gives_before_a_handler_are_documented_on_every_route():
    paths = openapi_document()["paths"]
    for r in ROUTES:
        responses = paths[r.path][r.method.lower()]["responses"]
        assert "403" in responses
        assert ("401" in responses) is (not r.public)
        assert ("415" in responses) is r.mutating
