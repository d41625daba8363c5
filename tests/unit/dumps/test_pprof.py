"""The pprof builder: its message declaration is the vendored profile.proto's, and a flame's values,
stacks (leaf first), frame lines, labels and times land in the Profile as built."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from memprof_otel.dumps.flame import Flame, MalformedDump, NotAFlame, flame_from_speedscope, flame_from_stored
from memprof_otel.dumps.pprof import MESSAGES, build_pprof, file_descriptor, is_pprof_path, parse_pprof
from memprof_otel.dumps.speedscope import build_speedscope

PROTO = Path(__file__).resolve().parents[3] / "memprof_otel" / "dumps" / "vendor" / "pprof" / "profile.proto"


def proto_messages(text: str) -> dict[str, list[tuple[str, int, str, bool]]]:
    """Messages of a proto3 file without nesting: name -> [(field, number, type, repeated)]."""
    text = re.sub(r"//[^\n]*", "", text)
    out = {}
    for name, body in re.findall(r"message\s+(\w+)\s*\{([^}]*)\}", text):
        out[name] = [(f, int(n), t, bool(rep)) for rep, t, f, n in
                     re.findall(r"(repeated\s+)?(\w+)\s+(\w+)\s*=\s*(\d+)\s*;", body)]
    return out


def test_declaration_is_the_vendored_proto_exactly():
    text = PROTO.read_text(encoding="utf-8")
    assert "package perftools.profiles;" in text and 'syntax = "proto3";' in text
    assert proto_messages(text) == MESSAGES
    assert (PROTO.parent / "LICENSE").read_text(encoding="utf-8").lstrip().startswith("Apache License")
    assert "github.com/google/pprof" in (PROTO.parent / "README.md").read_text(encoding="utf-8")
    fd = file_descriptor()
    assert fd.package == "perftools.profiles" and [m.name for m in fd.message_type] == list(MESSAGES)


def test_profile_holds_the_flame():
    flame = Flame((("inuse_space", "bytes"), ("inuse_objects", "count")),
                  (("app.py:3", "lib.py:10"), ("app.py:3", "app.py:7")), ((100, 2), (50, -1)),
                  frame_lines={"app.py:3": ("app.py", 3), "lib.py:10": ("lib.py", 10), "app.py:7": ("app.py", 7)},
                  labels=(("model", "m"),), time_nanos=123, duration_nanos=456)
    p = parse_pprof(build_pprof(flame))
    s = list(p.string_table)
    assert s[0] == "" and [(s[t.type], s[t.unit]) for t in p.sample_type] == list(flame.sample_types)
    funcs = {f.id: f for f in p.function}
    locs = {loc.id: loc for loc in p.location}

    def frames(sample):  # leaf first in the file: reversed back to root first
        return tuple(s[funcs[locs[i].line[0].function_id].name] for i in reversed(sample.location_id))
    assert [(frames(x), tuple(x.value)) for x in p.sample] == list(zip(flame.stacks, flame.values))
    lib = next(f for f in funcs.values() if s[f.name] == "lib.py:10")
    assert s[lib.filename] == "lib.py" and next(loc for loc in locs.values() if loc.line[0].function_id == lib.id).line[0].line == 10
    assert len(funcs) == 3  # one function per frame name
    assert all([(s[lb.key], s[lb.str]) for lb in x.label] == [("model", "m")] for x in p.sample)
    assert (p.time_nanos, p.duration_nanos, p.period) == (123, 456, 1)
    assert s[p.default_sample_type] == "inuse_space" and "model=m" in [s[c] for c in p.comment]


def test_stored_speedscope_round_trips_to_the_same_flame():
    flame = Flame((("alloc_space", "bytes"), ("alloc_objects", "count")), (("m", "a", "op"), ("m", "op")),
                  ((300, 3), (8, 1)), labels=(("model", "m"), ("device", "cpu")), time_nanos=9, duration_nanos=7)
    doc = build_speedscope("m", flame.weighted(), [], exporter="t")
    doc["memprof_otel"] = {"pprof": flame.side_entry()}
    assert flame_from_speedscope(doc) == flame
    del doc["memprof_otel"]   # a dump stored before the side entry: bytes only
    old = flame_from_speedscope(doc)
    assert old.sample_types == (("space", "bytes"),) and old.values == ((300,), (8,))
    with pytest.raises(ValueError):
        flame_from_speedscope({"type": "oom", "layer": "x"})


def _doc(samples, weights, frames=({"name": "a"}, {"name": "b"})):
    return {"shared": {"frames": list(frames)},
            "profiles": [{"type": "sampled", "unit": "bytes", "samples": samples, "weights": weights}]}


@pytest.mark.parametrize("doc", [
    _doc([[0, -1]], [1]), _doc([[2]], [1]), _doc([[0]], [-1]), _doc([[0]], [1 << 63]), _doc([[0]], [True]),
    _doc([[0.0]], [1]), _doc([0], [1]), _doc([[0]], [1, 2]), _doc([[0]], [1], frames=({"name": 5},)),
    _doc([[0]], [1], frames=("a",)), {"profiles": [{"type": "sampled", "samples": [], "weights": []}]},
    {**_doc([[0]], [1]), "memprof_otel": {"pprof": {"sample_types": [["s", "b"], ["c", "n"]], "more_values": [7]}}},
    {**_doc([[0]], [1]), "memprof_otel": {"pprof": {"sample_types": [["s", "b"], ["c", "n"]], "more_values": [[-1]]}}},
    {**_doc([[0]], [1]), "memprof_otel": {"pprof": {"sample_types": [], "more_values": [[]]}}},
], ids=lambda d: json.dumps(d)[-60:])
def test_a_malformed_stored_document_is_refused_by_name(doc):
    with pytest.raises(MalformedDump):
        flame_from_stored(json.dumps(doc).encode())


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000, b"\xff", b"{", b""])
def test_stored_bytes_that_are_not_json_are_malformed(body):
    with pytest.raises(MalformedDump):
        flame_from_stored(body)


def test_other_dumps_are_not_flames_and_good_ones_convert():
    with pytest.raises(NotAFlame):
        flame_from_stored(b'{"type": "oom", "layer": "x"}')
    flame = flame_from_stored(json.dumps(_doc([[0, 1], [1]], [5, 0])).encode())
    assert flame.stacks == (("a", "b"), ("b",)) and flame.values == ((5,), (0,))


def test_pprof_paths():
    assert is_pprof_path("a.pb.gz") and is_pprof_path("x/b.PPROF")
    assert not is_pprof_path("a.json") and not is_pprof_path("a.gz")
