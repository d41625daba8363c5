"""Fuzzing driven by the endpoint's own OpenAPI document: every query parameter and every field of
every request body it describes gets hostile values derived from its schema (NaN and infinities in
every spelling, numbers out of its range, huge numbers and strings, wrong types). Each must be
refused with a JSON 400 naming the field, nothing may be stored, and afterwards every read route
must still answer 200 with a body that matches its documented schema."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

import memprof_otel as mp
from tests.integration.support.helpers import JSON_HEADERS

from .support.models import Tree

pytestmark = pytest.mark.timeout(180)

NON_FINITE = ["NaN", "nan", "-nan", "Infinity", "-Infinity", "inf", "-inf", "INF", "1e999", "-1e999", "1e309"]
NOT_DECIMAL = ["", " ", "0x10", "1_0", " 1", "1 ", "\uff11", "1,5", "abc", "--1", "1e", "\x00", "9" * 400]


@pytest.fixture
def doc_and_client(tmp_path: Path) -> Iterator[tuple[dict[str, Any], httpx.Client]]:
    mp.start_monitoring({"sampler": {"interval": "50ms"}, "dumps": {"dir": str(tmp_path / "dumps")}})
    srv = mp.serve(port=0)
    mp.instrument(Tree(), name="tree")  # a model to capture: bad input must be refused, not time out
    with httpx.Client(base_url=srv.url, timeout=30, headers=JSON_HEADERS) as c:
        yield c.get("/openapi.json").json(), c
    srv.close()


def hostile_query_values(schema: dict[str, Any]) -> list[str]:
    """Query values that the parameter's schema does not allow."""
    kind = schema.get("type")
    if kind in ("number", "integer"):
        out = NON_FINITE + NOT_DECIMAL
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if lo is not None:
            out += [repr(lo - 1), "-1", repr(-abs(lo) - 1e300)]
        if hi is not None:
            out += [repr(hi + 1), repr(hi * 10 + 1), "1" + "0" * 40]
        if kind == "integer":
            out += ["1.5", "1e2", "2.0"]
        return out
    if kind == "string" and "maxLength" in schema:
        return ["x" * (schema["maxLength"] + 1), "x" * 20_000]  # 20k: a URL still under the 64 KiB line cap
    if kind == "string" and "enum" in schema:
        return ["", "x" * 20_000, schema["enum"][0].upper() + "\x00"]
    return []


def hostile_json_values(schema: dict[str, Any]) -> list[str]:
    """JSON texts (NaN/Infinity literals included, as many encoders write them) the schema refuses."""
    alts = schema.get("oneOf", [schema])
    kinds: set[str] = set()
    for a in alts:
        kinds.update(a["type"] if isinstance(a.get("type"), list) else [a.get("type")])
    wrong_types = {"null": "null", "boolean": "true", "array": "[]", "object": "{}"}
    out = [text for kind, text in wrong_types.items() if kind not in kinds]
    if "integer" in kinds:
        out += ["1.5", "2.0", "1e2"]
    if kinds & {"number", "integer"}:
        out += ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1" + "0" * 400]
        out += ['"nan"', '"inf"', '"-inf"', '"Infinity"', '"1e999"', '"NaN"']
        num = next(a for a in alts if a.get("type") in ("number", "integer"))
        if "minimum" in num:
            out += [json.dumps(num["minimum"] - 1)]
        if "maximum" in num:
            out += [json.dumps(num["maximum"] + 1)]
    strs = [a for a in alts if a.get("type") == "string"]
    if strs and "number" not in kinds:
        out += ["5", "1.5"]
    for s in strs:
        if "maxLength" in s:
            out.append(json.dumps("9" * (s["maxLength"] + 1)))
        if "pattern" in s or "enum" in s:
            out += [json.dumps("x" * 100_000), json.dumps("\x00"), json.dumps("")]
    if "array" in kinds:
        out += ['["x" , 5]', '"' + "a" * 100_000 + '"']
    if "object" in kinds:
        out.append("5")
        props = alts[0].get("additionalProperties", {})
        out += ['{"a": 5}', '{"a b": "x"}', json.dumps({f"k{i}": "v" for i in range(alts[0].get("maxProperties", 64) + 1)})]
        if "maxLength" in props:
            out.append(json.dumps({"device": "v" * (props["maxLength"] + 1)}))
    return out


def operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            yield method.upper(), path, op


def schema_validator(doc: dict[str, Any], schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({**schema, "components": doc["components"]})


def assert_reads_ok(doc: dict[str, Any], c: httpx.Client) -> None:
    """Every documented GET without path parameters: 200 and a body matching its schema."""
    for method, path, op in operations(doc):
        if method != "GET" or "{" in path:
            continue
        r = c.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
        content = op["responses"]["200"]["content"]
        if "application/json" in content:
            schema_validator(doc, content["application/json"]["schema"]).validate(r.json())


def assert_refused(r: httpx.Response, field: str) -> None:
    assert r.status_code == 400, (r.status_code, r.text[:300])
    body = r.json()
    assert set(body) == {"error", "detail"}, body
    assert field in body["detail"], body
    assert len(r.content) < 2000  # the hostile value is not echoed in full


def test_every_query_parameter_refuses_hostile_values(doc_and_client):
    doc, c = doc_and_client
    tried = 0
    for method, path, op in operations(doc):
        for param in op.get("parameters", []):
            if param["in"] != "query":
                continue
            for value in hostile_query_values(param["schema"]):
                r = c.request(method, path, params={param["name"]: value})
                assert_refused(r, param["name"])
                tried += 1
            assert_reads_ok(doc, c)
    assert tried >= 100  # a guard on the generator: the document has numeric parameters
    assert c.get("/v1/dumps").json() == {"dumps": []}  # no refused POST made a dump


def test_every_request_body_field_refuses_hostile_values(doc_and_client):
    doc, c = doc_and_client
    good = {"name": "rss", "metric": "memprof_process_resident_memory_bytes", "op": ">", "threshold": 1}
    assert c.put("/v1/watchdog/rules", json={"rules": [good]}).status_code == 200
    in_force = c.get("/v1/watchdog/rules").json()
    tried = 0
    for method, path, op in operations(doc):
        if "requestBody" not in op:
            continue
        body_schema = op["requestBody"]["content"]["application/json"]["schema"]
        if "$ref" in body_schema:
            body_schema = doc["components"]["schemas"][body_schema["$ref"].rsplit("/", 1)[1]]
        if "rules" not in body_schema["properties"]:  # a flat object of fields: each one hostile, alone
            for field, schema in body_schema["properties"].items():
                for value in hostile_json_values(schema):
                    assert_refused(c.request(method, path, content=f'{{"{field}": {value}}}'.encode()), field)
                    tried += 1
                assert_reads_ok(doc, c)
            continue
        item_ref = body_schema["properties"]["rules"]["items"]["$ref"]
        rule_schema = doc["components"]["schemas"][item_ref.rsplit("/", 1)[1]]
        for field, schema in rule_schema["properties"].items():
            for value in hostile_json_values(schema):
                base = json.dumps({**good, field: None})
                text = base.replace(f'"{field}": null', f'"{field}": {value}')
                r = c.request(method, path, content=('{"rules": [' + text + "]}").encode())
                assert_refused(r, field)
                assert c.get("/v1/watchdog/rules").json() == in_force, (field, value[:40])
                tried += 1
            assert_reads_ok(doc, c)
        too_many = json.dumps({"rules": [{**good, "name": f"r{i}"} for i in range(body_schema["properties"]["rules"]
                                                                                    ["maxItems"] + 1)]})
        assert_refused(c.request(method, path, content=too_many.encode()), "rules")
    assert tried >= 60
    assert c.get("/v1/watchdog/rules").json() == in_force
    assert c.get("/v1/dumps").json() == {"dumps": []}  # no refused POST made a dump
