"""Per-shape baselines: a forward's figures per layer, a shape's median and spread, the file's
version 2 read back, and the diff comparing like with like (the same shape only, beyond the noise
of its repeat forwards, unknown below 3 forwards a side). References: the figures the test gives."""
from __future__ import annotations

from collections import namedtuple

import pytest

from memprof_otel.baselines import Thresholds, diff, from_shapes, loads, parse_fail_above
from memprof_otel.baselines.render import text
from memprof_otel.baselines.shapes import MIN_FORWARDS, ShapeAccumulator, forward_layers

Call = namedtuple("Call", "path peak_increase retained allocations frees")
SIGS = {"": "Net()", "fc": "Linear(w=[4,4])"}


def fw(root: int, fc: int) -> dict:
    return forward_layers([Call("fc", fc, fc, 1, 0), Call("", root, root, 1, 0)])


def baseline(per_shape: dict[tuple[int, int], list[tuple[int, int]]]):
    acc = ShapeAccumulator()
    for (b, s), forwards in per_shape.items():
        for root, fc in forwards:
            acc.add({"batch": b, "seq_len": s}, fw(root, fc))
    return from_shapes("m", acc.shapes(), SIGS)


def test_a_forwards_figures_are_the_largest_call_and_the_counts_summed():
    got = forward_layers([Call("a", 10, 4, 2, 1), Call("a", 30, 2, 1, 1), Call("b", 5, 5, 1, 0)])
    assert got["a"] == {"peak_increase_bytes": 30, "retained_bytes": 4, "calls": 2, "allocations": 3,
                        "deallocations": 2}
    assert got["b"]["calls"] == 1


def test_a_shape_keeps_its_median_and_spread_and_the_file_reads_back():
    b = baseline({(2, 8): [(100, 50), (104, 50), (102, 50)], (4, 8): [(200, 100)] * 3})
    by = {s.key: s for s in b.shapes}
    assert by["batch=2,seq_len=8"].median[""]["peak_increase_bytes"] == 102
    assert by["batch=2,seq_len=8"].spread[""]["peak_increase_bytes"] == 4
    assert by["batch=4,seq_len=8"].spread["fc"]["peak_increase_bytes"] == 0
    assert b.layer("").peak_increase_bytes == 200 and b.forwards == 6  # the largest median over shapes
    again = loads(b.dumps())
    assert again == b and again.dumps() == b.dumps()  # byte-identical when written again


def test_a_version_1_file_still_reads():
    v1 = baseline({(2, 8): [(100, 50)] * 3}).to_dict()
    v1.pop("shapes")
    v1["schema_version"] = 1
    import json
    assert loads(json.dumps(v1)).shapes == ()


def test_within_the_noise_nothing_changed_and_beyond_it_the_threshold_applies_to_the_excess():
    old = baseline({(2, 8): [(100, 50), (110, 50), (105, 50)]})            # spread 10
    within = baseline({(2, 8): [(108, 50), (112, 50), (115, 50)]})         # median 112: +7, within 10
    assert diff(old, within, Thresholds(fail_above=0.02)).changes == ()
    beyond = baseline({(2, 8): [(120, 50), (120, 50), (120, 50)]})         # +15: 5 beyond the noise of 10
    d = diff(old, beyond, Thresholds(fail_above=0.02))
    assert {(c.layer, c.figure) for c in d.changes} == {("", "peak_increase_bytes"), ("", "retained_bytes")}
    c = next(c for c in d.changes if c.figure == "peak_increase_bytes")
    assert (c.layer, c.shape, c.noise, c.delta) == ("", "batch=2,seq_len=8", 10, 15) and c.exceeds
    assert not diff(old, beyond, Thresholds(fail_above=0.06)).failures    # 5 beyond is under 6 % of 105


def test_shapes_only_one_side_measured_are_listed_never_judged_and_too_few_forwards_are_unknown():
    old = baseline({(2, 8): [(100, 50)] * 3, (4, 8): [(200, 100)] * 3, (8, 8): [(400, 200)] * 5})
    new = baseline({(2, 8): [(100, 50)] * 3, (16, 8): [(9000, 9000)] * 3, (8, 8): [(900, 900)] * (MIN_FORWARDS - 1)})
    d = diff(old, new, Thresholds(fail_above=0.0))
    assert d.per_shape and d.shapes_compared == ("batch=2,seq_len=8",)
    assert d.shapes_only_old == ("batch=4,seq_len=8",) and d.shapes_only_new == ("batch=16,seq_len=8",)
    assert d.shapes_too_few == (("batch=8,seq_len=8", 5, MIN_FORWARDS - 1),)
    assert not d.failures and not d.changes
    t = text(d)
    assert "only in the old baseline, not judged: batch=4,seq_len=8" in t
    assert "unknown, too few forwards" in t and "batch=8,seq_len=8" in t


@pytest.mark.parametrize("value,expected", [("2%", 0.02), ("0.5 %", 0.005), ("0%", 0.0)])
def test_fail_above_is_a_percentage_with_its_sign(value, expected):
    assert parse_fail_above(value) == pytest.approx(expected)


@pytest.mark.parametrize("value", [0.02, "0.02", 2, "two%", "-1%", None, "nan%"])
def test_a_bare_number_or_a_bad_percentage_is_refused_saying_how_to_write_it(value):
    with pytest.raises(ValueError, match="percentage"):
        parse_fail_above(value)


def test_a_diff_that_could_compare_no_shape_fails_a_gate_and_unread_shapes_are_never_judged():
    # GIVEN forwards whose shape was not read (the memory model off): all under one unknown shape,
    # the spread over different inputs, which would hide any growth
    acc_old, acc_new = ShapeAccumulator(), ShapeAccumulator()
    for root in (100, 900, 500):
        acc_old.add(None, fw(root, 50))
        acc_new.add(None, fw(root * 2, 50))
    old, new = from_shapes("m", acc_old.shapes(), SIGS), from_shapes("m", acc_new.shapes(), SIGS)
    d = diff(old, new, Thresholds(fail_above=0.02))
    # THEN nothing is judged, and a gate with a threshold fails, saying why
    assert d.judged_nothing and d.failed and not d.failures and d.unread_forwards == (3, 3)
    assert text(d).startswith("memprof-otel diff: FAIL: nothing compared")
    assert "shape not read, not judged: 3 and 3 forwards" in text(d)
    # AND without a threshold it is reported, not failed
    assert not diff(old, new).failed


def test_a_file_with_a_shape_twice_or_a_negative_spread_is_refused():
    import json
    from memprof_otel.baselines import BaselineError
    doc = baseline({(2, 8): [(100, 50)] * 3}).to_dict()
    twice = dict(doc, shapes=doc["shapes"] * 2)
    with pytest.raises(BaselineError, match="appears twice"):
        loads(json.dumps(twice))
    doc["shapes"][0]["layers"][""]["spread"]["peak_increase_bytes"] = -1
    with pytest.raises(BaselineError, match=">= 0"):
        loads(json.dumps(doc))
