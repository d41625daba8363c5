"""The baseline file: a round trip keeps every field, the text is stable, and bad documents are
typed errors naming the field."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from memprof_otel.baselines import (SCHEMA, SCHEMA_VERSION, Baseline, BaselineError, LayerBaseline, from_dict, load,
                                    loads, save)
from memprof_otel.errors import ConfigError


def sample() -> Baseline:
    return Baseline(model="net", fingerprint="sha256:0123456789abcdef",
                    layers=(LayerBaseline("", "Net()", 4096, 128, 1, 5, 4),
                            LayerBaseline("fc", "Linear(weight=float32[8,8])", 256, 128, 1, 1, 0)),
                    inputs={"arg0": "float32[4,8]"}, environment={"device": "cpu", "torch": "2.13.0", "attention": None})


def test_round_trip_keeps_every_field_and_writes_the_same_bytes(tmp_path: Path) -> None:
    b = sample()
    path = tmp_path / "sub" / "net.json"
    save(b, path)  # the folder is made
    assert load(path) == b
    assert path.read_text() == b.dumps()
    save(load(path), path)
    assert path.read_text() == b.dumps()  # saving what was read changes nothing
    doc = json.loads(path.read_text())
    assert doc["schema"] == SCHEMA and doc["schema_version"] == SCHEMA_VERSION
    assert doc["model"] == {"name": "net", "fingerprint": "sha256:0123456789abcdef", "layers": 2}
    assert "time" not in path.read_text() and "created" not in path.read_text()  # no timestamp: no noise


@pytest.mark.parametrize("mutate,where", [
    (lambda d: d.update(schema="something-else"), "not a memprof-otel baseline"),
    (lambda d: d.update(schema_version=SCHEMA_VERSION + 1), "newer than this memprof-otel reads"),
    (lambda d: d.update(schema_version="1"), "baseline.schema_version: expected int"),
    (lambda d: d.pop("layers"), "missing 'layers'"),
    (lambda d: d["layers"][1].update(peak_increase_bytes=-5), "baseline.layers[1].peak_increase_bytes: must be >= 0"),
    (lambda d: d["layers"][0].update(calls=True), "baseline.layers[0].calls: expected int"),
    (lambda d: d["layers"].append(dict(d["layers"][1])), "layer 'fc' appears twice"),
    (lambda d: d["environment"].update(torch=2), "baseline.environment.torch: expected a string or null"),
    (lambda d: d["model"].pop("fingerprint"), "baseline.model: missing 'fingerprint'"),
])
def test_a_bad_document_is_a_config_error_naming_the_field(mutate, where) -> None:
    doc = sample().to_dict()
    mutate(doc)
    with pytest.raises(BaselineError, match=where.replace("[", r"\[").replace("]", r"\]")) as e:
        from_dict(doc)
    assert isinstance(e.value, ConfigError)  # the CLI's exit 2


def test_not_json_is_a_baseline_error() -> None:
    with pytest.raises(BaselineError, match="not JSON"):
        loads("{nope", "old.json")


def test_retained_may_be_negative() -> None:
    # a layer that frees more than it allocates (an in-place op on a tensor it was handed) retains < 0
    doc = sample().to_dict()
    doc["layers"][1]["retained_bytes"] = -256
    assert from_dict(doc).layer("fc").retained_bytes == -256
