import hashlib

import jsonschema

from memprof_otel.dumps.speedscope import balanced_calls, build_speedscope
from tests.schemas import SPEEDSCOPE_SCHEMA, speedscope_schema, validate_speedscope


def test_vendored_schema_is_the_published_one():
    # the file named in tests/vendor/speedscope/README.md, unmodified, and a valid draft-07 schema
    digest = hashlib.sha256(SPEEDSCOPE_SCHEMA.read_bytes()).hexdigest()
    assert digest in (SPEEDSCOPE_SCHEMA.parent / "README.md").read_text(encoding="utf-8")
    assert (SPEEDSCOPE_SCHEMA.parent / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    jsonschema.Draft7Validator.check_schema(speedscope_schema())
    assert speedscope_schema()["$ref"] == "#/definitions/FileFormat.File"


def test_build_merges_stacks_and_validates():
    doc = build_speedscope("m", [(("m", "a", "aten::mm"), 100), (("m", "a", "aten::mm"), 50),
                                 (("m", "aten::add"), 8), (("m", "x"), 0)],
                           [("O", "m", 1.0), ("O", "a", 1.001), ("C", "a", 1.002), ("C", "m", 1.003)],
                           exporter="test")
    validate_speedscope(doc)
    sampled, evented = doc["profiles"]
    assert sampled["weights"] == [150, 8] and sampled["endValue"] == 158
    names = [f["name"] for f in doc["shared"]["frames"]]
    assert [names[i] for i in sampled["samples"][0]] == ["m", "a", "aten::mm"]
    assert [round(e["at"], 6) for e in evented["events"]] == [0.0, 1.0, 2.0, 3.0]


def test_balanced_calls_closes_open_frames_and_drops_strays():
    calls = [("O", "r", 0.0), ("O", "a", 1.0), ("C", "zzz", 1.5), ("O", "b", 2.0), ("C", "a", 3.0)]
    assert balanced_calls(calls) == [("O", "r", 0.0), ("O", "a", 1.0), ("O", "b", 2.0), ("C", "b", 3.0),
                                     ("C", "a", 3.0), ("C", "r", 3.0)]
